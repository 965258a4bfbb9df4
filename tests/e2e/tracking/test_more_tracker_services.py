"""The clearml tracker with the real library, offline: ``Task.init`` starts processes (its
background reporter, git/hg for the repository), so this test is here rather than in
tests/unit/tracking (whose fakes test the same calls without clearml). The offline session
ClearML writes is read back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from accel import Accelerator


@pytest.fixture
def clearml_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """ClearML in offline mode with its cache (and so the offline session) under tmp_path."""
    pytest.importorskip("clearml", reason="clearml is not installed (pip install "
                                          "'accel[clearml]')")
    from clearml import Task

    monkeypatch.setenv("CLEARML_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CLEARML_PROJECT", raising=False)
    monkeypatch.delenv("CLEARML_TASK", raising=False)
    monkeypatch.chdir(tmp_path)  # no repository to analyse
    Task.set_offline(True)  # for the rest of this process: going online needs a server
    yield Task


def test_clearml_offline_session_reads_back(clearml_offline: Any) -> None:
    from clearml.config import get_offline_dir
    from clearml.utilities.config import text_to_config_dict

    quiet = {"auto_connect_frameworks": False, "auto_resource_monitoring": False,
             "auto_connect_arg_parser": False, "auto_connect_streams": False}
    accelerator = Accelerator(cpu=True, log_with="clearml")
    config = {"lr": torch.tensor(0.5), "flag": False, "name": "a"}
    accelerator.init_trackers("proj", config, init_kwargs={"clearml": quiet})
    task = accelerator.get_tracker("clearml", unwrap=True)
    assert task.name == "proj" and task.get_project_name() == "proj"
    with pytest.warns(UserWarning, match="'note' is a str; ClearML scalars are numbers"):
        accelerator.log({"loss": torch.tensor(0.25), "eval_acc": 0.5, "note": "x"}, step=1)
    accelerator.log({"best": 0.125})
    tracker = accelerator.get_tracker("clearml")
    tracker.log_images({"test_sample": np.eye(8, dtype=np.uint8) * 255}, step=1)
    tracker.log_table("preds", columns=["x", "y"], data=[[1, 2], [3, 4]], step=2)
    offline = Path(get_offline_dir(task_id=task.id))
    accelerator.end_training()

    session = json.loads((offline / "task.json").read_text())
    stored = text_to_config_dict(session["configuration"]["General"]["value"])
    assert stored == {"lr": 0.5, "flag": False, "name": "a"}
    events = [event for line in (offline / "metrics.jsonl").read_text().splitlines()
              for event in json.loads(line)]
    scalars = {(e["metric"], e["variant"], e.get("iter")): e.get("value") for e in events
               if e["type"] == "training_stats_scalar"}
    assert scalars[("loss", "train", 1)] == 0.25 and scalars[("acc", "eval", 1)] == 0.5
    summary = [(key[1], value) for key, value in scalars.items() if key[0] == "Summary"]
    assert summary == [("best", 0.125)] and len(scalars) == 3  # without a step: single values
    (table,) = [e for e in events if e["type"] == "plot"]
    plot = json.loads(table["plot_str"])
    assert (table["metric"], table["iter"]) == ("preds", 2)
    assert plot["data"][0]["header"]["values"] == ["x", "y"]
    assert len(list((offline / "data").rglob("*.jpeg"))) == 1
