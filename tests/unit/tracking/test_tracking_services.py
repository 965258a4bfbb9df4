"""Trackers of services (wandb, mlflow, comet_ml, aim, clearml, dvclive, swanlab, trackio):
comet_ml's offline archive read back, names, LoggerType, availability probes and missing-extra
errors. The wandb, mlflow and aim libraries start processes (wandb's service, git) when a run
starts: their read-back tests are in tests/e2e/tracking/test_tracker_services.py."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from accel import Accelerator
from accel._base.optional import is_available
from accel.device import availability as probes
from accel.tracking import (
    LOGGER_TYPE_TO_CLASS,
    AimTracker,
    ClearMLTracker,
    CometMLTracker,
    DVCLiveTracker,
    LoggerType,
    MLflowTracker,
    SwanLabTracker,
    TrackioTracker,
    WandBTracker,
    available_trackers,
    init_trackers,
)
from accel.utils import LoggerType as UtilsLoggerType

#: tracker name -> (module, pip extra, class)
SERVICES = {"wandb": ("wandb", "wandb", WandBTracker),
            "mlflow": ("mlflow", "mlflow", MLflowTracker),
            "comet_ml": ("comet_ml", "comet-ml", CometMLTracker),
            "aim": ("aim", "aim", AimTracker),
            "clearml": ("clearml", "clearml", ClearMLTracker),
            "dvclive": ("dvclive", "dvclive", DVCLiveTracker),
            "swanlab": ("swanlab", "swanlab", SwanLabTracker),
            "trackio": ("trackio", "trackio", TrackioTracker)}


def needs(module: str, extra: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not is_available(module),
                              reason=f"{module} is not installed (pip install 'accel[{extra}]')")


def test_mlflow_environment_takes_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    if not is_available("mlflow"):
        monkeypatch.setattr("accel.tracking.services.check_installed", lambda *a: None)
    tracker = MLflowTracker("arg", run_id="r1", tags={"a": "1"})
    assert (tracker.experiment_name, tracker.run_id, tracker.tags, tracker.nested_run) == (
        "arg", "r1", {"a": "1"}, False)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "env")
    monkeypatch.setenv("MLFLOW_RUN_ID", "r2")
    monkeypatch.setenv("MLFLOW_TAGS", '{"b": "2"}')
    monkeypatch.setenv("MLFLOW_NESTED_RUN", "yes")
    tracker = MLflowTracker("arg", run_id="r1", tags={"a": "1"})
    assert (tracker.experiment_name, tracker.run_id, tracker.tags, tracker.nested_run) == (
        "env", "r2", {"b": "2"}, True)
    monkeypatch.setenv("MLFLOW_TAGS", "team=a")
    with pytest.raises(ValueError, match="tags must be a dict or JSON text.*MLFLOW_TAGS"):
        MLflowTracker("arg")
    monkeypatch.setenv("MLFLOW_TAGS", "{}")
    monkeypatch.setenv("MLFLOW_NESTED_RUN", "maybe")
    with pytest.raises(ValueError, match="MLFLOW_NESTED_RUN must be true or false"):
        MLflowTracker("arg")


def test_mlflow_active_run_is_the_run_it_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    if not is_available("mlflow"):
        monkeypatch.setattr("accel.tracking.services.check_installed", lambda *a: None)
    tracker = MLflowTracker("exp")
    with pytest.raises(RuntimeError, match="no run yet.*init_trackers"):
        _ = tracker.active_run
    run = object()
    tracker._run_object = run
    assert tracker.active_run is run and tracker.tracker is run


def test_aim_takes_the_repository_as_logging_dir_or_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    if not is_available("aim"):
        monkeypatch.setattr("accel.tracking.services.check_installed", lambda *a: None)
    assert AimTracker("r", "runs").aim_repo_path == "runs"
    tracker = AimTracker("r", repo="elsewhere", experiment="e")
    assert (tracker.aim_repo_path, tracker.init_kwargs) == ("elsewhere", {"experiment": "e"})
    assert AimTracker("r", "same", repo="same").aim_repo_path == "same"
    with pytest.raises(ValueError, match="both name the Aim repository; pass one"):
        AimTracker("r", "runs", repo="elsewhere")


@needs("comet_ml", "comet-ml")
def test_comet_offline_archive_reads_back(tmp_path: Path) -> None:
    import comet_ml
    from comet_ml.messages import MetricMessage, ParameterMessage

    quiet = comet_ml.ExperimentConfig(
        offline_directory=str(tmp_path), auto_metric_logging=False, auto_param_logging=False,
        auto_output_logging=None, log_env_details=False, log_env_gpu=False, log_env_host=False,
        log_env_cpu=False, log_env_network=False, log_env_disk=False, log_code=False,
        log_git_metadata=False, log_git_patch=False, display_summary_level=0)
    run = init_trackers("comet_ml", "proj", {"lr": 0.1}, init_kwargs={
        "comet_ml": {"online": False, "experiment_config": quiet}})
    assert run.get_tracker("comet_ml", unwrap=True).project_name == "proj"
    run.log({"loss": torch.tensor(0.5), "note": "hello"}, step=1)
    run.log({"loss": 0.25, "pair": {"a": 1.0, "b": 2.0}}, step=2)
    with pytest.warns(UserWarning, match="'w' is a list, not a number"):
        run.log({"w": [1, 2]}, step=3)
    run.end_training()

    (archive,) = tmp_path.glob("*.zip")
    with zipfile.ZipFile(archive) as zipped:
        messages = [json.loads(line) for line in zipped.read("messages.json").splitlines()]
        assert json.loads(zipped.read("experiment.json"))["project_name"] == "proj"
    metrics = [MetricMessage.from_message_dict(m["payload"]).metric for m in messages
               if m["type"] == MetricMessage.type]
    assert [(m["metricName"], m["step"], m["metricValue"]) for m in metrics
            if not m["metricName"].startswith("sys.")] == [
        ("loss", 1, 0.5), ("loss", 2, 0.25), ("a", 2, 1.0), ("b", 2, 2.0)]
    params = [ParameterMessage.from_message_dict(m["payload"]).param for m in messages
              if m["type"] == ParameterMessage.type]
    assert {"paramName": "lr", "paramValue": 0.1} in [
        {k: p[k] for k in ("paramName", "paramValue")} for p in params]
    others = {m["payload"]["key"]: m["payload"]["value"] for m in messages
              if m["type"] == "log_other"}
    assert others["note"] == "hello"


# -- names, probes, errors -----------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SERVICES))
def test_missing_library_names_the_extra(name: str, monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    module, extra, cls = SERVICES[name]
    monkeypatch.setitem(sys.modules, module, None)  # imports and probes now fail as if absent
    message = rf"{module} is needed .* `pip install 'accel\[{extra}\]'`"
    with pytest.raises(ModuleNotFoundError, match=message):
        Accelerator(cpu=True, log_with=name, project_dir=str(tmp_path))  # on every rank
    with pytest.raises(ModuleNotFoundError, match=message):
        init_trackers([name], "p", None, tmp_path, is_main=False)
    with pytest.raises(ModuleNotFoundError, match=message):
        cls("p")
    assert name not in available_trackers()
    assert getattr(probes, f"is_{name}_available")() is False
    assert name not in init_trackers("all", "p", None, tmp_path, is_main=False).names


def test_available_trackers_agree_with_the_probes() -> None:
    listed = available_trackers()
    assert listed[:2] == ["jsonl", "csv"]
    for name in SERVICES:
        assert (name in listed) is getattr(probes, f"is_{name}_available")()
    assert ("tensorboard" in listed) is is_available("tensorboard")


def test_logger_type_names_trackers(tmp_path: Path) -> None:
    assert UtilsLoggerType is LoggerType and f"{LoggerType.COMETML}" == "comet_ml"
    wanted = [name for name in SERVICES if is_available(SERVICES[name][0])]
    members = [LoggerType(name) for name in wanted]
    assert init_trackers(members + ["jsonl"], "p", None, tmp_path, is_main=False).names == (
        *wanted, "jsonl")
    assert init_trackers(LoggerType.ALL, "p", None, tmp_path, is_main=False).names == tuple(
        available_trackers())
    # every tracker Accelerate names is built in, under Accelerate's class name
    assert {f"{member}" for member in LoggerType} - {"all"} <= set(LOGGER_TYPE_TO_CLASS)
    assert {LOGGER_TYPE_TO_CLASS[name] for name in SERVICES} == {
        cls for _, _, cls in SERVICES.values()}


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_tracker_used_before_init_trackers_says_so(name: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("accel.tracking.services.check_installed", lambda *a: None)
    monkeypatch.setattr("accel.tracking.more_services.check_installed", lambda *a: None)
    tracker = SERVICES[name][2]("p")
    assert tracker.name == name
    with pytest.raises(RuntimeError, match=f"the {name} tracker has no run yet.*init_trackers"):
        tracker.log({"loss": 1.0}, step=1)
    with pytest.raises(RuntimeError, match="has no run yet"):
        _ = tracker.tracker


