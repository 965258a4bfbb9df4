"""Trackers of experiment-tracking services: ``wandb``, ``mlflow``, ``comet_ml`` and ``aim``.

Each has Accelerate's class name, constructor and methods, and is an optional extra
(``pip install 'accel[wandb]'``, ``accel[mlflow]``, ``accel[comet-ml]``, ``accel[aim]``); the
library is imported only when the run starts, on the main process. ``accel.tracking`` lists them
for ``log_with``; ``init_trackers`` builds them on the main process only and calls ``start()``
(which opens the run), then ``store_init_configuration(config)``. The service's own settings
(offline mode, directories, API keys, tracking URI) are read by the library as usual, from its
environment variables or from ``init_kwargs={"<name>": {...}}``, which go to the constructor.

- ``wandb``: ``wandb.init(project=project_name, **init_kwargs)``; ``log`` passes values through
  to ``run.log`` (so ``wandb.Image``/``wandb.Table`` values work); ``log_images``,
  ``log_table``.
- ``mlflow``: the experiment called ``project_name`` (created if missing), a run in it;
  ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_RUN_ID``, ``MLFLOW_TAGS`` (JSON) and ``MLFLOW_NESTED_RUN``
  take priority over the arguments. Numbers become metrics; other values are dropped with a
  warning (MLflow metrics are numbers); the config becomes params. ``log_figure``,
  ``log_artifact``, ``log_artifacts``.
- ``comet_ml``: ``comet_ml.start(project_name=project_name, **init_kwargs)``; numbers ->
  ``log_metric``, strings -> ``log_other``, dicts -> ``log_metrics``.
- ``aim``: an ``aim.Run`` in the repository at the logging directory, named ``project_name``;
  every value goes to ``run.track`` (numbers and aim objects); the config is ``run["hparams"]``;
  ``log_images``.

Example:
    >>> {name: tracker.extra for name, tracker in SERVICES.items()}
    {'wandb': 'wandb', 'comet_ml': 'comet-ml', 'aim': 'aim', 'mlflow': 'mlflow'}
"""

from __future__ import annotations

import json
import numbers
import os
from collections.abc import Mapping
from types import MappingProxyType, ModuleType
from typing import Any, ClassVar

from .._base.optional import check_installed, require
from .._base.parse import parse_bool
from .._base.warn import warn_user
from ..env import mlflow_variables
from .base import GeneralTracker, _to_python

__all__ = ["SERVICES", "AimTracker", "CometMLTracker", "MLflowTracker", "ServiceTracker",
           "WandBTracker"]


def _config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Hyper-parameters with 0-d tensors as numbers and paths as strings."""
    return {str(key): os.fspath(value) if isinstance(value, os.PathLike) else _to_python(value)
            for key, value in config.items()}


class ServiceTracker(GeneralTracker):
    """A tracker whose library is an optional extra and whose run opens in ``start()``."""

    package: ClassVar[str] = ""  # the module imported
    extra: ClassVar[str] = ""  # the pip extra that installs it
    _run_object: Any = None
    _dropped: frozenset[str] = frozenset()
    run_name: str | None  # MLflow's may be None (its experiment name comes from elsewhere)

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        """Checks that the library is installed (without importing it); ``kwargs`` go to the
        library's run constructor in ``start()``."""
        check_installed(self.package, self.extra)
        self.run_name = run_name
        self.init_kwargs = kwargs

    def _drop(self, key: str, why: str) -> None:
        """Warn that ``key`` is not recorded, once per key (it would repeat at every step)."""
        if key not in self._dropped:
            self._dropped = self._dropped | {key}
            warn_user(f"{self.name} tracker: {key!r} {why}, so it is not recorded")

    def _library(self) -> ModuleType:
        return require(self.package, self.extra)

    def _started(self) -> Any:
        if self._run_object is None:
            raise RuntimeError(
                f"the {self.name} tracker has no run yet: its run opens in start(), which "
                "accelerator.init_trackers(project_name) calls on the main process; call "
                "init_trackers first (and, for a tracker you built, pass it in log_with)")
        return self._run_object


class WandBTracker(ServiceTracker):
    """Weights & Biases (``pip install 'accel[wandb]'``), as Accelerate's ``WandBTracker``.

    Args:
        run_name: the wandb project (``wandb.init(project=run_name)``).
        **kwargs: passed to ``wandb.init`` (``init_kwargs={"wandb": {...}}``), e.g. ``name``,
            ``tags``, ``mode="offline"``, ``dir``.
    """

    name = "wandb"
    requires_logging_directory = False
    package = "wandb"
    extra = "wandb"

    def start(self) -> None:
        self._run_object = self._library().init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The ``wandb`` run (``wandb.Run``)."""
        return self._started()

    def store_init_configuration(self, config: Mapping[str, Any]) -> None:
        self._started().config.update(_config(config), allow_val_change=True)

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``run.log(values, step=step, **kwargs)``: any value wandb accepts."""
        self._started().log(dict(values), step=step, **kwargs)

    def log_images(self, values: Mapping[str, Any], step: int | None = None,
                   **kwargs: Any) -> None:
        """Log each key's list of images (numpy arrays or PIL images) as ``wandb.Image``s."""
        wandb = self._library()
        for key, images in values.items():
            self.log({key: [wandb.Image(image) for image in images]}, step=step, **kwargs)

    def log_table(self, table_name: str, columns: list[str] | None = None,
                  data: list[list[Any]] | None = None, dataframe: Any = None,
                  step: int | None = None, **kwargs: Any) -> None:
        """Log a ``wandb.Table`` from ``columns`` and ``data``, or from a ``dataframe``."""
        table = self._library().Table(columns=columns, data=data, dataframe=dataframe)
        self.log({table_name: table}, step=step, **kwargs)

    def finish(self) -> None:
        self._started().finish()


class MLflowTracker(ServiceTracker):
    """MLflow (``pip install 'accel[mlflow]'``), as Accelerate's ``MLflowTracker``.

    The tracking server or store is MLflow's (``MLFLOW_TRACKING_URI``, ``mlflow.db`` here by
    default). ``init_trackers`` passes the project name as ``experiment_name``.

    Args:
        experiment_name: the experiment (created when missing); ``MLFLOW_EXPERIMENT_NAME`` wins.
        logging_dir: the new experiment's artifact location.
        run_id: resume that run; ``MLFLOW_RUN_ID`` wins.
        tags: a dict, or its JSON text; ``MLFLOW_TAGS`` (JSON) wins.
        nested_run: nest the run in the active one; ``MLFLOW_NESTED_RUN`` wins.
        run_name: the new run's name.
        description: the run's description.
    """

    name = "mlflow"
    requires_logging_directory = False
    package = "mlflow"
    extra = "mlflow"

    def __init__(self, experiment_name: str | None = None,
                 logging_dir: str | os.PathLike[str] | None = None, run_id: str | None = None,
                 tags: dict[str, Any] | str | None = None, nested_run: bool | None = False,
                 run_name: str | None = None, description: str | None = None) -> None:
        check_installed(self.package, self.extra)
        env = mlflow_variables()
        tags = env.get("MLFLOW_TAGS", tags)
        if isinstance(tags, str):
            try:
                tags = json.loads(tags)
            except json.JSONDecodeError as exc:
                raise ValueError(f"mlflow tracker: tags must be a dict or JSON text of one, got "
                                 f"{tags!r} (check MLFLOW_TAGS): {exc}") from None
        nested = env.get("MLFLOW_NESTED_RUN")
        self.experiment_name = env.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.logging_dir = logging_dir
        self.run_id = env.get("MLFLOW_RUN_ID", run_id)
        self.tags = tags
        self.nested_run = bool(nested_run) if nested is None else parse_bool(
            nested, name="MLFLOW_NESTED_RUN")
        self.run_name = run_name
        self.description = description

    def start(self) -> None:
        mlflow = self._library()
        experiment_id = None
        if self.experiment_name is not None:
            found = mlflow.get_experiment_by_name(self.experiment_name)
            experiment_id = found.experiment_id if found is not None else mlflow.create_experiment(
                name=self.experiment_name, tags=self.tags,
                artifact_location=None if self.logging_dir is None else os.fspath(self.logging_dir))
        self._run_object = mlflow.start_run(
            run_id=self.run_id, experiment_id=experiment_id, run_name=self.run_name,
            nested=self.nested_run, tags=self.tags, description=self.description)

    @property
    def tracker(self) -> Any:
        """The active ``mlflow.ActiveRun``."""
        return self._started()

    @property
    def active_run(self) -> Any:
        """The run this tracker opened (``mlflow.ActiveRun``; ``active_run.info.run_id``)."""
        return self._started()

    def store_init_configuration(self, config: Mapping[str, Any]) -> None:
        """Record ``config`` as the run's params (MLflow stores them as text)."""
        self._started()
        mlflow = self._library()
        limit = mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
        params = {}
        for key, value in _config(config).items():
            if len(str(value)) > limit:
                self._drop(key, f"is longer than MLflow's {limit} characters for a param")
            else:
                params[key] = value
        items, batch = list(params.items()), mlflow.utils.validation.MAX_PARAMS_TAGS_PER_BATCH
        for first in range(0, len(items), batch):
            mlflow.log_params(dict(items[first:first + batch]))

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``mlflow.log_metrics`` of the numbers in ``values`` (others: warned and dropped)."""
        self._started()
        metrics = {}
        for key, value in values.items():
            if isinstance(value, numbers.Real):
                metrics[key] = float(value)
            else:
                self._drop(key, f"is a {type(value).__name__}; MLflow metrics are numbers")
        self._library().log_metrics(metrics, step=step, **kwargs)

    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        """``mlflow.log_figure``: a matplotlib or plotly figure saved as a run artifact."""
        self._started()
        self._library().log_figure(figure=figure, artifact_file=artifact_file, **save_kwargs)

    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        """``mlflow.log_artifacts``: every file under ``local_dir``."""
        self._started()
        self._library().log_artifacts(local_dir=local_dir, artifact_path=artifact_path)

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """``mlflow.log_artifact``: one file."""
        self._started()
        self._library().log_artifact(local_path=local_path, artifact_path=artifact_path)

    def finish(self) -> None:
        self._started()
        self._library().end_run()


class CometMLTracker(ServiceTracker):
    """Comet (``pip install 'accel[comet-ml]'``), as Accelerate's ``CometMLTracker``.

    Args:
        run_name: the Comet project.
        **kwargs: passed to ``comet_ml.start`` (e.g. ``online=False`` with
            ``experiment_config=comet_ml.ExperimentConfig(offline_directory=...)``).
    """

    name = "comet_ml"
    requires_logging_directory = False
    package = "comet_ml"
    extra = "comet-ml"

    def start(self) -> None:
        self._run_object = self._library().start(project_name=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The Comet experiment."""
        return self._started()

    def store_init_configuration(self, config: Mapping[str, Any]) -> None:
        self._started().log_parameters(_config(config))

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers -> ``log_metric``, strings -> ``log_other``, dicts -> ``log_metrics``."""
        experiment = self._started()
        if step is not None:
            experiment.set_step(step)
        for key, value in values.items():
            if isinstance(value, str):
                experiment.log_other(key, value, **kwargs)
            elif isinstance(value, numbers.Real):
                experiment.log_metric(key, value, step=step, **kwargs)
            elif isinstance(value, Mapping):
                experiment.log_metrics(dict(value), step=step, **kwargs)
            else:  # Accelerate skips these; say so (log media through the experiment)
                self._drop(key, f"is a {type(value).__name__}, not a number, a string or a "
                           "dict (log media with get_tracker('comet_ml', unwrap=True)"
                           ".log_image(...))")

    def finish(self) -> None:
        self._started().end()


class AimTracker(ServiceTracker):
    """Aim (``pip install 'accel[aim]'``), as Accelerate's ``AimTracker``.

    Args:
        run_name: the run's name.
        logging_dir: the Aim repository (``Accelerator(project_dir=...)`` by default); ``repo=``
            (``aim.Run``'s name for it) is accepted instead.
        **kwargs: passed to ``aim.Run`` (e.g. ``experiment``, ``system_tracking_interval``).
    """

    name = "aim"
    requires_logging_directory = True
    package = "aim"
    extra = "aim"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = ".",
                 **kwargs: Any) -> None:
        check_installed(self.package, self.extra)
        repo = kwargs.pop("repo", None)  # aim.Run's own name for the repository
        if repo is not None and logging_dir not in (".", None) and \
                os.fspath(repo) != os.fspath(logging_dir):
            raise ValueError(f"aim tracker: logging_dir={os.fspath(logging_dir)!r} and "
                             f"repo={os.fspath(repo)!r} both name the Aim repository; pass one")
        self.run_name = run_name
        self.aim_repo_path = logging_dir if repo is None else repo
        self.init_kwargs = kwargs

    def start(self) -> None:
        repo = None if self.aim_repo_path is None else os.fspath(self.aim_repo_path)
        run = self._library().Run(repo=repo, **self.init_kwargs)
        run.name = self.run_name
        self._run_object = run

    @property
    def tracker(self) -> Any:
        """The ``aim.Run``."""
        return self._started()

    def store_init_configuration(self, config: Mapping[str, Any]) -> None:
        self._started()["hparams"] = _config(config)

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``run.track(value, name=key, step=step, **kwargs)`` for each value."""
        run = self._started()
        for key, value in values.items():
            run.track(value, name=key, step=step, **kwargs)

    def log_images(self, values: Mapping[str, Any], step: int | None = None,
                   kwargs: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """Track each value (an image, or ``(image, caption)``) as an ``aim.Image``.

        ``kwargs`` holds options for ``aim.Image`` under ``"aim_image"`` and for ``run.track``
        under ``"track"``, as in Accelerate.
        """
        run, aim = self._started(), self._library()
        image_kw, track_kw = (kwargs or {}).get("aim_image", {}), (kwargs or {}).get("track", {})
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, "")
            run.track(aim.Image(image, caption=caption, **image_kw), name=key, step=step,
                      **track_kw)

    def finish(self) -> None:
        self._started().close()


SERVICES: Mapping[str, type[ServiceTracker]] = MappingProxyType({
    "wandb": WandBTracker, "comet_ml": CometMLTracker, "aim": AimTracker,
    "mlflow": MLflowTracker,
})
