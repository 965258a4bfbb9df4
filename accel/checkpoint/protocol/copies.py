"""Where a checkpoint's files go: one directory that the ranks share, or a copy per machine.

Without ``save_on_each_node`` (the default) rank 0 picks the checkpoint directory and a token,
creates the temporary directory and broadcasts both; every rank that sees that temporary
directory writes its own files into it. A rank that does not see it (its machine does not share
rank 0's filesystem) writes nothing there: it hands its RNG states and loader positions to rank
0 with its file records, and rank 0 writes them, so the checkpoint on rank 0's machine is
complete (and the main process says, once, that the other machines have none).

With ``ProjectConfiguration(save_on_each_node=True)`` (Accelerate's name) the local main process
of every machine proposes a copy: its own ``output_dir``, or ``checkpoint_<n>`` under its own
``project_dir`` with ``n`` agreed by all machines (the highest next number, so that the copies
have the same name and no copy replaces another save's). Each creates its temporary directory;
then every rank looks, at its machine's target, for the temporary directory of the lowest
proposer whose copy lands there, and writes its own files into it. Machines that share a
filesystem (and the same path) thus find out that they write one directory, and only the
lowest of their local main processes writes it, as without the flag. Each copy is complete:
every rank also hands its RNG states and loader positions to the writers of the copies it does
not write into. The models, optimizers, schedulers, scaler and registered objects of a copy are
its writer's, as in Accelerate, where each local main process saves its own.

Example:
    >>> plan = SavePlan(copies=(Copy(writer=0, target=Path("ckpt"), token="ab12"),),
    ...                 machine=0, mine=0, blocking=True, each_node=False)
    >>> plan.target, plan.writes_shared(0), plan.active([0, 0, None])
    (PosixPath('ckpt'), True, [0])
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._base.warn import warn_user
from ...distributed import Communicator
from ...distributed.nodes import node_partition
from ..storage import (
    CheckpointError,
    checkpoint_number,
    new_token,
    next_checkpoint_name,
    temp_dir_for,
)

__all__ = ["Copy", "SavePlan", "pick_target", "plan_save", "refusal", "unseen_note"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Copy:
    """One directory of a checkpoint: the rank that writes and seals it, where, and its token."""

    writer: int
    target: Path  # as the writer names it (on the writer's machine)
    token: str

    @property
    def tmpdir(self) -> Path:
        return temp_dir_for(self.target, self.token)


@dataclass(frozen=True, kw_only=True, slots=True)
class SavePlan:
    """Every proposed copy (ordered by writer rank), and this rank's place among them.

    ``machine``: the copy proposed by this rank's machine (its local main process; rank 0's
    without ``save_on_each_node``). ``mine``: the copy whose temporary directory this rank
    writes into (found at its machine's target), or None when it sees none.
    """

    copies: tuple[Copy, ...]
    machine: int
    mine: int | None
    blocking: bool
    each_node: bool

    @property
    def target(self) -> Path:
        """The checkpoint directory on this rank's machine (what ``save_state`` returns)."""
        return self.copies[self.machine].target

    @property
    def tmpdir(self) -> Path:
        """This rank's temporary directory (the one it writes into, when it sees it)."""
        token = self.copies[self.mine if self.mine is not None else self.machine].token
        return temp_dir_for(self.target, token)

    @property
    def save_id(self) -> str:
        """The same on every copy of this save (for ``load_state``'s check across ranks)."""
        return self.copies[0].token

    def writes_shared(self, rank: int) -> bool:
        """Whether ``rank`` writes the shared components of the copy it writes into."""
        return self.mine is not None and self.copies[self.mine].writer == rank

    def active(self, mines: Sequence[int | None]) -> list[int]:
        """The copies that are written (their writer writes into them), from every rank's
        ``mine`` (index = rank)."""
        return [i for i, copy in enumerate(self.copies) if mines[copy.writer] == i]


def pick_target(output_dir: str | Path | None, root: Path | None) -> tuple[Path, str]:
    """The checkpoint directory (``output_dir``, else the next name under ``root``), its
    parent created, and a fresh temp token."""
    try:
        target = next_checkpoint_name(root) if root is not None else Path(str(output_dir))
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot create the checkpoint directory's parent: {exc}") from exc
    return target, new_token()


def _create(copy: Copy) -> CheckpointError | None:
    try:
        copy.target.parent.mkdir(parents=True, exist_ok=True)
        copy.tmpdir.mkdir()
    except OSError as exc:
        return CheckpointError(f"cannot create the checkpoint directory {copy.tmpdir}: {exc}",
                               path=copy.tmpdir)
    return None


def _warn_blocking(comm: Communicator, *, asked: bool, agreed: bool) -> None:
    if agreed != asked:
        warn_user(f"rank {comm.ctx.rank}: save_state(blocking={asked}) differs from the "
                  f"main process's blocking={agreed}, which every rank follows; pass the "
                  "same value on every rank")


def _plan_shared(comm: Communicator, *, output_dir: str | Path | None, root: Path | None,
                 blocking: bool) -> SavePlan:
    """Rank 0 picks and creates the directory; a failure there raises on every rank."""
    plan: list[Any] = [None, None, blocking]
    if comm.ctx.is_main_process:
        try:
            target, token = pick_target(output_dir, root)
            error = _create(Copy(writer=0, target=target, token=token))
            plan = [error or str(target), token, blocking]
        except CheckpointError as exc:  # sent to every rank so that none waits in a collective
            plan = [exc, None, blocking]
    target_s, token, agreed = comm.broadcast_object_list(plan)
    if isinstance(target_s, Exception):
        raise target_s
    _warn_blocking(comm, asked=blocking, agreed=bool(agreed))
    copy = Copy(writer=0, target=Path(target_s), token=token)
    return SavePlan(copies=(copy,), machine=0, mine=0 if copy.tmpdir.is_dir() else None,
                    blocking=bool(agreed), each_node=False)


def _proposal(output_dir: str | Path | None, root: Path | None) -> Any:
    """A local main process: (where, next checkpoint number or None, token), or its error."""
    try:
        target, token = pick_target(output_dir, root)
    except CheckpointError as exc:
        return exc
    number = checkpoint_number(target) if root is not None else None
    return (str(root if root is not None else target), number, token)


def _copies(proposals: Sequence[Any]) -> tuple[Copy, ...]:
    """Every machine's copy, the automatic names agreed (the highest next number)."""
    numbers = [p[1] for p in proposals if p is not None and p[1] is not None]
    name = f"checkpoint_{max(numbers)}" if numbers else None
    return tuple(Copy(writer=rank, target=Path(p[0]) / name if name else Path(p[0]), token=p[2])
                 for rank, p in enumerate(proposals) if p is not None)


def _machines(layout: Sequence[tuple[int, str]], copies: Sequence[Copy]) -> list[int]:
    """Each rank's machine copy (index into ``copies``): the one its machine's local main
    process proposed (machines as :func:`accel.distributed.nodes.node_partition` finds them)."""
    by_writer = {copy.writer: i for i, copy in enumerate(copies)}
    machine = [-1] * len(layout)
    for ranks in node_partition(layout):
        mains = [r for r in ranks if r in by_writer]
        if len(mains) != 1:
            raise CheckpointError(
                f"save_on_each_node: the processes {ranks} of one machine have {len(mains)} "
                f"local main processes (local rank 0: {mains}); expected one. Check the "
                "launcher's LOCAL_RANK and node rank (GROUP_RANK) variables")
        for rank in ranks:
            machine[rank] = by_writer[mains[0]]
    return machine


def _plan_each_node(comm: Communicator, *, output_dir: str | Path | None, root: Path | None,
                    blocking: bool) -> SavePlan:
    """Every local main process proposes its copy; all agree; each creates its temporary
    directory; then every rank finds the copy it writes into (see the module's docstring)."""
    ctx = comm.ctx
    mine_prop = _proposal(output_dir, root) if ctx.is_local_main_process else None
    gathered = comm.gather_object([(ctx.node_rank, socket.gethostname(), mine_prop, blocking)])
    errors = [g[2] for g in gathered if isinstance(g[2], Exception)]
    if errors:
        raise errors[0]
    copies = _copies([g[2] for g in gathered])
    if not copies:
        raise CheckpointError("save_on_each_node: no process has local rank 0, so no machine "
                              "has a local main process to write its copy; check LOCAL_RANK")
    machine = _machines([(int(g[0]), str(g[1])) for g in gathered], copies)[ctx.rank]
    own = copies[machine]
    created = _create(own) if own.writer == ctx.rank else None
    failed = [e for e in comm.gather_object([created]) if e is not None]  # also the barrier
    if failed:
        if own.writer == ctx.rank and created is None:
            own.tmpdir.rmdir()  # empty: nothing was written yet
        raise failed[0]
    agreed = bool(gathered[0][3])
    _warn_blocking(comm, asked=blocking, agreed=agreed)
    mine = next((i for i in range(machine + 1)
                 if temp_dir_for(own.target, copies[i].token).is_dir()), None)
    return SavePlan(copies=copies, machine=machine, mine=mine, blocking=agreed, each_node=True)


def plan_save(comm: Communicator, *, output_dir: str | Path | None, root: Path | None,
              blocking: bool, each_node: bool) -> SavePlan:
    """Every rank: where this save writes (see the module's docstring). The main process's
    ``blocking`` holds on every rank (one warning on a rank that asked otherwise).

    Raises:
        CheckpointError: on every rank, when a directory could not be created.
    """
    if each_node:
        return _plan_each_node(comm, output_dir=output_dir, root=root, blocking=blocking)
    return _plan_shared(comm, output_dir=output_dir, root=root, blocking=blocking)


def refusal(plan: SavePlan, *, mines: Sequence[int | None], distributed: bool, sharded: bool
            ) -> CheckpointError | None:
    """The error every rank raises when this run's state cannot reach every copy: state
    sharded over every rank (FSDP) is complete only in the copy that every rank writes into,
    sealed by rank 0 (FULL_STATE_DICT: only rank 0 holds the full state)."""
    if not distributed:
        return None
    active = plan.active(mines)
    several = len(active) > 1 or plan.copies[active[0]].writer != 0 if active else True
    unseen = sorted(r for r, m in enumerate(mines) if m != (active[0] if active else None))
    if not several and not (sharded and unseen):
        return None
    why = (f"with save_on_each_node each machine writes its own copy ({len(active)} copies, "
           "no shared filesystem)" if several else
           f"ranks {unseen} do not see {plan.copies[0].target} (no shared filesystem)")
    return CheckpointError(
        f"save_state(): {why}, but this run's model and optimizer state is sharded over every "
        "process (FSDP): " + ("each process writes its own shards into the checkpoint "
                              "(SHARDED_STATE_DICT)" if sharded else
                              "only the main process gathers the full state (FULL_STATE_DICT)")
        + ", so no machine's checkpoint would be complete. Save it to a filesystem that every "
        "machine sees; to have the weights on every machine, call accelerator.save_model("
        "model, directory) on every process with save_on_each_node=True")


def unseen_note(plan: SavePlan, mines: Sequence[int | None]) -> str | None:
    """Without ``save_on_each_node``: the main process's one warning when ranks did not see
    the checkpoint's directory (None: every rank saw it)."""
    unseen = [r for r, m in enumerate(mines) if m is None]
    if plan.each_node or not unseen:
        return None
    return (f"save_state(): ranks {unseen} do not see {plan.target} (their machines do not "
            "share this filesystem), so the main process wrote their RNG states and loader "
            "positions into it: the checkpoint is complete on this machine only. To resume on "
            "every machine, set ProjectConfiguration(save_on_each_node=True) (each machine's "
            "local main process then writes its own copy), or copy the checkpoint there")
