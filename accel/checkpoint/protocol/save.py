"""``save_run``: every rank writes its part of one checkpoint; rank 0 seals it.

Layout of a checkpoint directory (all pickle-free, see :mod:`accel.checkpoint.storage.format`)::

    model_0.safetensors             rank 0: each model's full state dict
    optimizer_0.json/.safetensors   rank 0: optimizer state (codec)
    sharded/model_0/shard-*.safetensors      FSDP with SHARDED_STATE_DICT instead: every rank
    sharded/optimizer_0/shard-*.safetensors  its shards, through DCP (see .sharded); rank 0
                                             still writes optimizer_0.json (hyper-parameters)
    scheduler_0.json, scaler.json, custom_0.json/.safetensors
    rank_1/rng.json/.safetensors    every rank: python, numpy, torch and device RNG states
    rank_1/loaders.json             every rank: each prepared loader's position
    manifest.json                   written last by rank 0, after every rank finished

Protocol: rank 0 picks the target and a token, creates the temporary sibling directory and
broadcasts both; every rank writes its files into it; file records are gathered (also the
barrier); rank 0 writes the manifest, renames the directory into place and rotates; then it
tells every rank the outcome, so a failure on any rank raises on all of them instead of hanging.
A rank that does not see the temporary directory (no shared filesystem) hands its states to rank
0 with its records instead (see :mod:`.seal`). With ``save_on_each_node`` the local main process
of each machine writes a complete copy on its machine, in the place of rank 0 above (the
"rank 0" files are its own, the ``rank_<r>`` files every rank's; see :mod:`.copies`), and the
copies are sealed together: renamed into place on every machine, or (one failing) withdrawn.

Main process only: scripts written for Accelerate may call ``save_state`` under ``if
accelerator.is_main_process:`` (the diffusers scripts). Given an :class:`Attendance`, rank 0
first finds out through the store, without a collective, whether every rank called it (see
:mod:`accel.distributed.health.attendance`). If not, rank 0 writes the checkpoint alone (the same
atomic directory and manifest) and the manifest's ``meta["absent_rank_states"]`` lists the ranks
whose RNG states and loader positions are not in it; ``load_run`` handles them with one
warning. A rank that called ``save_state`` after rank 0 had gone on alone takes that outcome.
Only for strategies whose full state dicts need no collective (single process, DDP, XLA): for a
run whose state is sharded over every rank (FSDP) rank 0 raises a CheckpointError saying to call
``save_state`` on every process, and a rank that calls it late gets that error too.

Non-blocking (``save_state(blocking=False)``): the same protocol, with the roll call, the
planning and the state dicts' collectives in the foreground; every rank copies its state to
host memory and queues its files; the ranks agree that all could (one collective, so a state
that cannot be stored raises at the call on every rank); the record exchange, the manifest,
the rename and the rotation run on a background thread over a separate gloo group (see
:mod:`.background`). Atomicity is the blocking save's: until the rename there is only the
temporary directory, which no reader takes for a checkpoint.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..._base import tree as _tree
from ..._base.warn import warn_user
from ...distributed import Communicator
from ...distributed.health.attendance import Attendance, Roll
from ...run import rng
from ..sharded.layout import ShardedFiles
from ..storage import CheckpointError, CheckpointWriter, checkpoints_root, temp_dir_for
from .background import BackgroundSaves
from .copies import SavePlan, pick_target, plan_save, refusal, unseen_note
from .seal import Exported, RankPart, finish_save, seal
from .sharded import distributed_state, queue_distributed
from .snapshot import FileQueue, RunSnapshot

__all__ = ["save_run"]

def _on_cpu(state: Any) -> Any:
    """Tensors of ``state`` on the CPU (XLA/CUDA tensors cannot be written directly).

    ``.cpu()`` returns a CPU tensor itself, so CPU state is not copied."""
    return _tree.apply(lambda t: t.detach().cpu(), data=state)


def _model_weights(snap: RunSnapshot, *, tmp: Path, shared: bool) -> list[dict[str, Any]]:
    """The model states a copy's writer (``shared``; rank 0 without ``save_on_each_node``)
    writes, after the save hooks took the ones they save themselves.

    As in Accelerate, hooks run on every rank with every model's state and the directory being
    written (here the temporary one, so that what they write is part of the atomic checkpoint
    and listed in its manifest); an entry a hook pops from ``weights`` is not written by accel.
    """
    if not snap.save_hooks:
        return [snap.model_io.model_state_dict(m) for m in snap.models] if shared else []
    models = list(snap.models)
    weights = [snap.model_io.model_state_dict(m) for m in models]
    for hook in snap.save_hooks:
        hook(models, weights, str(tmp))
    return weights if shared else []


#: What the writer gets of a state: ``_on_cpu`` (a blocking save; CPU tensors as they are) or
#: ``host_copy`` (a non-blocking one: a copy, since training goes on while it is written).
ToHost = Callable[[Any], Any]


def _queue_rank_files(writer: FileQueue, *, snap: RunSnapshot, rank: int,
                      to_host: ToHost = _on_cpu, shared: bool
                      ) -> tuple[ShardedFiles, dict[str, Any]]:
    """Queue this rank's files (``shared``: also the components every rank holds, which a
    copy's writer writes); states are encoded now, files written by the writer's threads.
    Returns the DCP files this rank wrote itself (a run whose state lives in DTensors) and
    this rank's own states (RNG, loader positions) by file stem."""
    sharded = ShardedFiles()
    if distributed_state(snap.model_io):  # every rank takes part in models and optimizers
        sharded = queue_distributed(writer, snap=snap, rank=rank, to_host=to_host)
    elif shared:
        for i, state in enumerate(_model_weights(snap, tmp=writer.tmpdir, shared=True)):
            writer.write_tensors(f"model_{i}.safetensors", to_host(dict(state)))
        for i, opt in enumerate(snap.optimizers):
            writer.write_state(f"optimizer_{i}", to_host(opt.state_dict()))
    else:
        _model_weights(snap, tmp=writer.tmpdir, shared=False)  # the hooks run on every rank
    if shared:
        for i, sched in enumerate(snap.schedulers):
            writer.write_state(f"scheduler_{i}", to_host(sched.state_dict()))
        scaler = snap.scaler.state_dict()
        if scaler:
            writer.write_state("scaler", to_host(scaler))
        for i, obj in enumerate(snap.custom):
            writer.write_state(f"custom_{i}", to_host(obj.state_dict()))
    own = {f"rank_{rank}/rng": to_host(rng.capture(snap.device)),
           f"rank_{rank}/loaders": to_host([loader.state_dict() for loader in snap.loaders])}
    for stem, state in own.items():
        writer.write_state(stem, state)
    return sharded, own


class _Recorder:
    """Records a rank's writes: handed to the writer once every state is copied (the writer's
    threads, hashing, writing and fsyncing, would otherwise compete with the copies for cores
    and memory bandwidth while the training loop waits for them), or, by a rank that does not
    see the checkpoint's directory, to the rank that writes it."""

    def __init__(self, tmpdir: Path) -> None:
        self.tmpdir = tmpdir
        self.calls: Exported = []

    def write_tensors(self, relpath: str, tensors: dict[str, Any]) -> None:
        self.calls.append(("tensors", relpath, tensors))

    def write_state(self, stem: str, state: Any) -> None:
        self.calls.append(("state", stem, state))

    def replay(self, writer: CheckpointWriter) -> None:
        """Queue the recorded files, last first: the small states (loader positions, RNG,
        schedulers) are encoded before the threads writing the big ones (optimizer, models)
        start taking turns with this thread for the GIL."""
        for kind, name, value in reversed(self.calls):
            (writer.write_tensors if kind == "tensors" else writer.write_state)(name, value)


class _RankFiles:
    """This rank's files of one checkpoint, queued at construction (states encoded, tensors
    handed to the writer) and written by the writer's threads, so that one file's hashing and
    fsync overlap another's writing; :meth:`result` waits for them. An error is kept, not
    raised: every rank reports its outcome, so that none is left waiting in a collective.

    ``shared``: this rank writes the components every rank holds (default: rank 0). Without
    ``sees`` (it does not see the temporary directory) nothing is written; ``exported`` holds
    what it would have written, for the rank that writes the checkpoint. ``export``: this
    rank's own states go to ``exported`` too (for the other machines' copies)."""

    def __init__(self, target: Path, token: str, snap: RunSnapshot, rank: int,
                 to_host: ToHost = _on_cpu, *, shared: bool | None = None, sees: bool = True,
                 export: bool = False) -> None:
        self.what = f"rank {rank} could not write its part of {target}"
        self.writer: CheckpointWriter | None = None
        self.sharded = ShardedFiles()
        self.error: CheckpointError | None = None
        self.exported: Exported | None = None
        shared = rank == 0 if shared is None else shared
        try:
            if sees:
                self.writer = CheckpointWriter(target, token)
            if self.writer is not None and to_host is _on_cpu:
                self.sharded, own = _queue_rank_files(self.writer, snap=snap, rank=rank,
                                                      to_host=to_host,
                                                      shared=shared)
            else:  # copies (all of them first), or the files handed to the writing rank
                recorder = _Recorder(temp_dir_for(target, token))
                self.sharded, own = _queue_rank_files(recorder, snap=snap, rank=rank,
                                                      to_host=to_host,
                                                      shared=shared)
                if self.writer is not None:
                    recorder.replay(self.writer)
                else:
                    self.exported = recorder.calls
            if export and self.exported is None:
                self.exported = [("state", stem, state) for stem, state in own.items()]
        except Exception as exc:  # noqa: BLE001 - reported to every rank by the caller
            self.error = CheckpointError(f"{self.what}: {exc}")

    def result(self) -> RankPart | CheckpointError:
        """This rank's records once every queued file is written, or its error. On failure
        the temporary directory is left to rank 0 (other ranks may still write there)."""
        try:
            if self.error is not None:
                return self.error
            if self.writer is None:  # it wrote nothing: its files travel in ``exported``
                return {}, {}
            records = self.writer.wait()  # returns only after every file finished or failed
            return {**records, **self.sharded.records}, self.sharded.headers
        except Exception as exc:  # noqa: BLE001 - reported to every rank by the caller
            return CheckpointError(f"{self.what}: {exc}")
        finally:
            if self.writer is not None:
                self.writer.close()


def _warn_about(comm: Communicator, *, snap: RunSnapshot, output_dir: str | Path | None,
                total_limit: int | None) -> None:
    """Once, on the main process, at the user's save_state() line."""
    if not comm.ctx.is_main_process:
        return
    if output_dir is not None and total_limit is not None:
        warn_user(f"save_state(total_limit={total_limit}) is ignored with an explicit "
                  "output_dir: rotation applies to automatically named checkpoints "
                  "(omit output_dir and set Accelerator(project_dir=...))")
    if not snap.sync_gradients:
        warn_user(f"save_state() in the middle of a gradient accumulation group (micro-"
                  f"step {snap.accumulation_step} of {snap.accumulation_steps}): the "
                  "gradients accumulated so far are not saved, so a run resumed from it is "
                  "not exact; save after the group's optimizer.step()")


def _roll_call(comm: Communicator, attendance: Attendance | None) -> Roll:
    """Whether every rank called save_state (always, without an attendance or a process group)."""
    if attendance is None or not comm.ctx.is_distributed:
        return Roll(number=0, everyone=True)
    if comm.ctx.is_main_process:
        return attendance.convene()
    try:
        return attendance.join()
    except RuntimeError as exc:
        raise CheckpointError(str(exc)) from exc


def _save_alone(snap: RunSnapshot, *, roll: Roll, output_dir: str | Path | None, root: Path | None,
                limit: int | None, world_size: int) -> Path:
    """Rank 0, the others not taking part: the whole checkpoint, rank 0's own states only."""
    if roll.present or roll.timed_out:
        note = (f"ranks {list(roll.present)} called save_state() too, but " if roll.present
                else "")
        warn_user(f"save_state(): {note}{roll.reason}, so the main process saved the "
                  "checkpoint alone (without the other ranks' RNG states and loader "
                  "positions); call save_state() on every rank, or on the main process "
                  "only")
    target, token = pick_target(output_dir, root)
    tmp = temp_dir_for(target, token)
    records = _RankFiles(target, token, snap, 0).result()
    keep = [snap.loaded_dir] if snap.loaded_dir is not None else []
    error = finish_save(tmp, target=target, snap=snap, gathered=[records], world_size=world_size,
                        limit=limit, keep=keep,
                         absent=range(1, world_size))
    if error is not None:
        raise error
    return target


def _follow_main(comm: Communicator, roll: Roll, attendance: Attendance) -> Path:
    """Another rank, rank 0 saving alone: wait until it finished and share its outcome."""
    target, error = attendance.outcome(roll)
    if roll.late:
        warn_user(f"rank {comm.ctx.rank}: save_state() was called here after the main "
                  f"process had started saving alone (it waited for this rank and then "
                  f"went on), so this rank's RNG states and loader positions are not in "
                  f"{target or 'the checkpoint'}")
    if error is not None:
        raise CheckpointError(f"the main process could not save the checkpoint: {error}")
    return Path(target)


def _main_alone(snap: RunSnapshot, *, roll: Roll, attendance: Attendance,
                output_dir: str | Path | None, root: Path | None, limit: int | None,
                world_size: int) -> Path:
    """Rank 0, the others not coming: save alone and tell the ranks that arrive late how it
    went; refused for state sharded over every rank (FSDP), which rank 0 alone cannot read."""
    target, error = Path(), "interrupted"
    try:
        if distributed_state(snap.model_io):
            raise CheckpointError(
                f"save_state() was called on the main process only ({roll.reason}), but this "
                "run's model and optimizer state is sharded over every process (FSDP): call "
                "save_state() on every process, not under `if accelerator.is_main_process:` "
                "(each process writes only its own shards)")
        target = _save_alone(snap, roll=roll, output_dir=output_dir, root=root, limit=limit,
                             world_size=world_size)
        error = ""
    except BaseException as exc:  # told to the ranks that wait for it, then re-raised
        error = str(exc) or type(exc).__name__
        raise
    finally:
        attendance.finish(roll, str(target), error or None)
    return target


def _rotation(output_dir: str | Path | None, *, total_limit: int | None,
              project_dir: str | Path | None, project_total_limit: int | None
              ) -> tuple[Path | None, int | None]:
    """Where automatically named checkpoints go (None: ``output_dir`` is used, not rotated)
    and how many of them are kept."""
    if output_dir is not None:
        return None, None
    if project_dir is None:
        raise ValueError("save_state() without output_dir needs Accelerator(project_dir="
                         "...) (checkpoints go to <project_dir>/checkpoints/checkpoint_<n>)")
    return checkpoints_root(project_dir), \
        total_limit if total_limit is not None else project_total_limit


def _refuse_dcp(snap: RunSnapshot) -> None:
    """Sharded (DCP) state is written by collectives that need the training group for the
    whole write; the same on every rank, so every rank raises here."""
    if distributed_state(snap.model_io) and getattr(snap.model_io, "sharded_state", False):
        raise CheckpointError(
            "save_state(blocking=False) cannot save FSDP's SHARDED_STATE_DICT: torch's DCP "
            "writes the shards with collectives on the training process group; call "
            "save_state() (blocking), or use StateDictType.FULL_STATE_DICT, whose state is "
            "gathered in the foreground and written by the main process in the background")


def _rank_files(plan: SavePlan, *, snap: RunSnapshot, rank: int, to_host: ToHost = _on_cpu
                ) -> _RankFiles:
    """This rank's part of the save ``plan`` describes."""
    token = plan.copies[plan.mine if plan.mine is not None else plan.machine].token
    return _RankFiles(plan.target, token, snap, rank, to_host, shared=plan.writes_shared(rank),
                      sees=plan.mine is not None, export=plan.each_node)


def _warn_unseen(comm: Communicator, *, plan: SavePlan, mines: list[int | None],
                 background: BackgroundSaves | None) -> None:
    """The main process, once: ranks that did not see the checkpoint's directory (at the
    user's save_state line)."""
    note = unseen_note(plan, mines)
    if note is not None and comm.ctx.is_main_process and \
            (background is None or background.once("unseen")):
        warn_user(note)


def _warn_alone(roll: Roll, *, blocking: bool, each_node: bool,
                background: BackgroundSaves | None) -> None:
    """The main process saving alone: what it cannot do then (at the user's save_state line)."""
    if not blocking and background is not None and background.once("alone"):
        warn_user("save_state(blocking=False) on the main process alone (" + roll.reason
                  + ") blocks: the background part needs every rank; call save_state() "
                  "on every rank to save without blocking")
    if each_node and (background is None or background.once("each_node")):
        warn_user("ProjectConfiguration(save_on_each_node=True) is not applied to this "
                  f"save: save_state() was called on the main process only ({roll.reason}),"
                  " so only this machine gets the checkpoint; call save_state() on every "
                  "process so that each machine's local main process writes its copy")


def _save_in_background(comm: Communicator, *, snap: RunSnapshot, plan: SavePlan,
                        limit: int | None, background: BackgroundSaves) -> Path:
    """Every rank: copy its state to host memory and queue its files (foreground, with every
    collective of the state dicts), agree that all ranks could (a state that cannot be stored
    raises now, on every rank), and leave the rest to the background thread."""
    try:
        _refuse_dcp(snap)
    except CheckpointError:
        if plan.copies[plan.machine].writer == comm.ctx.rank:  # it created the directory
            shutil.rmtree(plan.copies[plan.machine].tmpdir, ignore_errors=True)
        raise
    side = background.side_group(comm)  # collective the first time: every rank is here
    part = _rank_files(plan, snap=snap, rank=comm.ctx.rank, to_host=background.host_copy)
    agreed = comm.gather_object([(part.error is None, plan.mine)])
    mines = [mine for _ok, mine in agreed]
    if not all(ok for ok, _mine in agreed) or refusal(
            plan, mines=mines, distributed=distributed_state(snap.model_io), sharded=False):
        error = seal(comm.gather_object, share=comm.broadcast_object_list, comm=comm, snap=snap,
                     plan=plan, part=part,
                     limit=limit)
        raise error or CheckpointError(f"a rank could not queue its part of {plan.target}")
    _warn_unseen(comm, plan=plan, mines=mines, background=background)

    def gather(obj: list[Any]) -> list[Any]:
        return comm.gather_object(obj, group=side)

    def share(outcome: list[Any]) -> list[Any]:
        return gather(outcome)[:1]  # rank 0's

    background.start(plan.target, lambda: seal(gather, share=share, comm=comm, snap=snap, plan=plan,
                                               part=part, limit=limit))
    return plan.target


def save_run(comm: Communicator, *, snap: RunSnapshot, output_dir: str | Path | None,
             total_limit: int | None, project_dir: str | Path | None,
             project_total_limit: int | None, attendance: Attendance | None = None,
             blocking: bool = True, background: BackgroundSaves | None = None,
             save_on_each_node: bool = False) -> Path:
    """Write a checkpoint of ``snap`` from every rank; returns its directory (on this rank's
    machine).

    Call it on every rank, or, given ``attendance``, on the main process only (then rank 0
    writes everything it can alone; see the module's docstring). Without ``output_dir`` the
    checkpoint is ``<project_dir>/checkpoints/checkpoint_<n+1>`` and at most ``total_limit``
    (else ``project_total_limit``) complete ones are kept, never the new one nor
    ``snap.loaded_dir``. Any rank's failure raises on every rank that called it; no rank is
    left waiting in a collective. Warnings point at the caller of the function that calls this
    one (the facade's ``save_state``).

    ``blocking=False`` (every rank; given ``background``, which this call first waits on)
    returns once this rank's state is copied to host memory and its files are queued; the
    checkpoint appears, complete, when ``background`` finishes (see :mod:`.background`), and
    an error there is raised by ``background.wait()``. On the main process alone it blocks (one
    warning). FSDP's SHARDED_STATE_DICT is refused (its DCP write needs the training group).

    ``save_on_each_node`` (Accelerate's ``ProjectConfiguration`` flag): each machine's local
    main process writes a complete copy, on its machine (see :mod:`.copies`); on the main
    process alone (see above) it cannot, and says so.

    Raises:
        ValueError: neither ``output_dir`` nor ``project_dir`` was given.
        CheckpointError: a rank could not write its part, or the checkpoint could not be sealed
            (or, first, the save ``background`` was finishing failed).
    """
    if background is not None:
        background.wait()  # one save in flight at most; its failure raises here
    elif not blocking:
        raise ValueError("save_run(blocking=False) needs background=BackgroundSaves() (the "
                         "run's, which the next save and load wait for)")
    _warn_about(comm, snap=snap, output_dir=output_dir, total_limit=total_limit)
    root, limit = _rotation(output_dir, total_limit=total_limit, project_dir=project_dir,
                            project_total_limit=project_total_limit)
    ctx = comm.ctx
    roll = _roll_call(comm, attendance)
    if not roll.everyone and attendance is not None:
        if not ctx.is_main_process:
            return _follow_main(comm, roll, attendance)
        _warn_alone(roll, blocking=blocking, each_node=save_on_each_node, background=background)
        return _main_alone(snap, roll=roll, attendance=attendance, output_dir=output_dir, root=root,
                           limit=limit, world_size=ctx.world_size)
    plan = plan_save(comm, output_dir=output_dir, root=root, blocking=blocking,
                     each_node=save_on_each_node)
    if not plan.blocking and background is not None:
        return _save_in_background(comm, snap=snap, plan=plan, limit=limit, background=background)
    part = _rank_files(plan, snap=snap, rank=ctx.rank)
    error = seal(comm.gather_object, share=comm.broadcast_object_list, comm=comm, snap=snap,
                 plan=plan, part=part, limit=limit,
                 say=lambda mines: _warn_unseen(comm, plan=plan, mines=mines,
                                                background=background))
    if error is not None:
        raise error
    return plan.target
