"""Trackers of services whose libraries start processes when a run starts (wandb's service
process, git for the run's source information): each writes a run, offline, that its own library
reads back (moved out of tests/unit/tracking/test_tracking_services.py, which starts no
processes)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from accel import Accelerator
from accel._base.optional import is_available
from accel.tracking import LoggerType
from tests.wandb_files import wandb_config, wandb_history, wandb_records


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
