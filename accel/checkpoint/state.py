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

import functools
import hashlib
import json
import random
import shutil
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import _tree
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


def _seed_new_rank(step: int, rank: int, device: Device) -> None:
    """A rank the checkpoint has no RNG state for: seeded from (step, rank), deterministically."""
    seed = (step * 1_000_003 + rank * 7919 + 12345) % (2**31)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    device.manual_seed(seed)


def _counts(objs: StateObjects) -> dict[str, int]:
    return {"models": len(objs.models), "optimizers": len(objs.optimizers),
            "schedulers": len(objs.schedulers), "loaders": len(objs.loaders),
            "custom": len(objs.custom)}


def _check_counts(manifest: Manifest, objs: StateObjects) -> None:
    """Components are matched by position: the same kinds and numbers must be prepared."""
    saved, prepared = manifest.meta.get("counts"), _counts(objs)
    if not isinstance(saved, dict):
        return  # written without counts: each component is still checked on its own
    differ = {k: (saved.get(k), n) for k, n in prepared.items() if saved.get(k, n) != n}
    if differ:
        found = ", ".join(f"{k}: {old} saved, {new} prepared" for k, (old, new) in differ.items())
        raise ValueError(f"the checkpoint does not match what this job prepared ({found}); "
                         "prepare() and register_for_checkpointing() the same objects in the "
                         "same order before load_state()")


def _on_cpu(state: Any) -> Any:
    """Tensors of ``state`` on the CPU (XLA/CUDA tensors cannot be written directly)."""
    return _tree.apply(lambda t: t if t.device.type == "cpu" else t.detach().cpu(), state)


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
            records.update(write_state(tmp, f"optimizer_{i}", _on_cpu(opt.state_dict())))
        for i, sched in enumerate(objs.schedulers):
            records.update(write_state(tmp, f"scheduler_{i}", _on_cpu(sched.state_dict())))
        scaler = objs.precision.state_dict()
        if scaler:
            records.update(write_state(tmp, "scaler", _on_cpu(scaler)))
        for i, obj in enumerate(objs.custom):
            records.update(write_state(tmp, f"custom_{i}", _on_cpu(obj.state_dict())))
    records.update(write_state(tmp, f"rank_{rank}/rng", _rng_state(objs.device)))
    records.update(write_state(tmp, f"rank_{rank}/loaders",
                               [loader.state_dict() for loader in objs.loaders]))
    return records


def _plan_target(comm: Communicator, output_dir: str | None, project_dir: str | None
                 ) -> tuple[Path, str]:
    """Rank 0 picks the directory and the temp token; a failure there raises on every rank."""
    plan: list[Any] = [None, None]
    if comm.ctx.is_main_process:
        try:
            root = checkpoints_root(project_dir) if output_dir is None else None  # type: ignore[arg-type]
            target = next_checkpoint_name(root) if root is not None else Path(output_dir)  # type: ignore[arg-type]
            target.parent.mkdir(parents=True, exist_ok=True)
            plan = [str(target), new_token()]
        except OSError as exc:  # sent to every rank so that none waits in a collective
            plan = [CheckpointError(f"cannot create the checkpoint directory's parent: {exc}"),
                    None]
    target_s, token = comm.broadcast_object_list(plan)
    if isinstance(target_s, Exception):
        raise target_s
    return Path(target_s), token


def _finish_save(tmp: Path, target: Path, objs: StateObjects, gathered: list[Any], step: int,
                 world_size: int, limit: int | None, keep: Sequence[Path]) -> Exception | None:
    """Rank 0: manifest, rename, rotation; returns the error to report to every rank."""
    failed = [r for r in gathered if isinstance(r, Exception)]
    if not failed:
        merged = {k: v for r in gathered for k, v in r.items()}
        try:
            meta = dict(objs.meta, counts=_counts(objs))
            finalize(tmp, target, step=step, world_size=world_size, meta=meta, records=merged)
        except Exception as exc:  # reported to every rank, then re-raised
            failed = [CheckpointError(f"finishing checkpoint {target} failed: {exc}")]
    if failed:
        if tmp.exists():  # an unfinished save leaves nothing behind (it never had a manifest)
            shutil.rmtree(tmp)
        return failed[0]
    if limit is not None:
        try:
            rotate(target.parent, limit, keep=[target, *keep])
        except (OSError, ValueError) as exc:
            return CheckpointError(f"checkpoint {target} is complete, but rotating the older "
                                   f"ones (total_limit={limit}) failed: {exc}")
    return None


def save_accelerator_state(comm: Communicator, objs: StateObjects, output_dir: str | None,
                           project_dir: str | None, total_limit: int | None, keep: Sequence[Path],
                           step: int, unwrap: Callable[[Any], torch.nn.Module]) -> Path:
    """Write a checkpoint of ``objs`` from every rank; returns its directory.

    Without ``output_dir`` the checkpoint is ``<project_dir>/checkpoints/checkpoint_<n+1>`` and
    at most ``total_limit`` complete ones are kept (never the new one nor those in ``keep``).
    Any rank's failure raises on every rank; no rank is left waiting in a collective.
    """
    ctx = comm.ctx
    auto = output_dir is None
    if auto and project_dir is None:
        raise ValueError("save_state() without output_dir needs Accelerator(project_dir=...) "
                         "(checkpoints go to <project_dir>/checkpoints/checkpoint_<n>)")
    target, token = _plan_target(comm, output_dir, project_dir)
    tmp = temp_dir_for(target, token)
    try:
        records: Any = _write_rank_files(tmp, objs, ctx.rank, unwrap)
    except Exception as exc:  # reported to every rank below, then re-raised
        records = CheckpointError(f"rank {ctx.rank} could not write its part of {target}: {exc}")
    gathered = comm.gather_object([records])
    outcome: list[Any] = [None]
    if ctx.is_main_process:
        outcome = [_finish_save(tmp, target, objs, gathered, step, ctx.world_size,
                                total_limit if auto else None, keep)]
    error = comm.broadcast_object_list(outcome)[0]
    if error is not None:
        raise error
    return target


def _resolve_input(comm: Communicator, input_dir: str | None, project_dir: str | None,
                   missing_ok: bool) -> Path | None:
    choice: list[Any] = [None]
    if comm.ctx.is_main_process:
        if input_dir is not None:
            choice = [str(input_dir)]
        elif project_dir is None:
            choice = [ValueError("load_state() without input_dir needs Accelerator(project_dir="
                                 "...) to find <project_dir>/checkpoints/checkpoint_<n>")]
        else:
            found: Path | CheckpointError | None
            try:
                found = latest_complete(checkpoints_root(project_dir))
            except OSError as exc:  # sent to every rank so that none waits in a collective
                found = CheckpointError(f"cannot list {checkpoints_root(project_dir)}: {exc}")
            choice = [found if isinstance(found, Exception) else str(found) if found
                      else None if missing_ok else FileNotFoundError(
                          f"no complete checkpoint under {checkpoints_root(project_dir)}; "
                          "save_state() first, pass input_dir, or load_state(missing_ok=True) "
                          "to start fresh")]
    picked = comm.broadcast_object_list(choice)[0]
    if isinstance(picked, Exception):
        raise picked
    return None if picked is None else Path(picked)


class _Loader:
    """Loads components; with strict=False problems become warnings on the affected rank."""

    def __init__(self, path: Path, manifest: Manifest, strict: bool, rank: int) -> None:
        self.path, self.manifest, self.strict, self.rank = path, manifest, strict, rank

    def run(self, what: str, action: Callable[[], None]) -> None:
        try:
            action()
        except (CheckpointError, KeyError, IndexError, RuntimeError, ValueError, TypeError) as exc:
            if self.strict:
                if isinstance(exc, CheckpointError):
                    raise
                raise CheckpointError(f"loading {what} from {self.path} failed: {exc}; pass "
                                      "strict=False to skip it with a warning",
                                      path=self.path / what) from exc
            self.warn(f"skipped {what}: {exc}", depth=6)

    def warn(self, message: str, depth: int) -> None:
        """Warn on this rank; ``depth`` is the number of accel frames above the user's call."""
        warnings.warn(f"rank {self.rank}: load_state({self.path}, strict=False): {message}",
                      stacklevel=depth)

    def state(self, stem: str) -> Any:
        return read_state(self.path, stem, self.manifest)

    def into(self, target: Any, stem: str) -> None:
        target.load_state_dict(self.state(stem))

    def model(self, index: int, model: torch.nn.Module) -> None:
        rel = f"model_{index}.safetensors"
        result = model.load_state_dict(load_tensors(self.path, rel, self.manifest),
                                       strict=self.strict)
        if result.missing_keys or result.unexpected_keys:
            self.warn(f"{rel}: missing keys {result.missing_keys}, unexpected keys "
                      f"{result.unexpected_keys}", depth=8)


def load_accelerator_state(comm: Communicator, objs: StateObjects, input_dir: str | None,
                           project_dir: str | None, strict: bool,
                           unwrap: Callable[[Any], torch.nn.Module], missing_ok: bool = False
                           ) -> tuple[Path, Manifest] | None:
    """Restore ``objs`` from a checkpoint on every rank.

    Without ``input_dir`` the newest complete checkpoint under ``project_dir`` is loaded (or,
    with ``missing_ok``, None is returned when there is none). A rank's failure raises on every
    rank (no rank is left waiting); ranks check that they loaded the same checkpoint.
    """
    ctx = comm.ctx
    path = _resolve_input(comm, input_dir, project_dir, missing_ok)
    if path is None:
        return None
    error: Exception | None = None
    mine: tuple[Any, ...]
    try:
        manifest = read_manifest(path)
        _load_shared(_Loader(path, manifest, strict, ctx.rank), objs, unwrap)
        _load_rank_state(_Loader(path, manifest, strict, ctx.rank), objs, ctx.rank,
                         ctx.world_size, ctx.is_main_process)
        mine = ("ok", manifest.step, manifest.created, _identity(manifest))
    except Exception as exc:  # reported to every rank below, then re-raised on this one
        error = exc
        mine = ("error", f"{type(exc).__name__}: {exc}")
    outcomes = comm.gather_object([mine])
    if error is not None:
        raise error
    failed = [f"rank {r}: {o[1]}" for r, o in enumerate(outcomes) if o[0] == "error"]
    if failed:
        raise CheckpointError(f"load_state({path}) failed on another rank: " + "; ".join(failed),
                              path=path)
    if len(set(outcomes)) != 1:
        seen = "; ".join(f"rank {r}: step {o[1]}, written {o[2]}, files {o[3][:12]}"
                         for r, o in enumerate(outcomes))
        raise CheckpointError(f"ranks loaded different checkpoints from {path} ({seen}); every "
                              "rank must see the same checkpoint directory (shared filesystem)",
                              path=path)
    return path, manifest


def _identity(manifest: Manifest) -> str:
    """What makes two ranks' checkpoints the same one (paths may differ between nodes)."""
    listing = sorted((rel, rec.size, rec.sha256) for rel, rec in manifest.files.items())
    return hashlib.sha256(json.dumps(listing).encode("utf-8")).hexdigest()


def _load_shared(ld: _Loader, objs: StateObjects, unwrap: Callable[[Any], torch.nn.Module]
                 ) -> None:
    """Components rank 0 wrote, loaded on every rank."""
    ld.run("manifest.json", functools.partial(_check_counts, ld.manifest, objs))
    for i, model in enumerate(objs.models):
        ld.run(f"model_{i}.safetensors", functools.partial(ld.model, i, unwrap(model)))
    stems = [*(f"optimizer_{i}" for i in range(len(objs.optimizers))),
             *(f"scheduler_{i}" for i in range(len(objs.schedulers))),
             *(["scaler"] if objs.precision.state_dict() else []),
             *(f"custom_{i}" for i in range(len(objs.custom)))]
    targets = [*objs.optimizers, *objs.schedulers,
               *([objs.precision] if objs.precision.state_dict() else []), *objs.custom]
    for stem, target in zip(stems, targets):
        ld.run(stem, functools.partial(ld.into, target, stem))


def _load_rank_state(ld: _Loader, objs: StateObjects, rank: int, world: int,
                     is_main: bool) -> None:
    """This rank's RNG state and loader positions (rank 0's positions if the world changed)."""
    saved_world = ld.manifest.world_size
    if saved_world != world and is_main:
        change = (f"the RNG states of ranks {world}..{saved_world - 1} are dropped"
                  if world < saved_world else
                  f"ranks {saved_world}..{world - 1} are seeded deterministically from the step")
        warnings.warn(
            f"checkpoint {ld.path} was written by {saved_world} process(es), this job has "
            f"{world}: model, optimizer, scheduler and registered state are loaded; {change}; "
            "data loader positions are converted from rank 0's", stacklevel=4)
    if rank < saved_world:  # this rank wrote RNG state: missing/corrupt is an error
        ld.run(f"rank_{rank}/rng", lambda: _set_rng_state(ld.state(f"rank_{rank}/rng"),
                                                          objs.device))
    else:
        _seed_new_rank(ld.manifest.step, rank, objs.device)
    if not objs.loaders:
        return
    source = rank if saved_world == world else 0

    def loaders() -> None:
        states = ld.state(f"rank_{source}/loaders")
        if len(states) != len(objs.loaders):
            raise ValueError(f"checkpoint has {len(states)} data loader state(s), "
                             f"{len(objs.loaders)} loader(s) are prepared; prepare the same "
                             "loaders in the same order before load_state()")
        for loader, state in zip(objs.loaders, states):
            loader.load_state_dict(state)

    ld.run(f"rank_{source}/loaders", loaders)
