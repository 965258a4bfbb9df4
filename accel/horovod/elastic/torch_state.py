"""``hvd.elastic.TorchState``: a model, an optimizer, samplers and plain values, committed together.

Each keyword argument whose type has a handler (``nn.Module``, ``torch.optim.Optimizer``,
:class:`~accel.horovod.elastic.ElasticSampler`) is committed, restored and synchronised through
its ``state_dict``; the others are plain values (:class:`~accel.horovod.elastic.ObjectState`).
A commit writes them all into one atomic checkpoint directory (model and optimizer tensors to
safetensors, the rest to JSON).

Example:
    >>> import torch, accel.horovod as hvd
    >>> hvd.init()
    >>> model = torch.nn.Linear(2, 1)
    >>> state = hvd.elastic.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), epoch=0)
    >>> state.commit(); committed = model.weight.clone()
    >>> with torch.no_grad():
    ...     _ = model.weight.add_(1.0)
    >>> state.epoch = 3
    >>> state.restore()
    >>> torch.equal(model.weight, committed), state.epoch
    (True, 0)
    >>> state.clear_commits(); hvd.shutdown()
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from .._session import current
from .sampler import ElasticSampler
from .state import ObjectState

__all__ = ["StateHandler", "TorchState"]


class StateHandler:
    """How one kind of object is committed, restored and synchronised (through a state dict).

    ``saved`` is an in-memory copy kept until the first commit (and after ``set_value``), so
    that ``restore()`` before a commit returns to it; after a commit, ``restore()`` reads the
    commit back from disk and the copy is dropped.
    """

    def __init__(self, value: Any) -> None:
        self.value = value
        self.saved: Any = copy.deepcopy(self.state_dict())

    def set_value(self, value: Any) -> None:
        self.value = value
        self.saved = copy.deepcopy(self.state_dict())

    def state_dict(self) -> Any:
        return self.value.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.value.load_state_dict(state)

    def sync(self, root_rank: int) -> None:
        state = self.state_dict() if current().context.rank == root_rank else None
        self.load_state_dict(current().comm.broadcast_object_list([state], root_rank)[0])


class ModelStateHandler(StateHandler):
    def sync(self, root_rank: int) -> None:
        # in place, one packed broadcast of every parameter and buffer (no pickling)
        current().comm.broadcast(list(self.value.state_dict().values()), from_process=root_rank)


class OptimizerStateHandler(StateHandler):
    pass


class SamplerStateHandler(StateHandler):
    def sync(self, root_rank: int) -> None:
        # the epoch and global position are root's; indices given to record_indices are
        # each rank's own, so the processed set is their union
        session = current()
        mine = set(self.value.processed_indices)
        state = session.comm.broadcast_object_list([self.state_dict()], root_rank)[0]
        union: set[int] = set().union(*session.comm.gather_object(mine))
        self.load_state_dict({**state, "processed_indices": sorted(union)})

    def load_local(self, state: Any) -> None:
        """Before a sync: this rank's own recorded indices, from its own commit."""
        self.value.processed_indices = set(state.get("processed_indices", ()))


_HANDLERS: tuple[tuple[type, type[StateHandler]], ...] = (
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
)


def _handler(value: Any) -> StateHandler | None:
    return next((handler(value) for kind, handler in _HANDLERS if isinstance(value, kind)), None)


def _stem(name: str) -> str:
    return f"handler.{name}"


class TorchState(ObjectState):
    """State of a PyTorch training process (Horovod's ``hvd.elastic.TorchState``).

    Args:
        model: a model (optional).
        optimizer: an optimizer (optional).
        **kwargs: more models, optimizers, :class:`ElasticSampler` objects, and plain values
            (epoch, batch, ...), exposed as attributes.
    """

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers: dict[str, StateHandler] = {}
        plain: dict[str, Any] = {}
        for name, value in kwargs.items():
            handler = _handler(value)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        self._handlers = handlers
        for name, handler in handlers.items():
            setattr(self, name, handler.value)
        super().__init__(**plain)

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers and handlers[name].value is not value:
            handlers[name].set_value(value)
        super().__setattr__(name, value)

    def restore(self) -> None:
        stored: dict[str, Any] = {}
        if self._commit_path is not None and any(h.saved is None for h in self._handlers.values()):
            stored = self.commit_store().read(self._commit_path, self.commit_stems())
        for name, handler in self._handlers.items():
            if handler.saved is not None:
                handler.load_state_dict(copy.deepcopy(handler.saved))
            elif _stem(name) in stored:
                handler.load_state_dict(stored[_stem(name)])
        super().restore()

    def sync(self, root_rank: int = 0) -> None:
        for handler in self._handlers.values():
            handler.sync(root_rank)
        super().sync(root_rank)

    def commit_components(self) -> dict[str, Any]:
        out = {_stem(name): handler.state_dict() for name, handler in self._handlers.items()}
        return {**out, **super().commit_components()}

    def _write_commit(self) -> None:
        super()._write_commit()
        for handler in self._handlers.values():
            handler.saved = None  # restore() reads the commit from now on

    def load_commit(self, components: dict[str, Any]) -> None:
        for name, handler in self._handlers.items():
            handler.load_state_dict(components[_stem(name)])
            handler.saved = None
        super().load_commit(components)

    def load_local(self, components: dict[str, Any]) -> None:
        """This rank's own part of a commit (indices its samplers recorded), before a sync."""
        for name, handler in self._handlers.items():
            if isinstance(handler, SamplerStateHandler):
                handler.load_local(components[_stem(name)])

    def local_stems(self) -> list[str]:
        return [_stem(name) for name, handler in self._handlers.items()
                if isinstance(handler, SamplerStateHandler)]
