"""Automatic checkpoint names (``checkpoint_<n>``), the newest complete one, and rotation.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> root = checkpoints_root(tempfile.mkdtemp())
    >>> next_checkpoint_name(root).name
    'checkpoint_0'
    >>> latest_complete(root) is None
    True
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from .format import OLD_PREFIX, TEMP_PREFIX, remove_checkpoint
from .reader import is_complete

__all__ = ["checkpoint_number", "checkpoints_root", "complete_checkpoints", "latest_complete",
           "next_checkpoint_name", "rotate"]

_NAME = re.compile(r"checkpoint_(\d+)")
_LEFTOVER = re.compile(rf"(?:{re.escape(TEMP_PREFIX)}|{re.escape(OLD_PREFIX)})"
                       r"checkpoint_(\d+)-[0-9A-Za-z]+")


def checkpoints_root(project_dir: str | Path) -> Path:
    """Where automatically named checkpoints live: ``project_dir/checkpoints``."""
    return Path(project_dir) / "checkpoints"


def checkpoint_number(path: str | Path) -> int | None:
    """``n`` for a directory named ``checkpoint_<n>``, else None."""
    match = _NAME.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def _numbered(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        number = checkpoint_number(entry)
        if number is not None and entry.is_dir():
            found.append((number, entry))
    return sorted(found)


def next_checkpoint_name(root: str | Path) -> Path:
    """``root/checkpoint_<n+1>`` after the highest existing number (complete or not), or ``_0``."""
    numbered = _numbered(Path(root))
    return Path(root) / f"checkpoint_{numbered[-1][0] + 1 if numbered else 0}"


def complete_checkpoints(root: str | Path) -> list[Path]:
    """Complete ``checkpoint_<n>`` directories, oldest first (incomplete and temp ones skipped)."""
    return [path for _n, path in _numbered(Path(root)) if is_complete(path)]


def latest_complete(root: str | Path) -> Path | None:
    """The complete checkpoint with the highest number, or None when there is none."""
    for _n, path in reversed(_numbered(Path(root))):
        if is_complete(path):
            return path
    return None


def _clean_leftovers(root: Path, newest: int) -> list[Path]:
    removed = []
    for entry in root.iterdir():
        match = _LEFTOVER.fullmatch(entry.name)
        if match and int(match.group(1)) <= newest and entry.is_dir():
            shutil.rmtree(entry)
            removed.append(entry)
    return removed


def rotate(root: str | Path, total_limit: int | None, keep: Iterable[str | Path] = ()
           ) -> list[Path]:
    """Delete the oldest complete checkpoints so that at most ``total_limit`` remain.

    Never deletes the newest complete checkpoint, anything in ``keep`` (e.g. the one just
    loaded), or a directory that is not a complete checkpoint. Temporary leftovers of
    interrupted saves numbered up to the newest complete checkpoint are removed too (a save in
    progress always writes a higher number). Call it only after the new checkpoint is complete,
    from one process.

    Returns:
        The directories deleted.

    Example:
        >>> import tempfile
        >>> rotate(Path(tempfile.mkdtemp()), total_limit=2)
        []
    """
    root = Path(root)
    if total_limit is not None and (isinstance(total_limit, bool) or total_limit < 1):
        raise ValueError(f"total_limit must be an int >= 1 or None, got {total_limit!r}")
    complete = complete_checkpoints(root)
    if not complete:
        return []
    newest = complete[-1]
    removed = _clean_leftovers(root, checkpoint_number(newest) or 0)
    if total_limit is None:
        return removed
    protected = {Path(p).resolve() for p in keep} | {newest.resolve()}
    excess = len(complete) - total_limit
    for path in complete[:-1]:
        if excess <= 0:
            break
        if path.resolve() in protected:
            continue
        remove_checkpoint(path)
        removed.append(path)
        excess -= 1
    return removed
