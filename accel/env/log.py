"""Logging that prints once per job by default, per rank on request, and never calls a collective.

``get_logger(name)`` returns a :class:`MultiProcessAdapter` around ``logging.getLogger(name)``.
Which process is the main one is read from the launcher's environment (``accel.env.detect_launch``)
at each call, so a logger created at import time of a script — before any ``Accelerator`` exists,
or in the parent of a forked worker — still knows its rank when it logs.

- ``logger.info(msg)``: printed by rank 0 only.
- ``logger.info(msg, main_process_only=False)``: printed by every rank as ``[rank N] msg``.
- ``logger.info(msg, in_order=True)``: printed by every rank as ``[rank N] msg``, in local-rank
  order within each node (see :class:`MultiProcessAdapter` for the exact guarantee).

Like the standard library (and Accelerate), accel adds no handler: call ``logging.basicConfig``
(or configure handlers) to see INFO records. The level comes from ``log_level``, else from the
``ACCEL_LOG_LEVEL`` environment variable, else the logger's existing level.

Example:
    >>> import logging
    >>> logger = get_logger("my_script", log_level="INFO")
    >>> logger.getEffectiveLevel() == logging.INFO
    True
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from . import LaunchInfo

__all__ = ["MultiProcessAdapter", "get_logger", "main_print", "resolve_level"]

_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET")
DEFAULT_IN_ORDER_TIMEOUT = 30.0


def resolve_level(level: str | int | None) -> int | None:
    """Turn ``"info"``, ``"INFO"``, ``"20"`` or ``20`` into a ``logging`` level number.

    Raises:
        ValueError: the name is not a standard level name or an integer.

    Example:
        >>> resolve_level("debug"), resolve_level(None)
        (10, None)
    """
    if level is None or isinstance(level, int):
        return level
    text = str(level).strip().upper()
    if text.lstrip("-").isdigit():
        return int(text)
    if text == "WARN":
        text = "WARNING"
    if text not in _LEVELS:
        raise ValueError(
            f"unknown log level {level!r}; expected one of {', '.join(_LEVELS)} or an integer "
            "(check get_logger(log_level=...) and the ACCEL_LOG_LEVEL environment variable)"
        )
    return int(logging.getLevelName(text))


def _detect() -> LaunchInfo:
    from . import detect_launch  # stdlib only; imported on use

    return detect_launch()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _process_start_time(stat_file: str = "/proc/self/stat") -> float | None:
    """Wall-clock time this process started (Linux ``/proc``), or None where unknown.

    ``stat_file`` is another process's or thread's ``stat`` file (``/proc/<pid>/stat``) in
    tests. The one OS internal of the in-order turn files, which stay here in L1 (logging works
    without torch and before any process group, so it cannot use accel/distributed/health);
    tests/unit/distributed/health/test_pins.py pins the field against this kernel.
    """
    try:
        stat = Path(stat_file).read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: start time after boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - age


@dataclass(kw_only=True, slots=True)
class _Turn:
    """One ``in_order`` message's place in the per-node sequence, kept in small files.

    Every process of a node owns ``<dir>/local-<local_rank>`` holding ``"pid count"``: how many
    in-order messages it has emitted. Local rank ``l`` emits its ``n``-th message once local rank
    ``l - 1`` has recorded its ``n``-th, then records ``n``. A predecessor's file counts if its
    process is alive, or (it finished early) if the file was written after this process started;
    files left by an earlier job with the same rendezvous address are thereby ignored. No
    collective, no lock: each file has one writer and is replaced atomically.
    """

    directory: Path
    local_rank: int
    timeout: float
    previous: int = field(init=False, default=0)

    def _file(self, local_rank: int) -> Path:
        return self.directory / f"local-{local_rank}"

    def _read(self, local_rank: int) -> tuple[int, int, float] | None:
        path = self._file(local_rank)
        try:
            pid, count = path.read_text().split()
            return int(pid), int(count), path.stat().st_mtime
        except (FileNotFoundError, ValueError):  # absent (or replaced between read and stat)
            return None

    def _predecessor_count(self, started: float | None) -> int:
        entry = self._read(self.local_rank - 1)
        if entry is None:
            return 0
        pid, count, written = entry
        current = _alive(pid) or (started is not None and written >= started)
        return count if current else 0

    def wait(self) -> bool:
        """Wait for this message's turn; False when ``timeout`` passed first (print anyway)."""
        own = self._read(self.local_rank)
        self.previous = own[1] if own is not None and own[0] == os.getpid() else 0
        if self.local_rank == 0:
            return True
        started = _process_start_time()
        deadline = time.monotonic() + self.timeout
        delay = 0.002
        while self._predecessor_count(started) <= self.previous:
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)  # polling a file the predecessor writes, not a guess at order
            delay = min(delay * 2, 0.05)
        return True

    def done(self) -> None:
        """Record that this process emitted one more in-order message (atomic replace)."""
        path = self._file(self.local_rank)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(f"{os.getpid()} {self.previous + 1}")
        os.replace(tmp, path)


def _turn_directory(info: LaunchInfo) -> Path:
    """A per-user, per-job, per-node directory every local rank derives identically."""
    job = "|".join(str(v) for v in (info.launcher, info.master_addr, info.master_port,
                                     info.world_size, info.restart_count, info.node_rank))
    uid = os.getuid() if hasattr(os, "getuid") else 0
    digest = hashlib.sha1(f"{uid}|{job}".encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"accel-log-{digest}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


# LoggerAdapter is generic only in the stubs: subscripting it fails at run time before 3.11.
class MultiProcessAdapter(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A ``logging.LoggerAdapter`` that knows which rank it runs on.

    Every method (``debug``/``info``/``warning``/``error``/``exception``/``critical``/``log``)
    takes two extra keyword arguments:

    - ``main_process_only`` (default True): emit on rank 0 only. With False, every rank emits,
      prefixed ``[rank N]``.
    - ``in_order`` (default False): every rank emits, prefixed ``[rank N]``, one after the other
      in local-rank order within each node (``main_process_only`` is then ignored). Guarantee:
      on one node, local rank ``l``'s ``n``-th in-order message is emitted (handed to the
      handlers, which flush) after local rank ``l - 1``'s ``n``-th. It uses small files in the
      temporary directory, never a collective, so nodes are not ordered relative to each other.
      Every rank must make the same sequence of in-order calls (as with collectives); if a
      predecessor has not emitted its message within ``in_order_timeout`` seconds, the message
      is emitted anyway, after a warning saying so — a slow or diverging rank delays, never hangs.

    Records point at the line that called the logger. ``stacklevel=`` is passed on as given
    and counts this adapter's frame (as Accelerate's adapter does): 2 is that line, so a
    wrapper of this adapter passes 3 to report its own caller.

    Example:
        >>> logger = get_logger("train")
        >>> logger.info("starting", main_process_only=False)  # "[rank 0] starting" on rank 0
    """

    def __init__(
        self,
        logger: logging.Logger,
        extra: dict[str, Any] | None = None,
        *,
        in_order_timeout: float = DEFAULT_IN_ORDER_TIMEOUT,
        launch_info: Callable[[], LaunchInfo] | None = None,
    ) -> None:
        super().__init__(logger, extra or {})
        if in_order_timeout < 0:
            raise ValueError(f"in_order_timeout must be >= 0 seconds, got {in_order_timeout}")
        self.in_order_timeout = in_order_timeout
        self._launch_info = launch_info or _detect
        self._warned: set[str] = set()

    # exc_info/stack_info/stacklevel/extra pass through **kwargs rather than being spelt out as
    # in the stub's LoggerAdapter.log, which mypy counts as an incompatible override.
    def log(  # type: ignore[override]
        self,
        level: int,
        msg: object,
        *args: Any,
        main_process_only: bool = True,
        in_order: bool = False,
        **kwargs: Any,
    ) -> None:
        if not self.isEnabledFor(level):
            return
        info = self._launch_info()
        everywhere = in_order or not main_process_only
        if not everywhere and info.rank != 0:
            return
        if everywhere:
            msg = f"[rank {info.rank}] {msg}"
        turn = None
        if in_order and info.local_world_size > 1:
            turn = _Turn(directory=_turn_directory(info), local_rank=info.local_rank,
                         timeout=self.in_order_timeout)
            if not turn.wait():
                self.logger.warning(
                    "[rank %d] in_order: local rank %d had not logged its matching in-order "
                    "message within %.0f s; logging out of order (do all ranks make the same "
                    "in_order calls?)", info.rank, info.local_rank - 1, self.in_order_timeout,
                )
        msg, options = self.process(msg, kwargs)
        # Point the record's file/line at the caller, not at this adapter (stacklevel 2). A
        # stacklevel the caller gives counts this adapter's frame, as in Accelerate: a wrapper
        # that calls this adapter's ``log`` passes 3 to report its own caller.
        options.setdefault("stacklevel", 2)
        try:
            self.logger.log(level, msg, *args, **options)
        finally:
            if turn is not None:
                turn.done()

    def warning_once(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """``warning`` that this adapter emits only the first time it sees ``msg``."""
        key = str(msg)
        if key in self._warned:
            return
        self._warned.add(key)
        kwargs["stacklevel"] = kwargs.get("stacklevel", 2) + 1  # and this method's frame
        self.log(logging.WARNING, msg, *args, **kwargs)


def get_logger(
    name: str,
    log_level: str | int | None = None,
    *,
    in_order_timeout: float = DEFAULT_IN_ORDER_TIMEOUT,
) -> MultiProcessAdapter:
    """Return a logger whose records print on the main process only by default.

    Args:
        name: the ``logging`` logger name, usually ``__name__``.
        log_level: level for that logger ("INFO", "debug", 20, ...). When None,
            ``ACCEL_LOG_LEVEL`` is used if set; otherwise the logger's level is left alone.
        in_order_timeout: longest wait, in seconds, for a predecessor's ``in_order`` message.

    Raises:
        ValueError: ``log_level`` / ``ACCEL_LOG_LEVEL`` is not a level.

    Example:
        >>> import logging
        >>> logging.basicConfig(format="%(message)s")
        >>> logger = get_logger(__name__, log_level="INFO")
        >>> logger.info("printed once per job")
    """
    if log_level is None:
        from . import log_level as env_log_level

        log_level = env_log_level()
    level = resolve_level(log_level)
    logger = logging.getLogger(name)
    if level is not None:
        logger.setLevel(level)
    return MultiProcessAdapter(logger, in_order_timeout=in_order_timeout)


def main_print(is_main: bool, *args: Any, **kwargs: Any) -> None:
    """``print(*args, **kwargs)`` on the main process only (``Accelerator.print`` uses it).

    Example:
        >>> main_print(True, "accuracy", 0.98)
        accuracy 0.98
        >>> main_print(False, "not shown")
    """
    if is_main:
        print(*args, **kwargs)
