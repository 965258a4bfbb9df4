"""``load_run``: every rank restores the same checkpoint, or every rank raises.

Rank 0 resolves which checkpoint (``input_dir``, else the newest complete one under the
project) and broadcasts it; each rank loads the shared components, its own RNG state and (for
loaders with ``use_stateful_dataloader``) its loader positions; the ranks' outcomes are
gathered, so a failure on one rank raises on all of them, and ranks that read different
checkpoints (no shared filesystem) are caught.

With ``save_on_each_node`` every machine holds its own copy (see :mod:`.copies`), so every rank
resolves the checkpoint on its machine, as Accelerate's ``load_state`` does; the ranks first
agree that each found one (the same ``checkpoint_<n>`` when the newest is asked for), and the
copies of one save are recognised by the save id in their manifests.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from ..._base.warn import warn_user
from ...distributed import Communicator
from ...run import rng
from ..storage import (
    CheckpointError,
    Manifest,
    checkpoints_root,
    latest_complete,
    load_tensors,
    read_manifest,
    read_state,
)
from . import sharded
from .snapshot import (
    LoadedRun,
    ModelStateIO,
    RunSnapshot,
    Stateful,
    component_counts,
    restored_loaders,
)

__all__ = ["load_run"]

def _check_counts(manifest: Manifest, snap: RunSnapshot, models: int) -> None:
    """Components are matched by position: the same kinds and numbers must be prepared
    (``models``: those left to accel after the load hooks took theirs)."""
    saved, prepared = manifest.meta.get("counts"), dict(component_counts(snap), models=models)
    if not isinstance(saved, dict):
        return  # written without counts: each component is still checked on its own
    if not restored_loaders(snap):  # positions unused (as in Accelerate): any number is fine
        prepared.pop("loaders")
    differ = {k: (saved.get(k), n) for k, n in prepared.items() if saved.get(k, n) != n}
    if differ:
        found = ", ".join(f"{k}: {old} saved, {new} prepared" for k, (old, new) in differ.items())
        raise ValueError(f"the checkpoint does not match what this job prepared ({found}); "
                         "prepare() and register_for_checkpointing() the same objects in the "
                         "same order before load_state()")


def _choice(input_dir: str | Path | None, *, project_dir: str | Path | None, missing_ok: bool
            ) -> str | Exception | None:
    """The checkpoint this process would load (None: none yet, ``missing_ok``), or the error
    to raise on every rank."""
    if input_dir is not None:
        return str(input_dir)
    if project_dir is None:
        return ValueError("load_state() without input_dir needs Accelerator(project_dir=...) to "
                          "find <project_dir>/checkpoints/checkpoint_<n>")
    try:
        found = latest_complete(checkpoints_root(project_dir))
    except OSError as exc:  # sent to every rank so that none waits in a collective
        return CheckpointError(f"cannot list {checkpoints_root(project_dir)}: {exc}")
    if found is not None:
        return str(found)
    return None if missing_ok else FileNotFoundError(
        f"no complete checkpoint under {checkpoints_root(project_dir)}; save_state() first, "
        "pass input_dir, or load_state(missing_ok=True) to start fresh")


def _agree_on_copies(picks: list[str | Exception | None], *, newest: bool) -> None:
    """``save_on_each_node``: every rank found a copy (or none did), the same save's when the
    newest is asked for."""
    found = {r: Path(p) for r, p in enumerate(picks) if isinstance(p, str)}
    lacking = [r for r, p in enumerate(picks) if p is None]
    names = {p.name for p in found.values()}
    if found and (lacking or (newest and len(names) > 1)):
        seen = "; ".join(f"rank {r}: {Path(p).name if isinstance(p, str) else 'none'}"
                         for r, p in enumerate(picks))
        raise CheckpointError(
            "load_state(): with save_on_each_node each machine loads its own copy, but the "
            f"machines' newest complete checkpoints differ ({seen}): a save did not reach "
            "every machine. Pass input_dir naming a checkpoint that every machine has")


def _resolve_input(comm: Communicator, *, input_dir: str | Path | None,
                   project_dir: str | Path | None, missing_ok: bool, each_node: bool
                   ) -> Path | None:
    """Rank 0's choice, on every rank; with ``each_node`` each rank's own (see above)."""
    if each_node:
        mine = _choice(input_dir, project_dir=project_dir, missing_ok=missing_ok)
        picks = comm.gather_object([mine])
        failed = [p for p in picks if isinstance(p, Exception)]
        if failed:
            raise failed[0]
        _agree_on_copies(picks, newest=input_dir is None)
        return None if mine is None else Path(str(mine))
    choice: list[Any] = [_choice(input_dir, project_dir=project_dir, missing_ok=missing_ok)
                         if comm.ctx.is_main_process else None]
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
            self.warn(f"skipped {what}: {exc}")

    def warn(self, message: str) -> None:
        """Warn on this rank, at the user's ``load_state`` line."""
        warn_user(f"rank {self.rank}: load_state({self.path}, strict=False): {message}")

    def state(self, stem: str) -> Any:
        return read_state(self.path, stem, self.manifest)

    def into(self, target: Stateful, stem: str) -> None:
        target.load_state_dict(self.state(stem))

    def optimizer(self, index: int, target: Stateful, snap: RunSnapshot) -> None:
        """Through torch's FQN-keyed APIs when the checkpoint or the run is sharded."""
        state = self.state(f"optimizer_{index}")
        if not sharded.load_optimizer(self.manifest, index=index, optimizer=target, state=state,
                                      snap=snap):
            target.load_state_dict(state)

    def model(self, index: int, model: nn.Module, io: ModelStateIO) -> None:
        keys = sharded.load_model(self.manifest, index=index, model=model, io=io,
                                  strict=self.strict)
        rel = f"{sharded.model_prefix(index)}/" if keys is not None else \
            f"model_{index}.safetensors"
        if keys is None:  # a whole model file
            result = io.load_model_state_dict(model, state=load_tensors(self.path, rel,
                                                                        self.manifest),
                                              strict=self.strict)
            keys = (list(result.missing_keys), list(result.unexpected_keys))
        if keys[0] or keys[1]:
            self.warn(f"{rel}: missing keys {keys[0]}, unexpected keys {keys[1]}")


def _identity(manifest: Manifest) -> str:
    """What makes two ranks' checkpoints the same one (paths may differ between nodes): the
    save id of the copies ``save_on_each_node`` writes (one per machine, each with its own
    writer's files), else the creation time and every file."""
    save_id = manifest.meta.get("save_id")
    if isinstance(save_id, str):
        return f"save {save_id}"
    listing = sorted((rel, rec.size, rec.sha256) for rel, rec in manifest.files.items())
    digest = hashlib.sha256(json.dumps(listing).encode("utf-8")).hexdigest()
    return f"written {manifest.created}, files {digest[:12]}"


def _load_shared(ld: _Loader, snap: RunSnapshot) -> None:
    """Components rank 0 wrote, loaded on every rank (models after the load hooks ran: as in
    Accelerate, a hook may load models itself and pop them; the rest match model_0, …)."""
    models = list(snap.models)
    for hook in snap.load_hooks:
        hook(models, str(ld.path))
    ld.run("manifest.json", functools.partial(_check_counts, ld.manifest, snap, len(models)))
    for i, model in enumerate(models):
        what = f"{sharded.model_prefix(i)}/" if sharded.holds_shards(ld.manifest, i) else \
            f"model_{i}.safetensors"
        ld.run(what, functools.partial(ld.model, i, model, snap.model_io))
    for i, opt in enumerate(snap.optimizers):
        ld.run(f"optimizer_{i}", functools.partial(ld.optimizer, i, opt, snap))
    has_scaler = bool(snap.scaler.state_dict())
    stems = [*(f"scheduler_{i}" for i in range(len(snap.schedulers))),
             *(["scaler"] if has_scaler else []),
             *(f"custom_{i}" for i in range(len(snap.custom)))]
    targets = [*snap.schedulers, *([snap.scaler] if has_scaler else []),
               *snap.custom]
    for stem, target in zip(stems, targets, strict=True):
        ld.run(stem, functools.partial(ld.into, target, stem))


def _no_loader_positions(ld: _Loader, *, is_main: bool) -> bool:
    """True (and one warning) for a checkpoint that holds no loader positions: one converted
    from Accelerate's save_state. The prepared loaders are left where they are, as Accelerate's
    load_state leaves loaders without use_stateful_dataloader."""
    if ld.manifest.meta.get("loader_positions", True) is not False:
        return False
    if is_main:
        warn_user(f"checkpoint {ld.path} holds no data loader positions (it was converted "
                  "from Accelerate's save_state): the prepared data loaders are not moved; "
                  "skip the batches already seen with accelerator.skip_first_batches(), as "
                  "under Accelerate")
    return True


def _absent_ranks(manifest: Manifest) -> frozenset[int]:
    """Ranks whose RNG states and loader positions a main-process-only save could not write."""
    raw = manifest.meta.get("absent_rank_states", [])
    return frozenset(r for r in raw if isinstance(r, int)) if isinstance(raw, list) else \
        frozenset()


def _rank_state_note(path: Path, *, saved_world: int, world: int, absent: frozenset[int],
                     positions: bool = True) -> str | None:
    """The one warning about ranks that get no saved RNG state (None: every rank has its own);
    ``positions``: loaders restore their positions (use_stateful_dataloader)."""
    unsaved = sorted(r for r in absent if r < world)
    resume = ", and their data loaders resume from rank 0's position" if positions else ""
    alone = (f"it was saved by the main process alone (save_state() under `if accelerator."
             f"is_main_process:`), so ranks {unsaved} have no saved RNG state and are seeded "
             f"deterministically from the step{resume}") if unsaved else ""
    if saved_world == world:
        return f"checkpoint {path}: {alone}" if alone else None
    change = (f"the RNG states of ranks {world}..{saved_world - 1} are dropped"
              if world < saved_world else
              f"ranks {saved_world}..{world - 1} are seeded deterministically from the step")
    converted = "; data loader positions are converted from rank 0's" if positions else ""
    return (f"checkpoint {path} was written by {saved_world} process(es), this job has {world}: "
            f"model, optimizer, scheduler and registered state are loaded; {change}{converted}"
            + (f"; {alone}" if alone else ""))


def _load_rank_state(ld: _Loader, *, snap: RunSnapshot, rank: int, world: int,
                     is_main: bool) -> None:
    """This rank's RNG state and loader positions (rank 0's positions if the world changed, or
    if this rank's were not saved)."""
    saved_world = ld.manifest.world_size
    restore = restored_loaders(snap)
    absent = _absent_ranks(ld.manifest)
    note = _rank_state_note(ld.path, saved_world=saved_world, world=world, absent=absent,
                            positions=restore) if is_main else None
    if note is not None:
        warn_user(note)
    own = rank < saved_world and rank not in absent
    if own:  # this rank wrote RNG state: missing/corrupt is an error
        ld.run(f"rank_{rank}/rng", lambda: rng.restore(ld.state(f"rank_{rank}/rng"),
                                                       snap.device))
    else:
        rng.seed_everything(rng.rank_seed(ld.manifest.step, rank), snap.device)
    if not restore or _no_loader_positions(ld, is_main=is_main):  # no loader asks for its position
        return
    source = rank if saved_world == world and own else 0

    def loaders() -> None:
        states = ld.state(f"rank_{source}/loaders")
        if len(states) != len(snap.loaders):
            raise ValueError(f"checkpoint has {len(states)} data loader state(s), "
                             f"{len(snap.loaders)} loader(s) are prepared; prepare the same "
                             "loaders in the same order before load_state()")
        for loader, state in zip(snap.loaders, states, strict=True):
            if loader.use_stateful_dataloader:
                loader.load_state_dict(state)

    ld.run(f"rank_{source}/loaders", loaders)


def _missing_here(path: Path, *, rank: int, each_node: bool) -> CheckpointError:
    if each_node:
        return CheckpointError(f"rank {rank}: {path} does not exist on this machine; with "
                               "save_on_each_node each machine loads its own copy: pass an "
                               "input_dir that exists on every machine", path=path)
    return CheckpointError(
        f"rank {rank} does not see {path}, which the main process picked: the machines do not "
        "share this filesystem. Save with ProjectConfiguration(save_on_each_node=True) so that "
        "each machine's local main process writes its own copy (and load_state() reads it), "
        "or copy the checkpoint to every machine", path=path)


def _load_on_this_rank(comm: Communicator, *, snap: RunSnapshot, path: Path, strict: bool,
                       each_node: bool) -> tuple[LoadedRun | Exception, tuple[Any, ...]]:
    """Load everything this rank needs; returns (result or own error, outcome to gather)."""
    ctx = comm.ctx
    try:
        if ctx.is_distributed and (each_node or not ctx.is_main_process) and \
                not path.is_dir():
            raise _missing_here(path, rank=ctx.rank, each_node=each_node)
        manifest = read_manifest(path)
        _load_shared(_Loader(path, manifest, strict, ctx.rank), snap)
        _load_rank_state(_Loader(path, manifest, strict, ctx.rank), snap=snap, rank=ctx.rank,
                         world=ctx.world_size, is_main=ctx.is_main_process)
        loaded = LoadedRun(path=path,
                           accumulation_step=int(manifest.meta.get("accumulation_step", 0)),
                           optimizer_steps=int(manifest.meta.get("optimizer_steps", 0)))
        return loaded, ("ok", manifest.step, _identity(manifest))
    except Exception as exc:  # noqa: BLE001 - reported to every rank by the caller, then re-raised on this one
        return exc, ("error", f"{type(exc).__name__}: {exc}")


def load_run(comm: Communicator, *, snap: RunSnapshot, input_dir: str | Path | None,
             project_dir: str | Path | None, strict: bool = True, missing_ok: bool = False,
             save_on_each_node: bool = False) -> LoadedRun | None:
    """Restore ``snap``'s objects and this rank's RNG streams from a checkpoint, on every rank.

    Without ``input_dir`` the newest complete checkpoint under ``project_dir`` is loaded (or,
    with ``missing_ok``, None is returned when there is none). The objects in ``snap`` are
    loaded in place; the returned :class:`LoadedRun` carries what the caller's run state must
    take over (accumulation micro-step, optimizer steps, the loaded directory). A rank's failure
    raises on every rank (no rank is left waiting); ranks check that they loaded the same
    checkpoint. Warnings point at the caller of the function that calls this one.

    ``save_on_each_node``: each rank loads the copy on its machine (``input_dir`` as this rank
    was given it, or the newest under its own ``project_dir``); the ranks check that each
    found one, of the same save.

    Raises:
        CheckpointError: a component is missing or corrupt (``strict``), a rank failed, or the
            ranks saw different checkpoints.
        FileNotFoundError: no complete checkpoint under ``project_dir`` and not ``missing_ok``.
    """
    path = _resolve_input(comm, input_dir=input_dir, project_dir=project_dir, missing_ok=missing_ok,
                          each_node=save_on_each_node)
    if path is None:
        return None
    loaded, mine = _load_on_this_rank(comm, snap=snap, path=path, strict=strict,
                                      each_node=save_on_each_node)
    outcomes = comm.gather_object([mine])
    if isinstance(loaded, Exception):
        raise loaded
    failed = [f"rank {r}: {o[1]}" for r, o in enumerate(outcomes) if o[0] == "error"]
    if failed:
        raise CheckpointError(f"load_state({path}) failed on another rank: " + "; ".join(failed),
                              path=path)
    if len(set(outcomes)) != 1:
        seen = "; ".join(f"rank {r}: step {o[1]}, {o[2]}" for r, o in enumerate(outcomes))
        raise CheckpointError(f"ranks loaded different checkpoints from {path} ({seen}); every "
                              "rank must see the same checkpoint directory (shared filesystem)",
                              path=path)
    return loaded
