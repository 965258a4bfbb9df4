"""Trackers of services across two real processes: started on the main process only (the
common ``if accelerator.is_main_process: init_trackers(...)`` script), ``log`` on every rank, and
each service records the main process's values exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from accel._base.optional import is_available
from tests.spawn import run_workers
from tests.wandb_files import wandb_config, wandb_history, wandb_records

pytestmark = pytest.mark.skipif(
    not (is_available("wandb") and is_available("mlflow")),
    reason="needs wandb and mlflow (pip install 'accel[wandb,mlflow]')")


def _worker(rank: int, root: str) -> dict[str, Any]:
    import warnings

    from accel import Accelerator

    accelerator = Accelerator(cpu=True, log_with=["wandb", "mlflow"])
    if accelerator.is_main_process:
        accelerator.init_trackers("proj", config={"lr": 0.1},
                                  init_kwargs={"wandb": {"name": "main"}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            accelerator.log({"loss": 100.0 * rank + step}, step=step)  # rank 1's never recorded
        run = accelerator.get_tracker("wandb", unwrap=True)
        accelerator.get_tracker("mlflow").log_artifact(str(Path(root) / "notes.txt"))
        mlflow_run = accelerator.get_tracker("mlflow", unwrap=True)
    trackers = [t.name for t in accelerator.trackers]
    accelerator.end_training()
    if accelerator.is_main_process:
        import wandb

        wandb.teardown()  # stop wandb's service process before this worker exits
    return {"warnings": [str(w.message) for w in caught], "trackers": trackers,
            "run": type(run).__name__,
            "mlflow_run": mlflow_run.info.run_id if accelerator.is_main_process else None}


def test_service_trackers_record_the_main_process_once(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for the reader here (MLflow 3.x)

    (tmp_path / "notes.txt").write_text("hello")
    uri = (tmp_path / "mlruns").as_uri()
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
           "WANDB_CONSOLE": "off", "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
           "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
           "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
           "MLFLOW_TRACKING_URI": uri, "MLFLOW_ALLOW_FILE_STORE": "true"}
    rank0, rank1 = run_workers(_worker, 2, args=(str(tmp_path),), extra_env=env, timeout=150)
    assert (rank0["warnings"], rank0["trackers"], rank0["run"]) == ([], ["wandb", "mlflow"], "Run")
    assert (rank1["warnings"], rank1["trackers"], rank1["run"]) == ([], [], "_NoOpTracker")
    assert rank1["mlflow_run"] is None

    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")  # one run, the main process's
    records = wandb_records(next(run_dir.glob("run-*.wandb")))
    history = [(step, row["loss"]) for step, row in wandb_history(records)]
    assert history == [(0, 0.0), (1, 1.0), (2, 2.0)]
    (start,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (start.project, start.display_name, wandb_config(records)["lr"]) == (
        "proj", "main", 0.1)

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
    assert run.info.run_id == rank0["mlflow_run"] and run.data.params == {"lr": "0.1"}
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [
        (0, 0.0), (1, 1.0), (2, 2.0)]
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["notes.txt"]
    assert run.data.metrics == {"loss": 2.0}  # the last value logged, from rank 0
