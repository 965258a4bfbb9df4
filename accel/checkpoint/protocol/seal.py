"""Sealing a checkpoint: the ranks' records gathered, each copy's manifest, rename and rotation.

After every rank queued its files (:mod:`.save`), ``seal`` gathers what each rank wrote and
where, with the states of the ranks that wrote elsewhere (no shared filesystem, or the other
machines' copies under ``save_on_each_node``, see :mod:`.copies`). The writer of each copy
writes those states into it, then the manifest, renames the directory into place and rotates;
the outcome reaches every rank, so that a failure on any rank raises on all of them instead of
leaving one waiting in a collective. Copies on several machines are sealed together: one that
fails withdraws the others, so that every machine's newest checkpoint is the same save.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..._base.version import __version__
from ...distributed import Communicator
from ..storage import (
    CheckpointError,
    FileRecord,
    finalize,
    remove_checkpoint,
    rotate,
    write_state,
    write_tensors,
)
from .copies import SavePlan, refusal
from .sharded import FQN_LAYOUT, distributed_state
from .snapshot import RunSnapshot, component_counts

__all__ = ["Exported", "RankPart", "RankFiles", "finish_save", "seal", "write_exported"]


#: A model accel wrote: whole (``model_0.safetensors``) or through DCP (``sharded/model_0/…``).
_MODEL_FILE = re.compile(r"(?:model_(\d+)\.safetensors$|sharded/model_(\d+)/)")


#: What a rank reports after writing its part: its files and the header hashes of its DCP
#: files, or the error that stopped it.
RankPart = tuple[dict[str, FileRecord], dict[str, str]]
#: Files a rank hands to the writers of the copies it does not write into: (kind, name, value)
#: with kind "tensors" (a safetensors file) or "state" (a state's stem).
Exported = list[tuple[str, str, Any]]


class RankFiles(Protocol):
    """A rank's part of a save (:class:`accel.checkpoint.protocol.save._RankFiles`)."""

    @property
    def exported(self) -> Exported | None: ...

    def result(self) -> RankPart | CheckpointError: ...


def write_exported(tmp: Path, exported: Exported, rank: int) -> RankPart | CheckpointError:
    """A copy's writer: write the files another rank handed over (not written in threads:
    they are small, RNG states and loader positions)."""
    records: dict[str, FileRecord] = {}
    try:
        for kind, name, value in exported:
            if kind == "tensors":
                records[name] = write_tensors(tmp, relpath=name, tensors=value)
            else:
                records.update(write_state(tmp, name, value))
    except Exception as exc:  # noqa: BLE001 - reported to every rank by the caller
        return CheckpointError(f"writing rank {rank}'s states into {tmp} failed: {exc}")
    return records, {}


def finish_save(tmp: Path, *, target: Path, snap: RunSnapshot, gathered: list[Any],
                world_size: int, limit: int | None, keep: Sequence[Path],
                absent: Sequence[int] = (), save_id: str | None = None) -> Exception | None:
    """Rank 0 (a copy's writer): manifest, rename, rotation; returns the error to report to
    every rank (the temporary directory is removed after a failure).

    ``absent``: ranks that did not write their states (a save by the main process alone).
    ``save_id``: the same in every machine's copy (``save_on_each_node``)."""
    failed = [r for r in gathered if isinstance(r, Exception)]
    if not failed:
        merged = {k: v for files, _headers in gathered for k, v in files.items()}
        meta = _meta(snap, merged, {k: v for _files, h in gathered for k, v in h.items()})
        if absent:
            meta["absent_rank_states"] = list(absent)
        if save_id is not None:
            meta["save_id"] = save_id
        try:
            finalize(tmp, target=target, step=snap.optimizer_steps, world_size=world_size,
                     meta=meta,
                     records=merged, accel_version=__version__)
        except Exception as exc:  # noqa: BLE001 - reported to every rank, then re-raised
            failed = [CheckpointError(f"finishing checkpoint {target} failed: {exc}")]
    if failed:
        if tmp.exists():  # an unfinished save leaves nothing behind (it never had a manifest)
            shutil.rmtree(tmp)
        return failed[0]
    return _rotate(target, limit, keep)


def _rotate(target: Path, limit: int | None, keep: Sequence[Path]) -> Exception | None:
    """Keep at most ``limit`` complete checkpoints beside ``target`` (never it, nor ``keep``)."""
    if limit is not None:
        try:
            rotate(target.parent, limit, keep=[target, *keep])
        except (OSError, ValueError) as exc:
            return CheckpointError(f"checkpoint {target} is complete, but rotating the older "
                                   f"ones (total_limit={limit}) failed: {exc}")
    return None


def _meta(snap: RunSnapshot, files: Mapping[str, FileRecord], headers: Mapping[str, str]
          ) -> dict[str, Any]:
    """The manifest's ``meta``: run position, component counts, and how models and optimizers
    are stored when the run's state lives in DTensors."""
    # models: those accel wrote (save hooks may have saved some themselves)
    written = {m.group(1) or m.group(2) for rel in files if (m := _MODEL_FILE.match(rel))}
    counts = dict(component_counts(snap), models=len(written))
    meta: dict[str, Any] = {"accumulation_step": snap.accumulation_step,
                            "optimizer_steps": snap.optimizer_steps, "counts": counts}
    if distributed_state(snap.model_io):
        meta["optimizer_layout"] = FQN_LAYOUT
    if headers:
        meta["sharded"] = {"headers": dict(sorted(headers.items()))}
    return meta


def seal(gather: Callable[[list[Any]], list[Any]], *, share: Callable[[list[Any]], list[Any]],
         comm: Communicator, snap: RunSnapshot, plan: SavePlan, part: RankFiles,
         limit: int | None, say: Callable[[list[int | None]], None] | None = None
         ) -> Exception | None:
    """Every rank: wait for this rank's files, ``gather`` the records (and the states of ranks
    that wrote elsewhere); each copy's writer writes the manifest, renames and rotates; the
    outcome is shared (``share``: rank 0's). Returns the error every rank raises. ``say``
    gets every rank's copy, unless the save is refused (the main process's warning about
    ranks that saw none).

    A blocking save passes the communicator's own collectives; a background save passes the
    same exchanges on its gloo group (the training group is the training thread's)."""
    ctx = comm.ctx
    gathered = gather([(plan.mine, part.result(), part.exported)])
    mines = [g[0] for g in gathered]
    active = plan.active(mines)
    own = plan.machine if plan.copies[plan.machine].writer == ctx.rank else None
    writing = own if own in active else None
    error = refusal(plan, mines=mines, distributed=distributed_state(snap.model_io),
                    sharded=bool(getattr(snap.model_io, "sharded_state", False))) if active \
        else CheckpointError(f"no process could write {plan.target}: the writers did not see "
                             "their own temporary directories")
    # directories created but not sealed (a leftover would never be taken for a checkpoint,
    # and rotation removes it): the writer's; a rank that saw none may have had DCP write its
    # shards into one of its own on its machine
    if own is not None and (writing is None or error is not None):
        shutil.rmtree(plan.copies[own].tmpdir, ignore_errors=True)
    elif plan.mine is None and error is not None and not plan.each_node:
        shutil.rmtree(plan.tmpdir, ignore_errors=True)
    if error is not None:
        return error
    if say is not None:
        say(mines)
    keep = [snap.loaded_dir] if snap.loaded_dir is not None else []
    if plan.each_node:
        sealed = None if writing is None else \
            _finish_copy(plan, index=writing, snap=snap, gathered=gathered,
                         world_size=ctx.world_size, keep=keep)
        return _seal_copies(gather, plan=plan, writing=writing, error=sealed, limit=limit,
                            keep=keep)
    outcome: list[Any] = [None]
    if writing is not None:
        outcome = [_finish_copy(plan, index=writing, snap=snap, gathered=gathered,
                                world_size=ctx.world_size, keep=keep, limit=limit)]
    shared: Exception | None = share(outcome)[0]
    return shared


def _finish_copy(plan: SavePlan, *, index: int, snap: RunSnapshot, gathered: list[Any],
                 world_size: int, keep: Sequence[Path], limit: int | None = None
                 ) -> Exception | None:
    """Copy ``index``'s writer: the states of the ranks that wrote elsewhere, then manifest,
    rename (and rotation, given ``limit``)."""
    copy = plan.copies[index]
    parts: list[Any] = [g[1] for g in gathered]
    if not any(isinstance(p, Exception) for p in parts):
        for rank, (mine, _part, exported) in enumerate(gathered):
            if mine != index:
                parts[rank] = write_exported(copy.tmpdir, exported, rank) if exported \
                    is not None else CheckpointError(f"rank {rank} sent no states for "
                                                     f"{copy.target}")
    return finish_save(copy.tmpdir, target=copy.target, snap=snap, gathered=parts,
                       world_size=world_size, limit=limit, keep=keep,
                       save_id=plan.save_id if plan.each_node else None)


def _seal_copies(gather: Callable[[list[Any]], list[Any]], *, plan: SavePlan, writing: int | None,
                 error: Exception | None, limit: int | None, keep: Sequence[Path]
                 ) -> Exception | None:
    """``save_on_each_node``, after every writer sealed its copy (``error``: how this rank's
    went): all learn whether all could (a copy sealed where another failed is withdrawn, so
    that the machines' newest checkpoints stay the same one); then each writer rotates its own.
    Returns the error every rank raises."""
    failed: list[Exception] = [e for e in gather([error]) if e is not None]
    if failed:
        if writing is not None and error is None:
            target = plan.copies[writing].target
            try:
                remove_checkpoint(target)
            except OSError as exc:
                return CheckpointError(f"{failed[0]}; withdrawing this machine's copy {target} "
                                       f"failed too: {exc}")
        return failed[0]
    # every rank takes part in this exchange, whatever its own total_limit (ranks may disagree)
    rotated = _rotate(plan.copies[writing].target, limit, keep) if writing is not None else None
    problems: list[Exception] = [e for e in gather([rotated]) if e is not None]
    return problems[0] if problems else None


