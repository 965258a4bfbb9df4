"""Where ``hvd.elastic`` commits live, so that restarted workers find them.

When a worker is lost, torchrun's agent restarts the whole worker group: the survivors' memory
is gone with them. So ``state.commit()`` writes the committed state to disk, as an accel
checkpoint directory (atomic: temporary sibling, fsynced files, manifest last, rename; no
pickle), one per rank::

    <ACCEL_ELASTIC_DIR or <temp dir>/accel-elastic-<user>>/
        run-<torchrun run id>/rank_<r>/checkpoint_<n>     n = the commit's number

Each rank keeps only its newest complete commit (the previous one is removed after the new one
is complete). After a restart every rank scans the run's directory for the newest complete
commit it can see (a rank of another machine may see other ones), and the rank holding the
newest one loads it and sends it to the others (:func:`accel.horovod.elastic.run`). Outside
torchrun there are no restarts: the directory is private to the process (host and pid).

Example:
    >>> import tempfile, torch
    >>> store = CommitStore(Path(tempfile.mkdtemp()) / "run-x", rank=0)
    >>> path = store.write(0, {"objects": {"epoch": 2}}, world_size=1)
    >>> store.newest() == (0, path), store.read(path, ["objects"])
    (True, {'objects': {'epoch': 2}})
    >>> store.remove_all(); store.newest() is None
    True
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ...checkpoint.storage import (
    CheckpointError,
    CheckpointWriter,
    latest_complete,
    read_state,
    rotate,
)
from ...checkpoint.storage.naming import checkpoint_number
from ...env import EnvSettings, LaunchInfo

__all__ = ["CommitStore", "commit_root"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_STEM = "commit"  # commit.json (+ commit.safetensors) in each commit directory


def commit_root(settings: EnvSettings, launch: LaunchInfo) -> Path:
    """The directory of this job's commits (see the module docstring)."""
    base = Path(settings.elastic_dir) if settings.elastic_dir else (
        Path(tempfile.gettempdir()) / f"accel-elastic-{_UNSAFE.sub('_', getpass.getuser())}")
    if launch.launcher == "torchrun" and launch.run_id:
        return base / f"run-{_UNSAFE.sub('_', launch.run_id)}"
    # no agent restarts the workers: nobody else will read this process's commits
    return base / f"{launch.launcher}-{_UNSAFE.sub('_', socket.gethostname())}-{os.getpid()}"


class CommitStore:
    """One rank's view of a job's commit directory (``root``)."""

    def __init__(self, root: Path, rank: int) -> None:
        self.root = Path(root)
        self.rank = rank
        # the previous commit is removed in the background once the new one is complete (a
        # third of a commit's time is unlinking big files); the next commit waits for it
        self._cleaner = ThreadPoolExecutor(1, thread_name_prefix="accel-elastic-rotate")
        self._cleaning: Future[list[Path]] | None = None

    def settle(self) -> None:
        """Wait until the previous commit is removed (raises what the removal raised)."""
        if self._cleaning is not None:
            cleaning, self._cleaning = self._cleaning, None
            cleaning.result()  # raises what the removal raised

    @property
    def mine(self) -> Path:
        return self.root / f"rank_{self.rank}"

    def write(self, number: int, components: Mapping[str, Any], world_size: int) -> Path:
        """Write commit ``number`` (``components``: file stem -> nested state) atomically."""
        try:
            self.mine.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(f"hvd.elastic cannot create its commit directory {self.mine}: {exc}; "
                          "set ACCEL_ELASTIC_DIR to a writable directory (node-local storage "
                          "survives a worker restart; a shared file system also survives a "
                          "lost machine)") from exc
        self.settle()
        writer = CheckpointWriter(self.mine / f"checkpoint_{number}")
        try:
            # one JSON + one safetensors file for everything: each file costs an fsync
            writer.write_state(_STEM, dict(components))
            path = writer.finalize(step=number, world_size=world_size,
                                   meta={"hvd_elastic_commit": number, "rank": self.rank})
        except BaseException:
            writer.abort()
            raise
        self._cleaning = self._cleaner.submit(rotate, self.mine, 1)
        return path

    def newest(self) -> tuple[int, Path] | None:
        """The complete commit with the highest number in any rank's directory, or None."""
        best: tuple[int, Path] | None = None
        if not self.root.is_dir():
            return None
        for entry in self.root.iterdir():
            if not entry.name.startswith("rank_") or not entry.is_dir():
                continue
            path = latest_complete(entry)
            number = checkpoint_number(path) if path is not None else None
            if path is not None and number is not None and (best is None or number > best[0]):
                best = (number, path)
        return best

    def own_newest(self) -> tuple[int, Path] | None:
        """This rank's own newest complete commit, or None."""
        path = latest_complete(self.mine)
        number = checkpoint_number(path) if path is not None else None
        return None if path is None or number is None else (number, path)

    @staticmethod
    def read(path: Path, stems: Iterable[str]) -> dict[str, Any]:
        """The components ``stems`` of the commit at ``path`` (verified, pickle-free)."""
        stored = read_state(path, _STEM)
        missing = sorted(set(stems) - set(stored))
        if missing:
            raise CheckpointError(f"the commit {path} has no {missing} (it has {sorted(stored)}); "
                                  "was it written by a state with other attributes? Give the "
                                  "restarted workers the same TorchState(...) arguments",
                                  path=path)
        return {stem: stored[stem] for stem in stems}

    def remove_mine(self) -> None:
        self.settle()
        if self.mine.exists():
            shutil.rmtree(self.mine)

    def remove_all(self) -> None:
        """Remove the job's directory (other machines' ranks may be removing theirs too)."""
        shutil.rmtree(self.root, ignore_errors=True)
