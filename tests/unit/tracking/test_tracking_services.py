"""Trackers of services (wandb, mlflow, comet_ml, aim): each writes a run, offline, that its own
library reads back; names, LoggerType, availability probes and missing-extra errors."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from accel import Accelerator
from accel._base.optional import is_available
from accel.device import availability as probes
from accel.tracking import (
    AimTracker,
    CometMLTracker,
    LoggerType,
    MLflowTracker,
    WandBTracker,
    available_trackers,
    init_trackers,
)
from accel.utils import LoggerType as UtilsLoggerType
from tests.spawn import clean_env
from tests.wandb_files import wandb_config, wandb_history, wandb_records

#: tracker name -> (module, pip extra, class)
SERVICES = {"wandb": ("wandb", "wandb", WandBTracker),
            "mlflow": ("mlflow", "mlflow", MLflowTracker),
            "comet_ml": ("comet_ml", "comet-ml", CometMLTracker),
            "aim": ("aim", "aim", AimTracker)}


def needs(module: str, extra: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not is_available(module),
                              reason=f"{module} is not installed (pip install 'accel[{extra}]')")


@pytest.fixture
def wandb_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """wandb writes offline under tmp_path (no network, no API key); its service is stopped."""
    for var, sub in (("WANDB_DIR", "runs"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data")):
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    yield tmp_path / "runs"
    import wandb

    wandb.teardown()


@needs("wandb", "wandb")
def test_wandb_offline_run_reads_back(wandb_offline: Path) -> None:
    import wandb

    accelerator = Accelerator(cpu=True, log_with="wandb")  # needs no project_dir
    accelerator.init_trackers("proj", config={"lr": torch.tensor(0.1), "layers": [2, 3]},
                              init_kwargs={"wandb": {"name": "first", "tags": ["demo"]}})
    run = accelerator.get_tracker("wandb", unwrap=True)
    assert isinstance(run, wandb.Run) and run.name == "first"
    run_dir = Path(run.dir).parent  # <WANDB_DIR>/wandb/offline-run-<time>-<id>/files
    tracker = accelerator.get_tracker("wandb")
    accelerator.log({"loss": torch.tensor(0.5), "acc": np.float32(0.25)}, step=1)
    accelerator.log({"loss": 0.25, "sample": wandb.Image(np.zeros((4, 4, 3), np.uint8))}, step=2)
    tracker.log_images({"grid": [np.full((4, 4, 3), v, np.uint8) for v in (9, 255)]}, step=3)
    tracker.log_table("preds", columns=["x", "label"], data=[[1, "a"], [2, "b"]], step=4)
    accelerator.end_training()
    # finish() returns before wandb's service process has written everything: stop the
    # service (it flushes and exits) before reading its files
    wandb.teardown()

    assert run_dir.parent == wandb_offline / "wandb" and run_dir.name.startswith("offline-run-")
    (data,) = run_dir.glob("run-*.wandb")
    records = wandb_records(data)
    (start,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (start.project, start.display_name, list(start.tags)) == ("proj", "first", ["demo"])
    config = wandb_config(records)
    assert (config["lr"], config["layers"]) == (pytest.approx(0.1), [2, 3])
    history = dict(wandb_history(records))
    assert [step for step, _ in wandb_history(records)] == [1, 2, 3, 4]
    assert (history[1]["loss"], history[1]["acc"], history[2]["loss"]) == (0.5, 0.25, 0.25)
    assert (history[2]["sample/_type"], history[2]["sample/width"]) == ("image-file", 4)
    assert (history[3]["grid/_type"], history[3]["grid/count"]) == ("images/separated", 2)
    assert (history[4]["preds/_type"], history[4]["preds/nrows"]) == ("table-file", 2)
    table = json.loads((run_dir / "files" / history[4]["preds/path"]).read_text())
    assert (table["columns"], table["data"]) == (["x", "label"], [[1, "a"], [2, "b"]])
    assert len(list((run_dir / "files" / "media" / "images").glob("*.png"))) == 3


@needs("mlflow", "mlflow")
def test_mlflow_run_reads_back_through_mlflow_client(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    # A file store: MLflow's default sqlite store spends ~5 s creating its tables on 2 cores.
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.x keeps it opt-in
    accelerator = Accelerator(cpu=True, log_with=[LoggerType.MLFLOW])
    with pytest.warns(UserWarning, match="'long' is longer than MLflow's 6000 characters"):
        accelerator.init_trackers(
            "proj", config={"lr": 0.1, "long": "x" * 6001},
            init_kwargs={"mlflow": {"run_name": "first", "tags": {"team": "a"},
                                    "logging_dir": str(tmp_path / "artifacts")}})
    run_id = accelerator.get_tracker("mlflow", unwrap=True).info.run_id
    with pytest.warns(UserWarning, match="'note' is a str; MLflow metrics are numbers") as caught:
        accelerator.log({"loss": torch.tensor(0.5), "note": "text"}, step=1)
        accelerator.log({"loss": 0.25, "note": "again"}, step=2)
    assert len(caught) == 1  # once per key
    (tmp_path / "notes.txt").write_text("hello")
    accelerator.get_tracker("mlflow").log_artifact(str(tmp_path / "notes.txt"))
    accelerator.end_training()

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("proj")
    assert experiment.artifact_location.endswith("artifacts")
    run = client.get_run(run_id)
    assert (run.info.experiment_id, run.info.run_name, run.info.status) == (
        experiment.experiment_id, "first", "FINISHED")
    assert run.data.params == {"lr": "0.1"} and run.data.tags["team"] == "a"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [
        (1, 0.5), (2, 0.25)]
    assert [a.path for a in client.list_artifacts(run_id)] == ["notes.txt"]


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


@needs("aim", "aim")
def test_aim_repository_reads_back(tmp_path: Path) -> None:
    from aim import Repo
    from aim.sdk.index_manager import RepoIndexManager
    from aim.storage.context import Context

    accelerator = Accelerator(cpu=True, log_with="aim", project_dir=str(tmp_path))
    accelerator.init_trackers("proj", config={"lr": 0.1, "layers": [2, 3]}, init_kwargs={
        "aim": {"system_tracking_interval": None, "capture_terminal_logs": False}})
    accelerator.log({"loss": torch.tensor(0.5)}, step=1)
    accelerator.log({"loss": 0.25}, step=2)
    accelerator.get_tracker("aim").log_images(
        {"sample": (np.zeros((4, 4, 3), np.uint8), "black")}, step=3)
    accelerator.end_training()

    repo = Repo(str(tmp_path))
    (run_hash,) = repo.list_all_runs()
    RepoIndexManager.get_index_manager(repo).index(run_hash)  # what `aim up` does for readers
    run = repo.get_run(run_hash)
    assert (run.name, run["hparams"]) == ("proj", {"lr": 0.1, "layers": [2, 3]})
    loss = run.get_metric("loss", Context({}))
    assert (loss.data.indices_list(), loss.values.values_list()) == ([1, 2], [0.5, 0.25])
    images = run.get_image_sequence("sample", Context({}))
    (image,) = images.values.values_list()
    assert (images.data.indices_list(), image.caption, image.to_pil_image().size) == (
        [3], "black", (4, 4))


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
    wanted = [name for name in ("wandb", "mlflow", "comet_ml", "aim") if is_available(name)]
    members = [LoggerType(name) for name in wanted]
    assert init_trackers(members + ["jsonl"], "p", None, tmp_path, is_main=False).names == (
        *wanted, "jsonl")
    assert init_trackers(LoggerType.ALL, "p", None, tmp_path, is_main=False).names == tuple(
        available_trackers())
    for member in (LoggerType.TRACKIO, LoggerType.CLEARML, LoggerType.DVCLIVE, "swanlab"):
        with pytest.raises(ValueError, match=rf"{member}' is one of Accelerate's that accel "
                                             r"does not have yet; use 'jsonl'.*'wandb'"):
            Accelerator(cpu=True, log_with=[member])


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_tracker_used_before_init_trackers_says_so(name: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("accel.tracking.services.check_installed", lambda *a: None)
    tracker = SERVICES[name][2]("p")
    assert tracker.name == name
    with pytest.raises(RuntimeError, match=f"the {name} tracker has no run yet.*init_trackers"):
        tracker.log({"loss": 1.0}, step=1)
    with pytest.raises(RuntimeError, match="has no run yet"):
        _ = tracker.tracker


def test_requesting_trackers_imports_no_library(tmp_path: Path) -> None:
    """Accelerator(log_with=...) runs on every rank: it checks the libraries are installed
    without importing them (wandb/mlflow/aim take about a second each to import)."""
    code = ("import sys; from accel import Accelerator; from accel.tracking import "
            "available_trackers as a; "
            f"Accelerator(cpu=True, log_with=a(), project_dir={str(tmp_path)!r}); "
            "print(sorted(m for m in ('wandb', 'mlflow', 'comet_ml', 'aim') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120, env=clean_env(tmp_path))
    assert out.stdout.strip() == "[]", out.stderr
