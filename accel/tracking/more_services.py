"""Trackers of the services ``clearml``, ``dvclive``, ``swanlab`` and ``trackio``.

Built like those of ``accel.tracking.services``: each has Accelerate's class name, constructor
and methods, is an optional extra (``pip install 'accel[clearml]'``, ``accel[dvclive]``,
``accel[swanlab]``, ``accel[trackio]``), and imports its library only when the run starts, in
``start()``, which ``init_trackers`` calls on the main process only. Constructor keyword
arguments (``init_kwargs={"<name>": {...}}``) go to the library's run constructor.

- ``clearml``: ``Task.init(project_name=..., task_name=...)``, both the project name unless
  ``CLEARML_PROJECT``/``CLEARML_TASK`` (or ``init_kwargs``) say otherwise; a task already running
  in the process (``Task.current_task()``) is used instead, and left open by ``finish``. With a
  ``step``, numbers are reported as scalars, titled by the key without an ``eval_``/``test_``/
  ``train_`` prefix, in the series that prefix names (``train`` without one); without a step, as
  single values. The config is ``task.connect_configuration``; ``log_images``, ``log_table``.
- ``dvclive``: a ``dvclive.Live(**init_kwargs)`` (or the ``live=`` you pass); each ``log`` call
  writes one step (``step=`` sets it) then advances; the config is ``live.log_params``.
- ``swanlab``: ``swanlab.init(project=project_name, **init_kwargs)``; values go to ``run.log``
  as they are (numbers and swanlab media); ``log_images``.
- ``trackio``: ``trackio.init(project=project_name, **init_kwargs)``, local by default; values go
  to ``run.log``. trackio writes the config with the run's first ``log``.

Values that a service cannot record (text for ClearML's scalars, say) are dropped with a warning
naming the key, once per key.

Example:
    >>> {name: tracker.extra for name, tracker in MORE_SERVICES.items()}
    {'clearml': 'clearml', 'dvclive': 'dvclive', 'swanlab': 'swanlab', 'trackio': 'trackio'}
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .._base.optional import check_installed, require
from ..env import clearml_variables
from .services import ServiceTracker, _config

__all__ = ["MORE_SERVICES", "ClearMLTracker", "DVCLiveTracker", "SwanLabTracker",
           "TrackioTracker"]

#: ClearML series named by a key's prefix (``eval_loss`` -> title ``loss``, series ``eval``).
_SERIES = ("eval", "test", "train")


def _title_series(key: str) -> tuple[str, str]:
    """ClearML's (title, series) for ``key``: a known prefix names the series, else ``train``.

    Example:
        >>> _title_series("eval_loss"), _title_series("loss"), _title_series("evaluation")
        (('loss', 'eval'), ('loss', 'train'), ('evaluation', 'train'))
    """
    for series in _SERIES:
        if key.startswith(series + "_"):
            return key[len(series) + 1:], series
    return key, "train"


class ClearMLTracker(ServiceTracker):
    """ClearML (``pip install 'accel[clearml]'``), as Accelerate's ``ClearMLTracker``.

    Offline runs: call ``clearml.Task.set_offline(True)`` before ``init_trackers``.

    Args:
        run_name: the project's and the task's name; ``CLEARML_PROJECT`` and ``CLEARML_TASK``
            take priority, and ``project_name``/``task_name`` in ``kwargs`` over both.
        **kwargs: passed to ``clearml.Task.init`` (e.g. ``tags``, ``output_uri``,
            ``auto_connect_frameworks``).
    """

    name = "clearml"
    requires_logging_directory = False
    package = "clearml"
    extra = "clearml"

    def __init__(self, run_name: str | None = None, **kwargs: Any) -> None:
        check_installed(self.package, self.extra)
        self.run_name = run_name
        self.user_provided_run_name = run_name  # Accelerate's attribute name
        self.init_kwargs = kwargs
        self._initialized_externally = False

    def start(self) -> None:
        task_class = self._library().Task
        running = task_class.current_task()
        if running is not None:  # the script opened its task itself: log there, leave it open
            self._initialized_externally = True
            self._run_object = running
            return
        env = clearml_variables()
        options = dict(self.init_kwargs)
        options.setdefault("project_name", env.get("CLEARML_PROJECT", self.run_name))
        options.setdefault("task_name", env.get("CLEARML_TASK", self.run_name))
        self._run_object = task_class.init(**options)

    @property
    def tracker(self) -> Any:
        """The ``clearml.Task``."""
        return self._started()

    @property
    def task(self) -> Any:
        """The ``clearml.Task`` (Accelerate's attribute name)."""
        return self._started()

    def store_init_configuration(self, config: Mapping[str, Any]) -> None:
        """``task.connect_configuration(config)``."""
        self._started().connect_configuration(_config(config))

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers -> ``report_scalar`` (with a ``step``) or ``report_single_value`` (without);
        ``kwargs`` go to those. Other values are dropped with a warning."""
        logger = self._started().get_logger()
        for key, value in values.items():
            if not isinstance(value, numbers.Real):
                self._drop(key, f"is a {type(value).__name__}; ClearML scalars are numbers")
                continue
            if step is None:
                logger.report_single_value(name=key, value=value, **kwargs)
            else:
                title, series = _title_series(key)
                logger.report_scalar(title=title, series=series, value=value, iteration=step,
                                     **kwargs)

    def log_images(self, values: Mapping[str, Any], step: int | None = None,
                   **kwargs: Any) -> None:
        """``report_image`` for each value (a numpy array or a PIL image); ``kwargs`` go there."""
        logger = self._started().get_logger()
        for key, image in values.items():
            title, series = _title_series(key)
            logger.report_image(title=title, series=series, iteration=step, image=image,
                                **kwargs)

    def log_table(self, table_name: str, columns: list[str] | None = None,
                  data: list[list[Any]] | None = None, dataframe: Any = None,
                  step: int | None = None, **kwargs: Any) -> None:
        """``report_table`` of a ``dataframe``, or of the rows ``data`` under the header
        ``columns`` (without ``columns``, the first row of ``data`` is the header)."""
        if (dataframe is None) == (data is None):
            raise ValueError("clearml tracker: log_table needs either `data` (with optional "
                             "`columns`) or `dataframe`, not both")
        if dataframe is not None and columns is not None:
            raise ValueError("clearml tracker: log_table takes `columns` with `data`; a "
                             "`dataframe` has its own column names")
        table: Any = dataframe
        if dataframe is None:
            rows = list(data or [])
            table = [list(columns), *rows] if columns else rows
        title, series = _title_series(table_name)
        self._started().get_logger().report_table(title=title, series=series, table_plot=table,
                                                  iteration=step, **kwargs)

    def finish(self) -> None:
        """Close the task, unless the script opened it (it closes its own)."""
        task = self._started()
        if not self._initialized_externally:
            task.close()


class DVCLiveTracker(ServiceTracker):
    """DVCLive (``pip install 'accel[dvclive]'``), as Accelerate's ``DVCLiveTracker``.

    dvclive has no project name: ``run_name`` (the project name ``init_trackers`` passes) is kept
    as ``run_name`` and not given to dvclive; choose the directory and experiment name with
    ``init_kwargs={"dvclive": {"dir": ..., "exp_name": ...}}``. In a Git repository dvclive
    makes it a DVC repository (``dvc init``) unless one exists.

    Args:
        run_name: not used by dvclive (see above).
        live: a ``dvclive.Live`` to log to, instead of a new one.
        **kwargs: passed to ``dvclive.Live`` (e.g. ``dir``, ``save_dvc_exp``, ``dvcyaml``,
            ``report``); not with ``live``.
    """

    name = "dvclive"
    requires_logging_directory = False
    package = "dvclive"
    extra = "dvclive"

    def __init__(self, run_name: str | None = None, live: Any = None, **kwargs: Any) -> None:
        check_installed(self.package, self.extra)
        if live is not None and kwargs:
            raise ValueError(f"dvclive tracker: `live` is an existing dvclive.Live, so the "
                             f"options {sorted(kwargs)} for a new one would not be used; pass "
                             "one or the other")
        self.run_name = run_name
        self.live = live  # Accelerate's attribute: the Live once the run started
        self.init_kwargs = kwargs

    def start(self) -> None:
        if self.live is None:
            self.live = self._library().Live(**self.init_kwargs)
        self._run_object = self.live

    @property
    def tracker(self) -> Any:
        """The ``dvclive.Live``."""
        return self._started()

    def store_init_configuration(self, config: Mapping[str, Any]) -> None:
        """``live.log_params(config)`` (written to ``params.yaml``)."""
        self._started().log_params(_config(config))

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``live.log_metric`` for each value dvclive takes (numbers, strings), at ``step`` when
        given, then ``live.next_step()``; ``kwargs`` go to ``log_metric``."""
        live = self._started()
        metric = require("dvclive.plots", self.extra).Metric
        if step is not None:
            live.step = step
        for key, value in values.items():
            if metric.could_log(value):
                live.log_metric(key, value, **kwargs)
            else:
                self._drop(key, f"is a {type(value).__name__}; dvclive metrics are numbers or "
                           "strings")
        live.next_step()

    def finish(self) -> None:
        """``live.end()``."""
        self._started().end()


class _RunTracker(ServiceTracker):
    """A tracker whose library's ``init(project=run_name, **kwargs)`` returns a run with
    ``config``, ``log(values, step=...)`` and ``finish()`` (swanlab, trackio)."""

    requires_logging_directory = False

    def start(self) -> None:
        self._run_object = self._library().init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The library's run."""
        return self._started()

    @property
    def run(self) -> Any:
        """The library's run (Accelerate's attribute name)."""
        return self._started()

    def store_init_configuration(self, config: Mapping[str, Any]) -> None:
        """``run.config.update(config)``."""
        self._started().config.update(_config(config))

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``run.log(values, step=step, **kwargs)``."""
        self._started().log(dict(values), step=step, **kwargs)

    def finish(self) -> None:
        self._started().finish()


class SwanLabTracker(_RunTracker):
    """SwanLab (``pip install 'accel[swanlab]'``), as Accelerate's ``SwanLabTracker``.

    Args:
        run_name: the SwanLab project (``swanlab.init(project=run_name)``).
        **kwargs: passed to ``swanlab.init`` (e.g. ``name``, ``description``, ``tags``,
            ``mode="offline"``, ``log_dir``).
    """

    name = "swanlab"
    package = "swanlab"
    extra = "swanlab"

    def log_images(self, values: Mapping[str, Any], step: int | None = None,
                   **kwargs: Any) -> None:
        """Log each key's list of images (numpy arrays or PIL images) as ``swanlab.Image``s."""
        swanlab = self._library()
        for key, images in values.items():
            self.log({key: [swanlab.Image(image) for image in images]}, step=step, **kwargs)


class TrackioTracker(_RunTracker):
    """Trackio (``pip install 'accel[trackio]'``), as Accelerate's ``TrackioTracker``.

    Runs are stored locally (``TRACKIO_DIR``) unless ``init_kwargs`` name a Space or a server.
    trackio writes the config with the run's first ``log``.

    Args:
        run_name: the trackio project (``trackio.init(project=run_name)``).
        **kwargs: passed to ``trackio.init`` (e.g. ``name``, ``space_id``, ``auto_log_cpu``).
    """

    name = "trackio"
    package = "trackio"
    extra = "trackio"


MORE_SERVICES: Mapping[str, type[ServiceTracker]] = MappingProxyType({
    "clearml": ClearMLTracker, "dvclive": DVCLiveTracker, "swanlab": SwanLabTracker,
    "trackio": TrackioTracker,
})
