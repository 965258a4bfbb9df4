"""Experiment trackers: ``jsonl``, ``csv``, ``tensorboard``, the services ``wandb``, ``mlflow``,
``comet_ml``, ``aim`` (see ``accel.tracking.services``), ``clearml``, ``dvclive``, ``swanlab`` and
``trackio`` (see ``accel.tracking.more_services``), and a base class for your own.

Only the main process writes. :func:`init_trackers` (what ``Accelerator.init_trackers``
delegates to) builds the trackers on the main process and returns a :class:`TrackerSet`; on other
ranks the set holds no trackers, ``log`` does nothing and ``get_tracker`` returns a no-op
stand-in, so the same training script runs unchanged everywhere.

Files, under ``<logging_dir>/<project_name>/``:

- ``jsonl``: ``metrics.jsonl``, one JSON object per ``log`` call: ``{"step": 3, "loss": 0.25}``
  (``step`` is ``null`` when not given; NaN/inf are written as ``NaN``/``Infinity`` like Python's
  ``json``), and ``config.json`` from ``store_init_configuration``.
- ``csv``: ``metrics.csv`` with a ``step`` column then one column per value key, in order of first
  appearance. A key not seen before adds a column: the file is rewritten (atomically) with the
  wider header and empty cells in earlier rows; a key missing from a call leaves its cell empty.
  Also writes ``config.json``.
- ``tensorboard`` (``pip install 'accel[tensorboard]'``): event files via
  ``torch.utils.tensorboard.SummaryWriter``; numbers -> ``add_scalar``, strings -> ``add_text``,
  dicts of numbers -> ``add_scalars``; the config goes to ``add_hparams``; ``log_images``.

``log_with`` takes these names or Accelerate's ``LoggerType`` members. Trackers of services
(``wandb``, ...) write where their library is configured to (its environment variables, or
``init_kwargs``); each is an optional extra: ``pip install 'accel[wandb]'``.

Existing ``metrics.*`` files are appended to (a resumed run continues the same file).

Example:
    >>> import tempfile
    >>> run = init_trackers("jsonl", "demo", {"lr": 0.1}, tempfile.mkdtemp(), is_main=True)
    >>> run.log({"loss": 0.5}, step=1)
    >>> run.get_tracker("jsonl").tracker.read_text()
    '{"step": 1, "loss": 0.5}\\n'
    >>> run.end_training()
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from .._base.optional import check_installed, is_available, require
from .._base.warn import warn_user
from ..config.settings import LoggerType
from .base import GeneralTracker, Scalar, _scalar, _to_python, on_main_process
from .more_services import (
    MORE_SERVICES,
    ClearMLTracker,
    DVCLiveTracker,
    SwanLabTracker,
    TrackioTracker,
)
from .services import SERVICES, AimTracker, CometMLTracker, MLflowTracker, WandBTracker

__all__ = ["LOGGER_TYPE_TO_CLASS", "AimTracker", "CSVTracker", "ClearMLTracker", "CometMLTracker",
           "DVCLiveTracker", "GeneralTracker", "JSONLTracker", "LoggerType", "MLflowTracker",
           "SwanLabTracker", "TensorBoardTracker", "TrackerSet", "TrackioTracker", "WandBTracker",
           "available_trackers", "check_log_with", "init_trackers", "on_main_process"]


def _scalars(values: Mapping[str, Any], tracker: str) -> dict[str, Scalar]:
    """Validated row for the file trackers, whose first column is ``step``."""
    if "step" in values:
        raise ValueError(
            f"{tracker} tracker: values has a key 'step', which is the step column; pass it "
            "as log(values, step=...) or rename the key"
        )
    return {str(key): _scalar(str(key), value, tracker) for key, value in values.items()}


def _jsonable(value: Any) -> Any:
    value = _to_python(value)
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)  # config records: anything else is written as its str()


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=_jsonable) + "\n")
    os.replace(tmp, path)


class _FileTracker(GeneralTracker):
    requires_logging_directory = True
    filename: ClassVar[str] = ""

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(logging_dir) / run_name
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / self.filename

    def store_init_configuration(self, config: Mapping[str, Any]) -> None:
        _write_json(self.run_dir / "config.json", dict(config))

    @property
    def tracker(self) -> Path:
        """The metrics file's path."""
        return self.path


class JSONLTracker(_FileTracker):
    """Appends one JSON object per ``log`` call to ``<logging_dir>/<run_name>/metrics.jsonl``."""

    name = "jsonl"
    filename = "metrics.jsonl"

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"jsonl tracker: log() takes no options, got {sorted(kwargs)}")
        line = json.dumps({"step": step, **_scalars(values, self.name)})
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")


class CSVTracker(_FileTracker):
    """Writes ``<logging_dir>/<run_name>/metrics.csv``; a new key widens the header."""

    name = "csv"
    filename = "metrics.csv"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str]) -> None:
        super().__init__(run_name, logging_dir)
        self.columns: list[str] = []
        if self.path.exists() and self.path.stat().st_size > 0:
            with self.path.open(newline="", encoding="utf-8") as handle:
                self.columns = next(csv.reader(handle), [])
            if self.columns[:1] != ["step"]:
                raise ValueError(
                    f"csv tracker: {self.path} exists but its header {self.columns} does not "
                    "start with 'step'; it was not written by accel — move it or pick another "
                    "project name"
                )

    def _rewrite(self, columns: list[str]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with self.path.open(newline="", encoding="utf-8") as src, \
                tmp.open("w", newline="", encoding="utf-8") as dst:
            writer = csv.DictWriter(dst, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows(csv.DictReader(src))
        os.replace(tmp, self.path)

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"csv tracker: log() takes no options, got {sorted(kwargs)}")
        row: dict[str, Any] = {"step": "" if step is None else step, **_scalars(values, self.name)}
        new = [key for key in row if key not in self.columns]
        if new and self.columns:
            self._rewrite(self.columns + new)
        first = not self.columns
        self.columns += new
        with self.path.open("a", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=self.columns, restval="")
            if first:
                writer.writeheader()
            writer.writerow(row)


def _hparam(value: Any) -> Any:
    value = _to_python(value)
    return value if isinstance(value, (bool, int, float, str)) else json.dumps(value, default=str)


class TensorBoardTracker(GeneralTracker):
    """TensorBoard event files via ``torch.utils.tensorboard`` (extra ``accel[tensorboard]``)."""

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = Path(logging_dir) / run_name
        self.writer = SummaryWriter(str(self.run_dir), **kwargs)

    def store_init_configuration(self, config: Mapping[str, Any]) -> None:
        self.writer.add_hparams({k: _hparam(v) for k, v in config.items()}, metric_dict={})
        self.writer.flush()

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in values.items():
            value = _to_python(value)
            if isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, Mapping):
                scalars = {str(k): _scalar(f"{key}/{k}", v, self.name) for k, v in value.items()}
                self.writer.add_scalars(key, scalars, global_step=step, **kwargs)
            else:
                scalar = _scalar(key, value, self.name)
                self.writer.add_scalar(key, scalar, global_step=step, **kwargs)
        self.writer.flush()

    def log_images(self, values: Mapping[str, Any], step: int | None = None,
                   **kwargs: Any) -> None:
        """``add_images`` for each value: a batch of images (``NCHW`` by default; pass
        ``dataformats="NHWC"`` for channels-last arrays)."""
        for key, images in values.items():
            self.writer.add_images(key, images, global_step=step, **kwargs)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()

    @property
    def tracker(self) -> Any:
        """The ``SummaryWriter``."""
        return self.writer


_BUILTIN: Mapping[str, type[GeneralTracker]] = MappingProxyType({
    "jsonl": JSONLTracker, "csv": CSVTracker, "tensorboard": TensorBoardTracker, **SERVICES,
    **MORE_SERVICES,
})
#: Accelerate's name for the table of built-in trackers: name -> class, read-only (accel keeps
#: no process-wide registry; pass your own tracker as an instance in ``log_with``).
LOGGER_TYPE_TO_CLASS: Mapping[str, type[GeneralTracker]] = _BUILTIN
#: tracker name -> (module it needs, pip extra that installs it)
_EXTRAS: Mapping[str, tuple[str, str]] = MappingProxyType({
    "tensorboard": ("tensorboard", "tensorboard"),
    **{name: (cls.package, cls.extra) for name, cls in {**SERVICES, **MORE_SERVICES}.items()},
})


def available_trackers() -> list[str]:
    """Built-in tracker names usable here: those whose library is installed (checked without
    importing it). ``log_with="all"`` starts all of them, as in Accelerate.

    Example:
        >>> available_trackers()[:2]
        ['jsonl', 'csv']
    """
    return [name for name in _BUILTIN if name not in _EXTRAS or is_available(_EXTRAS[name][0])]


LogWith = str | GeneralTracker | Sequence[str | GeneralTracker] | None


def check_log_with(log_with: LogWith, *,
                   logging_dir: str | os.PathLike[str] | None = None) -> None:
    """Validate ``Accelerator(log_with=...)`` early: unknown names, duplicates, missing extras,
    and trackers that write files while ``logging_dir`` (the project's) is None.

    Example:
        >>> check_log_with("csv", logging_dir="runs")  # fine
        >>> try:
        ...     check_log_with("csv")
        ... except ValueError as error:
        ...     print(str(error).split(",")[0])
        Logging with `csv` requires a `logging_dir`
    """
    if log_with is None:
        return
    items = [log_with] if isinstance(log_with, (str, GeneralTracker)) else list(log_with)
    wanted = _resolve(log_with)
    if "all" not in items:  # "all" takes what can run, as in Accelerate: checked at init
        _check_logging_dir(wanted, logging_dir)


def _name(item: str | GeneralTracker) -> str:
    return item if isinstance(item, str) else item.name


def _check_logging_dir(wanted: Sequence[str | GeneralTracker],
                       logging_dir: str | os.PathLike[str] | None) -> None:
    """Trackers named in ``log_with`` that write files need a logging directory (an instance
    was built by the caller, with its own directory)."""
    if logging_dir is not None:
        return
    for item in wanted:
        if isinstance(item, str) and _BUILTIN[item].requires_logging_directory:
            raise ValueError(
                f"Logging with `{item}` requires a `logging_dir`, but none was given; pass "
                "Accelerator(project_dir=...) (or ProjectConfiguration(logging_dir=...))")


def _resolve(log_with: LogWith) -> list[str | GeneralTracker]:
    items = [log_with] if isinstance(log_with, (str, GeneralTracker)) else list(log_with or [])
    out: list[str | GeneralTracker] = []
    for item in items:
        if isinstance(item, GeneralTracker):
            if not item.name:
                raise ValueError(f"{type(item).__name__} has no `name`; set the class attribute "
                                 "`name = \"...\"` so get_tracker() can find it")
            out.append(item)
            continue
        item = item.value if isinstance(item, Enum) else item  # LoggerType.WANDB -> "wandb"
        if item == "all":
            out.extend(n for n in available_trackers() if n not in out)
        elif isinstance(item, str) and item in _BUILTIN:
            if item in _EXTRAS:
                check_installed(*_EXTRAS[item])  # on every rank: fail everywhere alike
            if item not in out:
                out.append(item)
        else:
            raise ValueError(
                f"unknown tracker {item!r} in log_with; available: 'all', "
                f"{', '.join(repr(n) for n in _BUILTIN)}, or a GeneralTracker instance "
                "(subclass accel.tracking.GeneralTracker for other services)"
            )
    names = [t if isinstance(t, str) else t.name for t in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"log_with names tracker(s) {dupes} more than once; give each a "
                         "distinct `name`")
    return out


class _NoOpTracker:
    """What non-main ranks get from ``get_tracker``: every attribute is a do-nothing call."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def tracker(self) -> _NoOpTracker:
        return self

    def __getattr__(self, attr: str) -> Any:
        return lambda *args, **kwargs: None

    def __repr__(self) -> str:
        return f"<no-op tracker {self.name!r} (no tracker runs on this process)>"


class TrackerSet:
    """The trackers of one run; ``Accelerator.log/end_training/get_tracker`` delegate here.

    Use :func:`init_trackers` to build one; ``TrackerSet()`` is the empty set (nothing was
    requested: ``log`` does nothing). ``TrackerSet.pending(is_main)`` is the set before
    ``init_trackers`` ran on this process although ``log_with`` asked for trackers: as in
    Accelerate, ``log`` does nothing there and ``get_tracker`` returns a do-nothing stand-in —
    scripts commonly call ``init_trackers`` under ``if accelerator.is_main_process:`` and ``log``
    on every rank. The main process warns once that its values are dropped.

    Example:
        >>> before = TrackerSet.pending(is_main=False)
        >>> before.log({"loss": 1.0})  # another rank started the trackers: nothing to do here
        >>> before.get_tracker("wandb", unwrap=True).log({"x": 1})  # a do-nothing stand-in
    """

    def __init__(self, trackers: Sequence[GeneralTracker] = (), names: Sequence[str] = (),
                 is_main: bool = True) -> None:
        self.trackers: list[GeneralTracker] = list(trackers)
        self.names: tuple[str, ...] = tuple(names)  # requested on every rank, built or not
        self.is_main = is_main
        self.finished = False
        self.started = True  # False only for ``pending()``: init_trackers not called here yet
        self._warned = False

    def __getstate__(self) -> dict[str, Any]:
        # Trackers hold open files and runs of this process: a copy (pickled into a DataLoader
        # worker, say) has none, and logging there does nothing, silently.
        return dict(self.__dict__, trackers=[], is_main=False)

    @classmethod
    def pending(cls, is_main: bool) -> TrackerSet:
        """The trackers before ``init_trackers`` ran on this process (``log_with`` was given)."""
        empty = cls(is_main=is_main)
        empty.started = False
        return empty

    def _drop(self) -> None:
        if self.is_main and not self._warned:
            self._warned = True
            warn_user("accelerator.log() before init_trackers(): the values are not "
                      "recorded; call accelerator.init_trackers(project_name) first (this "
                      "warning is shown once)")

    def _check_keys(self, what: str, options: Mapping[str, Any] | None) -> Mapping[str, Any]:
        unknown = sorted(set(options or {}) - set(self.names))
        if unknown:
            raise ValueError(f"{what} names tracker(s) {unknown} that are not in use; trackers "
                             f"in use: {list(self.names)}")
        return options or {}

    def log(self, values: Mapping[str, Any], step: int | None = None,
            log_kwargs: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """Send ``values`` to every tracker on this process (none on non-main ranks).

        ``log_kwargs`` maps a tracker name to extra keyword arguments for its ``log``.
        """
        if not self.started:
            self._drop()
            return
        options = self._check_keys("log_kwargs", log_kwargs)
        if self.finished:
            raise RuntimeError("log() was called after end_training(); call init_trackers() "
                               "again to start a new run")
        if not isinstance(values, Mapping):
            raise TypeError(f"log() expects a dict of values, got {type(values).__name__}")
        converted = {key: _to_python(value) for key, value in values.items()}
        for tracker in self.trackers:
            tracker.log(converted, step=step, **options.get(tracker.name, {}))

    def end_training(self) -> None:
        """Finish every tracker (flush and close files); calling it again does nothing."""
        if self.finished:
            return
        self.finished = True
        for tracker in self.trackers:
            tracker.finish()

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (its underlying object with ``unwrap=True``).

        On a rank where the tracker does not run (not the main process), returns a stand-in
        whose methods do nothing, so ``get_tracker("tensorboard", unwrap=True).add_scalar(...)``
        works unchanged on every rank.
        """
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        if name in self.names or not self.started:
            return _NoOpTracker(name)
        raise ValueError(f"no tracker named {name!r}; trackers in use: {list(self.names)} "
                         "(pass it in log_with and call init_trackers first)")


def _build(name: str, *, project_name: str, logging_dir: str | os.PathLike[str] | None,
           kwargs: Mapping[str, Any]) -> GeneralTracker:
    """Construct a built-in tracker as Accelerate does: the logging directory is the second
    argument of those that write files, and is not passed to the others."""
    factory: Callable[..., GeneralTracker] = _BUILTIN[name]
    if _BUILTIN[name].requires_logging_directory:
        return factory(project_name, logging_dir, **kwargs)
    return factory(project_name, **kwargs)


def _start_all(trackers: Sequence[GeneralTracker]) -> None:
    """Start every tracker; if one fails, finish the ones already started (their runs are not
    left open) and raise the failure. A failure while finishing is a warning, not a mask."""
    started: list[GeneralTracker] = []
    try:
        for tracker in trackers:
            tracker.start()
            started.append(tracker)
    except BaseException:
        for tracker in reversed(started):
            try:
                tracker.finish()
            except Exception as cleanup:  # noqa: BLE001 - reported, and the first error raised
                warn_user(f"tracker {tracker.name!r} could not be finished after another "
                          f"tracker failed to start: {cleanup!r}")
        raise


def init_trackers(
    log_with: LogWith,
    project_name: str | None,
    config: Mapping[str, Any] | None = None,
    logging_dir: str | os.PathLike[str] | None = None,
    is_main: bool = True,
    init_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
) -> TrackerSet:
    """Build the trackers named in ``log_with`` (on the main process) and store ``config``.

    Args:
        log_with: ``"all"``, a name (``"jsonl"``, ``"csv"``, ``"tensorboard"``, ``"wandb"``,
            ``"mlflow"``, ``"comet_ml"``, ``"aim"``, ``"clearml"``, ``"dvclive"``,
            ``"swanlab"``, ``"trackio"``) or ``LoggerType`` member, a
            ``GeneralTracker`` instance, or a list of those.
        project_name: run name; file trackers write under ``<logging_dir>/<project_name>/``.
            None is accepted when ``log_with`` holds only tracker instances (built by you,
            they take no project name).
        config: hyper-parameters passed to each tracker's ``store_init_configuration``.
        logging_dir: required by the trackers that write files (``jsonl``, ``csv``,
            ``tensorboard``, ``aim``: ``Accelerator(project_dir=...)``).
        is_main: whether this process writes. Names are validated on every rank either way.
        init_kwargs: tracker name -> keyword arguments for that built-in tracker's constructor
            (for ``wandb``: ``wandb.init``'s).

    Raises:
        ValueError: unknown tracker name, missing ``logging_dir``, or ``init_kwargs`` for a
            tracker not in use.
        ModuleNotFoundError: a tracker's library is not installed (the message names the
            pip extra).

    Example:
        >>> run = init_trackers(None, "demo")
        >>> run.log({"loss": 1.0})  # nothing requested: nothing happens
    """
    wanted = _resolve(log_with)
    builds = any(isinstance(item, str) for item in wanted)
    if (builds or project_name is not None) and (not isinstance(project_name, str)
                                                 or not project_name):
        raise ValueError(f"project_name must be a non-empty string, got {project_name!r} (it "
                         "may be None only when log_with holds tracker instances alone)")
    names = [_name(t) for t in wanted]
    result = TrackerSet(names=names, is_main=is_main)
    options = result._check_keys("init_kwargs", init_kwargs)
    _check_logging_dir(wanted, logging_dir)
    for item in wanted:
        if isinstance(item, GeneralTracker):
            if is_main or not item.main_process_only:
                result.trackers.append(item)
        elif is_main:
            assert project_name is not None  # checked above: a tracker is built by name
            result.trackers.append(_build(item, project_name=project_name,
                                          logging_dir=logging_dir,
                                          kwargs=options.get(item, {})))
    _start_all(result.trackers)
    if config is not None:
        for tracker in result.trackers:
            tracker.store_init_configuration(config)
    return result
