"""The checkpoint piece thread pool in a forked child: a child that inherits the parent's pool
(whose threads did not survive the fork) still saves and loads (moved out of
tests/unit/checkpoint/test_checkpoint_pieces.py, which starts no processes)."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest
import torch

from accel.checkpoint import CheckpointWriter, load_tensors, verify
from accel.checkpoint.storage import _io


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> int:
    """Pieces of 1000 bytes: small files span many pieces, and pieces span tensors."""
    monkeypatch.setattr(_io, "PIECE", 1000)
    return 1000


def _tensors() -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    weight = torch.randn(37, 29)
    return {"weight": weight, "tied": weight, "bias": torch.randn(29).double(),
            "half": torch.randn(301).half(), "flags": torch.rand(17) > 0.5,
            "empty": torch.zeros(0, 3), "step": torch.tensor(7)}


def _save(target: Path) -> Path:
    writer = CheckpointWriter(target)
    writer.write_tensors("model.safetensors", _tensors())
    writer.write_state("optimizer", {"state": {0: {"exp_avg": torch.ones(600)}},
                                     "param_groups": [{"lr": 0.1, "params": [0]}]})
    return writer.finalize(step=1, world_size=1)


def _child_saves_and_loads(root: str) -> None:
    _io.PIECE = 1000  # several pieces: the pool is used in the child
    ckpt = _save(Path(root) / "child")
    assert torch.equal(load_tensors(ckpt, "model.safetensors")["weight"], _tensors()["weight"])


def test_the_thread_pool_works_in_a_forked_child(tmp_path: Path, small_pieces: int) -> None:
    _save(tmp_path / "parent")  # the parent read and hashed pieces on threads
    proc = mp.get_context("fork").Process(target=_child_saves_and_loads, args=(str(tmp_path),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0  # a child that inherited a pool without threads would hang
    verify(tmp_path / "child")
