"""The dvclive, swanlab and trackio trackers with the real libraries, offline, read back with
those libraries' own readers. Each test skips, saying which extra installs it, when its library is
absent (``accel[trackio]`` and ``accel[swanlab]`` are in the ``test`` extra; ``accel[dvclive]``,
which brings DVC itself, is not). None starts a process: swanlab's probes (git, pip, GPU tools)
are switched off, dvclive's DVC repository lookup is replaced (in a Git repository dvclive would
run ``dvc init`` there). clearml, whose runs start processes, is in
tests/e2e/tracking/test_more_tracker_services.py."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from accel import Accelerator


def library(name: str) -> object:
    return pytest.importorskip(name, reason=f"{name} is not installed (pip install "
                                            f"'accel[{name}]')")


@pytest.fixture
def trackio_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """trackio reads ``TRACKIO_DIR`` once, at import: point its modules' copies at tmp_path."""
    library("trackio")
    for attr, path in (("TRACKIO_DIR", tmp_path), ("MEDIA_DIR", tmp_path / "media"),
                       ("ARTIFACTS_DIR", tmp_path / "artifacts")):
        for name, module in list(sys.modules.items()):
            if (name == "trackio" or name.startswith("trackio.")) and hasattr(module, attr):
                monkeypatch.setattr(module, attr, path)
    return tmp_path


def test_trackio_local_run_reads_back(trackio_dir: Path) -> None:
    from trackio.sqlite_storage import SQLiteStorage

    accelerator = Accelerator(cpu=True, log_with="trackio")
    accelerator.init_trackers("proj", {"lr": torch.tensor(0.5), "layers": 2},
                              init_kwargs={"trackio": {"name": "first", "auto_log_cpu": False,
                                                       "auto_log_gpu": False}})
    run = accelerator.get_tracker("trackio", unwrap=True)
    assert (run.project, run.name) == ("proj", "first")
    accelerator.log({"loss": torch.tensor(0.25), "note": "a"}, step=1)
    accelerator.log({"loss": 0.125}, step=2)
    accelerator.end_training()
    assert SQLiteStorage.get_project_db_path("proj").parent == trackio_dir
    logs = SQLiteStorage.get_logs("proj", "first")
    assert [{k: v for k, v in row.items() if k != "timestamp"} for row in logs] == [
        {"loss": 0.25, "note": "a", "step": 1}, {"loss": 0.125, "step": 2}]
    config = SQLiteStorage.get_run_config("proj", "first")
    assert config is not None
    assert {k: v for k, v in config.items() if not k.startswith("_")} == {"lr": 0.5, "layers": 2}


def test_swanlab_offline_run_reads_back(tmp_path: Path) -> None:
    swanlab = library("swanlab")
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    quiet = swanlab.Settings(probe={probe: False for probe in (
        "hardware", "runtime", "requirements", "conda", "git", "swanlab", "monitor")})
    accelerator = Accelerator(cpu=True, log_with="swanlab")
    accelerator.init_trackers("proj", {"lr": 0.5}, init_kwargs={"swanlab": {
        "mode": "offline", "log_dir": str(tmp_path), "settings": quiet, "name": "first"}})
    run = accelerator.get_tracker("swanlab", unwrap=True)
    assert (run.name, run.mode) == ("first", "offline")
    accelerator.log({"loss": torch.tensor(0.25)}, step=1)
    accelerator.get_tracker("swanlab").log_images(
        {"samples": [np.zeros((4, 4, 3), np.uint8), np.full((4, 4, 3), 255, np.uint8)]}, step=2)
    accelerator.end_training()

    (run_dir,) = tmp_path.glob("run-*")
    assert "value: 0.5" in (run_dir / "files" / "config.yaml").read_text()
    reader = DataStoreReader()
    reader.open(next(run_dir.glob("*.swanlab")))
    records = []
    for raw in reader:
        record = Record()
        record.ParseFromString(raw)
        records.append(record)
    reader.close()
    assert {r.start.project for r in records if r.HasField("start")} == {"proj"}
    assert [(r.scalar.key, r.scalar.step, r.scalar.value.number) for r in records
            if r.HasField("scalar")] == [("loss", 1, 0.25)]
    assert [(r.media.key, r.media.step, len(r.media.value.items)) for r in records
            if r.HasField("media")] == [("samples", 2, 2)]
    assert len(list((run_dir / "media" / "image").glob("*.png"))) == 2


def test_dvclive_run_reads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    library("dvclive")
    from dvclive.serialize import load_yaml
    from dvclive.utils import parse_metrics

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("dvclive.live.get_dvc_repo", lambda: None)  # no `dvc init` anywhere
    accelerator = Accelerator(cpu=True, log_with="dvclive")
    accelerator.init_trackers("proj", {"lr": torch.tensor(0.5), "name": "a"}, init_kwargs={
        "dvclive": {"dir": str(tmp_path / "live"), "save_dvc_exp": False, "dvcyaml": None}})
    live = accelerator.get_tracker("dvclive").live
    accelerator.log({"loss": torch.tensor(0.5), "note": "x"})
    accelerator.log({"loss": 0.25, "note": "y"})
    with pytest.warns(UserWarning, match="'w' is a list; dvclive metrics are numbers"):
        accelerator.log({"loss": 0.125, "note": "z", "w": [1]}, step=5)
    accelerator.end_training()
    assert load_yaml(live.params_file) == {"lr": 0.5, "name": "a"}
    logs, latest = parse_metrics(live)
    assert latest == {"step": 5, "loss": 0.125, "note": "z"}
    loss = [(int(row["step"]), float(row["loss"])) for row in
            logs[str(Path(live.plots_dir) / "metrics" / "loss.tsv")]]
    assert loss == [(0, 0.5), (1, 0.25), (5, 0.125)]
    assert not (tmp_path / ".dvc").exists()
