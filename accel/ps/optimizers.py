"""Sparse optimizers that parameter servers apply to the rows a gradient touches.

Each rule keeps per-row state (Adagrad's accumulator, Adam's moments and step count), so a row
that no batch touched is left exactly as it was, and a re-partitioned table carries its state
with its rows. The rules are plain dataclasses (sent to the servers as JSON-able fields).

Example:
    >>> import torch
    >>> weight = torch.ones(4, 2)
    >>> opt = SGD(lr=0.5)
    >>> state = opt.init_state(4, 2)
    >>> opt.apply(weight, state, torch.tensor([1, 3]), torch.ones(2, 2))
    >>> weight[:, 0].tolist()
    [1.0, 0.5, 1.0, 0.5]
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = ["SGD", "Adagrad", "Adam", "SparseOptimizer", "optimizer_from_config"]


@dataclass(frozen=True)
class SparseOptimizer:
    """The interface: per-row state and an in-place update of the given rows."""

    lr: float = 0.01

    @property
    def kind(self) -> str:
        return type(self).__name__

    def config(self) -> dict[str, Any]:
        """``{"kind": ..., fields...}``: what a server needs to rebuild the rule."""
        return {"kind": self.kind, **asdict(self)}

    def init_state(self, rows: int, dim: int) -> dict[str, torch.Tensor]:
        """Per-row state of ``rows`` rows (empty for SGD)."""
        return {}

    def apply(self, weight: torch.Tensor, state: dict[str, torch.Tensor], rows: torch.Tensor,
              grad: torch.Tensor) -> None:
        """Update ``weight[rows]`` (``rows`` distinct) with ``grad`` (one row each), in place."""
        raise NotImplementedError


@dataclass(frozen=True)
class SGD(SparseOptimizer):
    """``w -= lr * g`` on the touched rows."""

    def apply(self, weight: torch.Tensor, state: dict[str, torch.Tensor], rows: torch.Tensor,
              grad: torch.Tensor) -> None:
        weight.index_add_(0, rows, grad, alpha=-self.lr)


@dataclass(frozen=True)
class Adagrad(SparseOptimizer):
    """``acc += g**2; w -= lr * g / (sqrt(acc) + eps)`` per row (as ``torch.optim.Adagrad``
    with sparse gradients and no learning-rate decay)."""

    initial_accumulator_value: float = 0.0
    eps: float = 1e-10

    def init_state(self, rows: int, dim: int) -> dict[str, torch.Tensor]:
        return {"sum": torch.full((rows, dim), self.initial_accumulator_value)}

    def apply(self, weight: torch.Tensor, state: dict[str, torch.Tensor], rows: torch.Tensor,
              grad: torch.Tensor) -> None:
        acc = state["sum"][rows] + grad * grad
        state["sum"][rows] = acc
        weight[rows] = weight[rows] - self.lr * grad / (acc.sqrt() + self.eps)


@dataclass(frozen=True)
class Adam(SparseOptimizer):
    """Adam with per-row moments and a per-row step count (a row's bias correction counts the
    steps that touched it: "lazy" Adam, as sparse embedding tables are usually trained)."""

    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def init_state(self, rows: int, dim: int) -> dict[str, torch.Tensor]:
        return {"exp_avg": torch.zeros(rows, dim), "exp_avg_sq": torch.zeros(rows, dim),
                "step": torch.zeros(rows, 1)}

    def apply(self, weight: torch.Tensor, state: dict[str, torch.Tensor], rows: torch.Tensor,
              grad: torch.Tensor) -> None:
        step = state["step"][rows] + 1
        m = state["exp_avg"][rows] * self.beta1 + grad * (1 - self.beta1)
        v = state["exp_avg_sq"][rows] * self.beta2 + grad * grad * (1 - self.beta2)
        state["step"][rows], state["exp_avg"][rows], state["exp_avg_sq"][rows] = step, m, v
        m_hat = m / (1 - torch.pow(self.beta1, step))
        v_hat = v / (1 - torch.pow(self.beta2, step))
        weight[rows] = weight[rows] - self.lr * m_hat / (v_hat.sqrt() + self.eps)


_KINDS: dict[str, type[SparseOptimizer]] = {"SGD": SGD, "Adagrad": Adagrad, "Adam": Adam}


def optimizer_from_config(config: dict[str, Any]) -> SparseOptimizer:
    """The rule :meth:`SparseOptimizer.config` describes.

    Example:
        >>> optimizer_from_config(Adagrad(lr=0.1).config())
        Adagrad(lr=0.1, initial_accumulator_value=0.0, eps=1e-10)
    """
    fields = dict(config)
    kind = fields.pop("kind", None)
    if kind not in _KINDS:
        raise ValueError(f"unknown sparse optimizer {kind!r}; use accel.ps.SGD, Adagrad or Adam")
    lr = fields.get("lr")
    if not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"sparse optimizer lr must be a positive number, got {lr!r}")
    return _KINDS[kind](**fields)
