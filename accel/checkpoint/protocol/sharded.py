"""Models and optimizers of a run whose state lives in DTensors (FSDP): who writes what.

Every rank takes part in every call here (torch's state-dict getters and DCP are collectives).
With ``model_io.sharded_state`` (FSDP's SHARDED_STATE_DICT) each rank writes its own shards of
every model and optimizer through DCP into ``sharded/model_<i>/`` and ``sharded/optimizer_<i>/``
of the temporary checkpoint directory, and rank 0 writes each optimizer's hyper-parameters as
``optimizer_<i>.json``. Otherwise (FULL_STATE_DICT) the state is gathered one tensor at a time
and rank 0 writes ``model_<i>.safetensors`` and ``optimizer_<i>`` whole, as for other runs,
with the optimizer state keyed by parameter FQN (``meta["optimizer_layout"] == "fqn"``).

Loading follows what the checkpoint holds, whatever this run's state dict type: DCP shards are
resharded to this run's world size by DCP; whole files are loaded by ``model_io`` (each rank
keeps its shards). A run without DTensors (one process, DDP) can load sharded state too: DCP
reads it without a process group.

:mod:`accel.checkpoint.sharded.states` (torch's DCP and FSDP state-dict APIs) is imported by the
functions that need it, so that importing the protocol (``from accel import Accelerator``) does
not import FSDP.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from ..._base import tree as _tree
from ..sharded.layout import ShardedFiles, has_shards, model_prefix
from ..storage import Manifest
from .snapshot import FileQueue, ModelStateIO, RunSnapshot

__all__ = ["FQN_LAYOUT", "distributed_state", "holds_shards", "load_model", "load_optimizer",
           "model_prefix", "queue_distributed", "sharded_headers", "state_module"]

#: ``meta["optimizer_layout"]`` of a checkpoint whose optimizer state is keyed by FQN.
FQN_LAYOUT = "fqn"


def distributed_state(io: ModelStateIO) -> bool:
    """Whether the run's state lives in DTensors (every rank must read and write it)."""
    return bool(getattr(io, "distributed_state", False))


def _sharded(io: ModelStateIO) -> bool:
    return bool(getattr(io, "sharded_state", False))


def state_module(io: ModelStateIO, model: nn.Module) -> nn.Module:
    """The module to hand to torch's state-dict APIs (the strategy unwraps; else ``model``)."""
    unwrap = getattr(io, "state_module", None)
    return unwrap(model) if callable(unwrap) else model


def _on_cpu(state: Any) -> Any:
    return _tree.apply(lambda t: t.detach().cpu(), data=state)


def queue_distributed(writer: FileQueue, *, snap: RunSnapshot, rank: int,
                      to_host: Callable[[Any], Any] | None = None) -> ShardedFiles:
    """Every rank: write (DCP) or queue (rank 0) the models and optimizers; returns the DCP
    files this rank wrote. Save hooks get the models and, as under Accelerate's FSDP, the full
    state dicts only with FULL_STATE_DICT (``[]`` when sharded: there is nothing to pop).
    ``to_host`` turns a state into what the writer gets (default: its tensors on the CPU; a
    non-blocking save passes a copy)."""
    from ..sharded import states

    io, tmp = snap.model_io, writer.tmpdir
    to_host = to_host or _on_cpu
    models = list(snap.models)
    modules = [state_module(io, m) for m in models]
    files = ShardedFiles()
    if _sharded(io):
        for hook in snap.save_hooks:
            hook(models, [], str(tmp))
        for i, module in enumerate(modules):
            states.save_model_shards(tmp, index=i, module=module, out=files)
    else:
        weights = [io.model_state_dict(m) for m in models]  # gathered; rank 0's are full
        for hook in snap.save_hooks:
            hook(models, weights, str(tmp))
        if rank == 0:
            for i, state in enumerate(weights):
                writer.write_tensors(f"model_{i}.safetensors", to_host(dict(state)))
    for i, opt in enumerate(snap.optimizers):
        optim = states.torch_optimizer(opt)
        owner = states.owner_module(modules, optim)
        if _sharded(io):
            doc = states.save_optimizer_shards(tmp, index=i, module=owner, optimizer=optim,
                                               out=files)
        else:
            doc = states.full_optimizer_state(owner, optim)
        if rank == 0:
            writer.write_state(f"optimizer_{i}", to_host(doc))
    return files


def sharded_headers(manifest: Manifest) -> Mapping[str, str]:
    """The header hashes of the checkpoint's DCP files (``{}`` when it has none)."""
    sharded = manifest.meta.get("sharded")
    headers = sharded.get("headers") if isinstance(sharded, dict) else None
    return headers if isinstance(headers, dict) else {}


def holds_shards(manifest: Manifest, index: int) -> bool:
    """Whether model ``index`` is stored as DCP shards (else ``model_<index>.safetensors``)."""
    return has_shards(manifest, model_prefix(index))


def load_model(manifest: Manifest, *, index: int, model: nn.Module, io: ModelStateIO,
               strict: bool) -> tuple[list[str], list[str]] | None:
    """Load ``sharded/model_<index>`` when the checkpoint has it (returns missing and
    unexpected keys); None: it holds ``model_<index>.safetensors`` instead."""
    if not holds_shards(manifest, index):
        return None
    from ..sharded.states import load_model_shards

    return load_model_shards(manifest.path, manifest=manifest, headers=sharded_headers(manifest),
                             index=index,
                             module=state_module(io, model), strict=strict,
                             distributed=distributed_state(io))


def load_optimizer(manifest: Manifest, *, index: int, optimizer: Any, state: Any,
                   snap: RunSnapshot) -> bool:
    """Load ``optimizer_<index>`` (its decoded JSON/codec ``state``) when it needs torch's
    FQN-keyed state-dict APIs: it was saved by an FSDP run, or this run is one. False: an
    unsharded state for an unsharded run, for the optimizer's own ``load_state_dict``."""
    fqn_layout = manifest.meta.get("optimizer_layout") == FQN_LAYOUT
    io = snap.model_io
    distributed = distributed_state(io)
    if not (fqn_layout or distributed):
        return False
    from ..sharded import states

    optim = states.torch_optimizer(optimizer)
    owner = states.owner_module([state_module(io, m) for m in snap.models], optim)
    if isinstance(state, dict) and "tensors" in state:  # sharded: tensors in DCP files
        states.load_optimizer_shards(manifest.path, manifest=manifest,
                                     headers=sharded_headers(manifest), index=index,
                                     module=owner, optimizer=optim, doc=state,
                                     distributed=distributed)
        return True
    if not fqn_layout:
        state = states.fqn_keyed(owner, optim, state)
    states.load_full_optimizer(owner, optimizer=optim, state=state, distributed=distributed)
    return True
