"""Model and optimizer state of a run whose state lives in DTensors (FSDP), through torch.

Reading and writing goes through ``torch.distributed.checkpoint.state_dict``
(``get_model_state_dict``, ``get_optimizer_state_dict``, ``set_*``) and DCP (``save``/``load``
with :class:`.dcp_io.ShardWriter`/:class:`.dcp_io.ShardReader`): torch shards, plans and
reshards; this module only decides what goes where. Optimizer state is keyed by parameter FQN
(``{"state": {fqn: {...}}, "param_groups": [{"params": [fqn, ...], "lr": ...}]}``): its tensors
go to DCP (sharded) or to the codec (full); everything else (hyper-parameters, non-tensor
state) is JSON, written by rank 0 with accel's codec.

Every function here that touches DTensors is a collective: call it on every rank, in the same
order. A module with plain tensors (a run without FSDP) works too (``distributed=False``: no
collective, each process reads what it needs).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as _dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ..storage import Manifest
from .dcp_io import ShardReader, ShardWriter, dcp_errors
from .layout import ShardedFiles, model_prefix, optimizer_prefix

__all__ = ["dcp_load", "fqn_keyed", "full_optimizer_state", "load_full_optimizer",
           "load_model_shards", "load_optimizer_shards", "owner_module", "save_model_shards",
           "save_optimizer_shards", "torch_optimizer"]


def torch_optimizer(optimizer: object) -> torch.optim.Optimizer:
    """The torch optimizer of a prepared one (``AcceleratedOptimizer.optimizer``) or itself."""
    inner = getattr(optimizer, "optimizer", optimizer)
    if not isinstance(inner, torch.optim.Optimizer):
        raise TypeError(f"{type(optimizer).__name__} is not a torch optimizer (nor wraps one); "
                        "the sharded state of an FSDP run saves torch.optim optimizers")
    return inner


def owner_module(modules: Sequence[nn.Module], optimizer: torch.optim.Optimizer) -> nn.Module:
    """The module whose parameters ``optimizer`` holds (FQNs are relative to it): the one
    model holding them all, else a ``ModuleList`` of the models involved (FQNs ``0.…``)."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    involved = [m for m in modules if held & {id(p) for p in m.parameters()}]
    covered = {id(p) for m in involved for p in m.parameters()}
    if not involved or held - covered:
        raise ValueError("an optimizer holds parameters of no prepared model; prepare() the "
                         "model(s) whose parameters it optimizes together with it")
    return involved[0] if len(involved) == 1 else nn.ModuleList(involved)


def save_model_shards(root: Path, *, index: int, module: nn.Module, out: ShardedFiles) -> None:
    """DCP-save ``module``'s sharded state into ``root/sharded/model_<index>`` (collective)."""
    writer = ShardWriter(root, model_prefix(index))
    with dcp_errors(f"saving {model_prefix(index)}"):
        dcp_save(get_model_state_dict(module), storage_writer=writer)
    out.take(writer)


def _optimizer_state(module: nn.Module, *, optimizer: torch.optim.Optimizer, full: bool
                     ) -> dict[str, Any]:
    """FQN-keyed optimizer state (collective). An optimizer that has not stepped yet stays
    so (torch's getter initialises it with a zero-lr step; that state is dropped again)."""
    fresh = not optimizer.state
    state = get_optimizer_state_dict(module, optimizer,
                                     options=StateDictOptions(full_state_dict=full,
                                                              cpu_offload=full))
    if fresh:
        optimizer.state.clear()
        if state:
            state = {**state, "state": {}}
    return state


def full_optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The whole FQN-keyed optimizer state on CPU, on rank 0 (``{}`` elsewhere; collective)."""
    return _optimizer_state(module, optimizer=optimizer, full=True)


def save_optimizer_shards(root: Path, *, index: int, module: nn.Module,
                          optimizer: torch.optim.Optimizer, out: ShardedFiles
                          ) -> dict[str, Any]:
    """DCP-save the optimizer's tensors into ``root/sharded/optimizer_<index>`` (collective);
    returns the JSON part (hyper-parameters, non-tensor state, where each tensor went)."""
    state = _optimizer_state(module, optimizer=optimizer, full=False)
    tensors: dict[str, torch.Tensor] = {}
    plain: dict[str, dict[str, Any]] = {}
    keys: dict[str, dict[str, str]] = {}
    for fqn, entry in state.get("state", {}).items():
        for name, value in entry.items():
            if isinstance(value, torch.Tensor):
                key = f"state.{fqn}.{name}"
                tensors[key] = value
                keys.setdefault(fqn, {})[name] = key
            else:
                plain.setdefault(fqn, {})[name] = value
    if tensors:
        writer = ShardWriter(root, optimizer_prefix(index))
        with dcp_errors(f"saving {optimizer_prefix(index)}"):
            dcp_save(tensors, storage_writer=writer)
        out.take(writer)
    return {"param_groups": state.get("param_groups", []), "state": plain, "tensors": keys}


def dcp_load(state: dict[str, Any], *, reader: ShardReader, distributed: bool) -> None:
    """DCP load; without ``distributed`` no process group is used (torch warns that it
    assumes a single process: that is the intent here, so the warning is not shown)."""
    reader.ranks = ((torch.distributed.get_rank(), torch.distributed.get_world_size())
                    if distributed else (0, 1))
    with warnings.catch_warnings(), dcp_errors(f"loading {reader.prefix}"):
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        _dcp_load(state, storage_reader=reader, no_dist=not distributed)


def load_model_shards(root: Path, *, manifest: Manifest, headers: Mapping[str, str], index: int,
                      module: nn.Module, strict: bool, distributed: bool
                      ) -> tuple[list[str], list[str]]:
    """Load ``sharded/model_<index>`` into ``module`` at this run's sharding (DCP reshards);
    returns (missing keys, unexpected keys). Collective when ``distributed``.

    Raises:
        ValueError: ``strict`` and the keys differ.
    """
    reader = ShardReader(root, model_prefix(index), manifest, headers)
    saved = set(reader.read_metadata().state_dict_metadata)
    state = get_model_state_dict(module)
    missing = sorted(set(state) - saved)
    unexpected = sorted(saved - set(state))
    if strict and (missing or unexpected):
        raise ValueError(f"missing keys {missing[:20]}, unexpected keys {unexpected[:20]} "
                         "(is it the checkpoint of this model?)")
    wanted = {k: v for k, v in state.items() if k in saved}
    dcp_load(wanted, reader=reader, distributed=distributed)
    set_model_state_dict(module, wanted, options=StateDictOptions(strict=False))
    return missing, unexpected


def _restore_hyperparameters(optimizer: torch.optim.Optimizer, groups: list[Any]) -> None:
    """An optimizer saved before its first step: hyper-parameters only, state left empty."""
    if len(groups) != len(optimizer.param_groups):
        raise ValueError(f"the checkpoint has {len(groups)} parameter group(s), the optimizer "
                         f"{len(optimizer.param_groups)}; build the optimizer as when saving")
    for group, saved in zip(optimizer.param_groups, groups, strict=True):
        group.update({k: v for k, v in saved.items() if k != "params"})
    optimizer.state.clear()


def load_optimizer_shards(root: Path, *, manifest: Manifest, headers: Mapping[str, str],
                          index: int, module: nn.Module, optimizer: torch.optim.Optimizer,
                          doc: Mapping[str, Any], distributed: bool) -> None:
    """Load ``sharded/optimizer_<index>`` (+ its JSON ``doc``) into ``optimizer`` (collective
    when ``distributed``); DCP reshards each tensor to this run's parameters."""
    keys: Mapping[str, Mapping[str, str]] = doc["tensors"]
    plain: Mapping[str, Mapping[str, Any]] = doc["state"]
    if not keys and not plain:
        _restore_hyperparameters(optimizer, list(doc["param_groups"]))
        return
    current: Any = get_optimizer_state_dict(module, optimizer)["state"]  # initialised
    flat: dict[str, Any] = {}
    for fqn, names in keys.items():
        if fqn not in current:
            raise ValueError(f"the checkpoint holds optimizer state for parameter {fqn!r}, "
                             "which this model's optimizer lacks; prepare the same model")
        for name, key in names.items():
            flat[key] = current[fqn][name]
    if flat:
        dcp_load(flat, reader=ShardReader(root, optimizer_prefix(index), manifest, headers),
                  distributed=distributed)
    state = {fqn: {**plain.get(fqn, {}), **{n: flat[k] for n, k in keys.get(fqn, {}).items()}}
             for fqn in {*keys, *plain}}
    full: Any = {"state": state, "param_groups": doc["param_groups"]}
    set_optimizer_state_dict(module, optimizer, full)


def fqn_keyed(module: nn.Module, optimizer: torch.optim.Optimizer,
              state: Mapping[str, Any]) -> dict[str, Any]:
    """``optimizer.state_dict()``-style state (parameters numbered in group order) keyed by
    FQN instead, for a checkpoint of an unsharded run loaded into a sharded one."""
    names = {id(p): n for n, p in module.named_parameters(remove_duplicate=False)}
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    groups = state["param_groups"]
    return {"state": {order[int(i)]: s for i, s in state["state"].items()},
            "param_groups": [{**g, "params": [order[int(i)] for i in g["params"]]}
                             for g in groups]}


def load_full_optimizer(module: nn.Module, *, optimizer: torch.optim.Optimizer,
                        state: Mapping[str, Any], distributed: bool) -> None:
    """Load FQN-keyed full optimizer state (every rank holds all of it; each keeps its
    shards when ``distributed``; collective then)."""
    if not state.get("state"):
        _restore_hyperparameters(optimizer, list(state.get("param_groups", [])))
        return
    set_optimizer_state_dict(module, optimizer, dict(state),
                             options=StateDictOptions(full_state_dict=distributed))
