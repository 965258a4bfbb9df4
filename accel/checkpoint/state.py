"""``save_state`` / ``load_state``: every prepared or registered object, every rank.

Layout of a checkpoint directory (all pickle-free, see :mod:`accel.checkpoint.format`)::

    model_0.safetensors             rank 0: unwrapped model state dicts
    optimizer_0.json/.safetensors   rank 0: optimizer state (codec)
    scheduler_0.json, scaler.json, custom_0.json/.safetensors
    rank_1/rng.json/.safetensors    every rank: python, numpy, torch and device RNG states
    rank_1/loaders.json             every rank: each prepared loader's position
    manifest.json                   written last by rank 0, after every rank finished

Protocol: rank 0 picks the target and a token and broadcasts them; every rank writes its files
into the same temporary sibling directory; file records are gathered (also the barrier); rank 0
writes the manifest, renames the directory into place and rotates; then it tells every rank the
outcome, so a failure on any rank raises on all of them instead of hanging.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..device import Device
from ..distributed import Communicator
from .errors import CheckpointError
from .format import finalize, temp_dir_for, write_state, write_tensors
from .naming import checkpoints_root, latest_complete, next_checkpoint_name, rotate
from .reader import Manifest, load_tensors, read_manifest, read_state
from ._io import new_token

__all__ = ["StateObjects", "load_accelerator_state", "save_accelerator_state"]


@dataclass
class StateObjects:
    """What a checkpoint holds; built by the Accelerator from what it prepared."""

    models: Sequence[torch.nn.Module]
    optimizers: Sequence[Any]
    schedulers: Sequence[Any]
    loaders: Sequence[Any]
    custom: Sequence[Any]
    precision: Any
    device: Device
    meta: dict[str, Any] = field(default_factory=dict)


def _rng_state(device: Device) -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    extra = device.rng_state()
    if extra is not None:
        state["device"] = {k: v.cpu() for k, v in extra.items()}
    return state


def _set_rng_state(state: dict[str, Any], device: Device) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "device" in state:
        device.set_rng_state(state["device"])


def _seed_new_rank(step: int, rank: int) -> None:
    seed = (step * 1_000_003 + rank * 7919 + 12345) % (2**31)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _cpu_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _write_rank_files(tmp: Path, objs: StateObjects, rank: int,
                      unwrap: Callable[[Any], torch.nn.Module]) -> dict[str, Any]:
    records: dict[str, Any] = {}
    if rank == 0:
        for i, model in enumerate(objs.models):
            rel = f"model_{i}.safetensors"
            records[rel] = write_tensors(tmp, rel, _cpu_state_dict(unwrap(model)))
        for i, opt in enumerate(objs.optimizers):
            records.update(write_state(tmp, f"optimizer_{i}", opt.state_dict()))
        for i, sched in enumerate(objs.schedulers):
            records.update(write_state(tmp, f"scheduler_{i}", sched.state_dict()))
        scaler = objs.precision.state_dict()
        if scaler:
            records.update(write_state(tmp, "scaler", scaler))
        for i, obj in enumerate(objs.custom):
            records.update(write_state(tmp, f"custom_{i}", obj.state_dict()))
    records.update(write_state(tmp, f"rank_{rank}/rng", _rng_state(objs.device)))
    records.update(write_state(tmp, f"rank_{rank}/loaders",
                               [loader.state_dict() for loader in objs.loaders]))
    return records


def save_accelerator_state(comm: Communicator, objs: StateObjects, output_dir: str | None,
                           project_dir: str | None, total_limit: int | None, keep: Sequence[Path],
                           step: int, unwrap: Callable[[Any], torch.nn.Module]) -> Path:
    """Write a checkpoint of ``objs`` from every rank; returns its directory."""
    ctx = comm.ctx
    auto = output_dir is None
    if auto and project_dir is None:
        raise ValueError("save_state() without output_dir needs Accelerator(project_dir=...) "
                         "(checkpoints go to <project_dir>/checkpoints/checkpoint_<n>)")
    plan: list[Any] = [None, None]
    if ctx.is_main_process:
        root = checkpoints_root(project_dir) if auto else None  # type: ignore[arg-type]
        target = next_checkpoint_name(root) if root is not None else Path(output_dir)  # type: ignore[arg-type]
        target.parent.mkdir(parents=True, exist_ok=True)
        plan = [str(target), new_token()]
    target_s, token = comm.broadcast_object_list(plan)
    target = Path(target_s)
    tmp = temp_dir_for(target, token)
    try:
        records: Any = _write_rank_files(tmp, objs, ctx.rank, unwrap)
    except Exception as exc:  # reported to every rank below, then re-raised
        records = CheckpointError(f"rank {ctx.rank} could not write its part of {target}: {exc}")
    gathered = comm.gather_object([records])
    outcome: list[Any] = [None]
    if ctx.is_main_process:
        outcome = [next((r for r in gathered if isinstance(r, Exception)), None)]
        if outcome[0] is None:
            merged = {k: v for r in gathered for k, v in r.items()}
            try:
                meta = dict(objs.meta, counts={"models": len(objs.models),
                                               "optimizers": len(objs.optimizers),
                                               "schedulers": len(objs.schedulers),
                                               "loaders": len(objs.loaders),
                                               "custom": len(objs.custom)})
                finalize(tmp, target, step=step, world_size=ctx.world_size, meta=meta,
                         records=merged)
                limit = total_limit
                if auto and limit is not None:
                    rotate(target.parent, limit, keep=[target, *keep])
            except Exception as exc:  # reported to every rank, then re-raised
                outcome = [CheckpointError(f"finishing checkpoint {target} failed: {exc}")]
    error = comm.broadcast_object_list(outcome)[0]
    if error is not None:
        raise error
    return target


def _resolve_input(comm: Communicator, input_dir: str | None, project_dir: str | None) -> Path:
    choice: list[Any] = [None]
    if comm.ctx.is_main_process:
        if input_dir is not None:
            choice = [str(input_dir)]
        elif project_dir is None:
            choice = [ValueError("load_state() without input_dir needs Accelerator(project_dir="
                                 "...) to find <project_dir>/checkpoints/checkpoint_<n>")]
        else:
            found = latest_complete(checkpoints_root(project_dir))
            choice = [str(found) if found else FileNotFoundError(
                f"no complete checkpoint under {checkpoints_root(project_dir)}; save_state() "
                "first, or pass input_dir")]
    picked = comm.broadcast_object_list(choice)[0]
    if isinstance(picked, Exception):
        raise picked
    return Path(picked)


class _Loader:
    """Loads components; with strict=False problems become warnings on the affected rank."""

    def __init__(self, path: Path, manifest: Manifest, strict: bool, rank: int) -> None:
        self.path, self.manifest, self.strict, self.rank = path, manifest, strict, rank

    def run(self, what: str, action: Callable[[], None]) -> None:
        try:
            action()
        except (CheckpointError, KeyError, RuntimeError, ValueError, TypeError) as exc:
            if self.strict:
                if isinstance(exc, CheckpointError):
                    raise
                raise CheckpointError(f"loading {what} from {self.path} failed: {exc}") from exc
            warnings.warn(f"rank {self.rank}: skipped {what} from {self.path} (strict=False): "
                          f"{exc}", stacklevel=3)

    def state(self, stem: str) -> Any:
        return read_state(self.path, stem, self.manifest)


def load_accelerator_state(comm: Communicator, objs: StateObjects, input_dir: str | None,
                           project_dir: str | None, strict: bool,
                           unwrap: Callable[[Any], torch.nn.Module]) -> tuple[Path, Manifest]:
    """Restore ``objs`` from a checkpoint; ranks check they loaded the same one."""
    ctx = comm.ctx
    path = _resolve_input(comm, input_dir, project_dir)
    manifest = read_manifest(path)
    ld = _Loader(path, manifest, strict, ctx.rank)
    for i, model in enumerate(objs.models):
        ld.run(f"model_{i}.safetensors", lambda m=model, i=i: unwrap(m).load_state_dict(
            load_tensors(path, f"model_{i}.safetensors", manifest), strict=True))
    for i, opt in enumerate(objs.optimizers):
        ld.run(f"optimizer_{i}", lambda o=opt, i=i: o.load_state_dict(ld.state(f"optimizer_{i}")))
    for i, sched in enumerate(objs.schedulers):
        ld.run(f"scheduler_{i}", lambda s=sched, i=i: s.load_state_dict(ld.state(f"scheduler_{i}")))
    if objs.precision.state_dict():
        ld.run("scaler", lambda: objs.precision.load_state_dict(ld.state("scaler")))
    for i, obj in enumerate(objs.custom):
        ld.run(f"custom_{i}", lambda o=obj, i=i: o.load_state_dict(ld.state(f"custom_{i}")))
    _load_rank_state(ld, objs, manifest, ctx.rank, ctx.world_size, ctx.is_main_process)
    seen = comm.gather_object([(str(path.resolve()), manifest.step, manifest.created)])
    if len(set(seen)) != 1:
        raise CheckpointError(f"ranks loaded different checkpoints or steps: {seen}; every rank "
                              "must see the same checkpoint directory (shared filesystem)")
    return path, manifest


def _load_rank_state(ld: _Loader, objs: StateObjects, manifest: Manifest, rank: int,
                     world: int, is_main: bool) -> None:
    if manifest.world_size != world and is_main:
        warnings.warn(
            f"checkpoint {ld.path} was written by {manifest.world_size} process(es), this job "
            f"has {world}: model/optimizer state is loaded; per-rank RNG and data-loader "
            "positions are kept only for ranks present in both (new ranks are seeded "
            "deterministically, loaders start their epoch again)", stacklevel=3)
    if rank < manifest.world_size:  # this rank wrote RNG state: missing/corrupt is an error
        ld.run(f"rank_{rank}/rng", lambda: _set_rng_state(ld.state(f"rank_{rank}/rng"),
                                                          objs.device))
    else:
        _seed_new_rank(manifest.step, rank)
    if manifest.world_size != world or not objs.loaders:
        return

    def loaders() -> None:
        states = ld.state(f"rank_{rank}/loaders")
        if len(states) != len(objs.loaders):
            raise ValueError(f"checkpoint has {len(states)} data loader state(s), "
                             f"{len(objs.loaders)} loader(s) are prepared; prepare the same "
                             "loaders in the same order before load_state()")
        for loader, state in zip(objs.loaders, states):
            loader.load_state_dict(state)

    ld.run(f"rank_{rank}/loaders", loaders)
