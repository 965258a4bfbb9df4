"""Trackers: exact jsonl/csv contents, main-only writing, log_with resolution, tensorboard."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from accel._base.optional import is_available
from accel.tracking import CSVTracker, GeneralTracker, TrackerSet, available_trackers, init_trackers


class Recorder(GeneralTracker):
    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def store_init_configuration(self, config: Any) -> None:
        self.calls.append(("config", dict(config)))

    def log(self, values: Any, step: int | None = None, **kwargs: Any) -> None:
        self.calls.append(("log", dict(values), step, kwargs))

    def finish(self) -> None:
        self.calls.append(("finish",))


class EveryRank(Recorder):
    name = "every_rank"
    main_process_only = False


def test_jsonl_exact_contents_and_config(tmp_path: Path) -> None:
    config = {"lr": 0.1, "layers": [2, 3], "out": tmp_path / "o", "wd": torch.tensor(0.5)}
    run = init_trackers("jsonl", "exp", config, tmp_path, is_main=True)
    run.log({"loss": torch.tensor(0.5), "acc": np.float32(0.25), "n": 3, "tag": "a"}, step=1)
    run.log({"loss": float("nan"), "ok": True})
    run.end_training()
    lines = (tmp_path / "exp" / "metrics.jsonl").read_text().splitlines()
    assert lines == ['{"step": 1, "loss": 0.5, "acc": 0.25, "n": 3, "tag": "a"}',
                     '{"step": null, "loss": NaN, "ok": true}']
    assert json.loads((tmp_path / "exp" / "config.json").read_text()) == {
        "lr": 0.1, "layers": [2, 3], "out": str(tmp_path / "o"), "wd": 0.5}
    assert run.get_tracker("jsonl", unwrap=True) == tmp_path / "exp" / "metrics.jsonl"


def test_csv_exact_contents_new_keys_widen_the_header(tmp_path: Path) -> None:
    run = init_trackers(["csv"], "exp", None, tmp_path, is_main=True)
    run.log({"loss": 1.5, "lr": 0.1}, step=0)
    run.log({"loss": 1.25}, step=1)
    run.log({"acc": 0.5, "loss": 1.0, "note": "a,b"}, step=2)
    run.end_training()
    path = tmp_path / "exp" / "metrics.csv"
    assert path.read_text() == ("step,loss,lr,acc,note\n0,1.5,0.1,,\n1,1.25,,,\n"
                                '2,1.0,,0.5,"a,b"\n')
    assert not (tmp_path / "exp" / "config.json").exists()
    resumed = CSVTracker("exp", tmp_path)  # a resumed run appends under the same header
    resumed.log({"lr": 0.01}, step=3)
    assert path.read_text().splitlines()[-1] == "3,,0.01,,"
    path.write_text("epoch,loss\n1,2\n")
    with pytest.raises(ValueError, match="does not start with 'step'"):
        CSVTracker("exp", tmp_path)


def test_only_the_main_process_writes(tmp_path: Path) -> None:
    recorder, every = Recorder(), EveryRank()
    run = init_trackers(["jsonl", "csv", recorder, every], "exp", {"a": 1}, tmp_path,
                        is_main=False)
    run.log({"loss": 1.0}, step=1)
    run.end_training()
    assert list(tmp_path.iterdir()) == []
    assert recorder.calls == []
    assert every.calls == [("config", {"a": 1}), ("log", {"loss": 1.0}, 1, {}), ("finish",)]
    stand_in = run.get_tracker("jsonl", unwrap=True)
    assert stand_in.add_scalar("x", 1) is None  # any method: a no-op on non-main ranks
    assert run.get_tracker("recorder").log({"x": 1}) is None
    with pytest.raises(ValueError, match=r"no tracker named 'wandb'.*'jsonl', 'csv'"):
        run.get_tracker("wandb")


def test_custom_tracker_gets_converted_values_and_options(tmp_path: Path) -> None:
    recorder = Recorder()
    run = init_trackers(recorder, "exp", {"lr": 1}, is_main=True)
    run.log({"loss": torch.tensor(2.0), "img": [1, 2]}, step=5,
            log_kwargs={"recorder": {"commit": False}})
    assert run.get_tracker("recorder") is recorder
    assert run.trackers == [recorder]
    run.end_training()
    run.end_training()  # idempotent
    assert recorder.calls == [("config", {"lr": 1}),
                              ("log", {"loss": 2.0, "img": [1, 2]}, 5, {"commit": False}),
                              ("finish",)]
    with pytest.raises(RuntimeError, match="after end_training"):
        run.log({"loss": 1.0})


def test_log_with_resolution_and_errors(tmp_path: Path) -> None:
    # "all" starts every installed tracker (wandb too, where installed): checked off-main here
    assert init_trackers("all", "p", None, tmp_path, is_main=False).names == tuple(
        available_trackers())
    assert init_trackers(["jsonl", "jsonl"], "p", None, tmp_path).names == ("jsonl",)
    assert init_trackers(None, "p").names == ()
    with pytest.raises(ValueError, match=r"unknown tracker 'nonsense'.*'jsonl', 'csv', "
                                         r"'tensorboard', 'wandb', 'comet_ml', 'aim', 'mlflow', "
                                         r"'clearml', 'dvclive', 'swanlab', 'trackio', "
                                         r"or a GeneralTracker"):
        init_trackers(["jsonl", "nonsense"], "p", None, tmp_path)
    with pytest.raises(ValueError, match="Logging with `jsonl` requires a `logging_dir`"):
        init_trackers("jsonl", "p", None, None, is_main=False)  # checked on every rank
    with pytest.raises(ValueError, match=r"init_kwargs names tracker\(s\) \['csv'\]"):
        init_trackers("jsonl", "p", None, tmp_path, init_kwargs={"csv": {}})
    with pytest.raises(ValueError, match=r"more than once"):
        init_trackers([Recorder(), Recorder()], "p")
    with pytest.raises(ValueError, match="has no `name`"):
        init_trackers(type("Nameless", (Recorder,), {"name": ""})(), "p")
    with pytest.raises(ValueError, match="project_name"):
        init_trackers("jsonl", "", None, tmp_path)
    run = init_trackers("jsonl", "p", None, tmp_path)
    with pytest.raises(ValueError, match=r"log_kwargs names tracker\(s\) \['csv'\]"):
        run.log({"a": 1}, log_kwargs={"csv": {}})
    TrackerSet().log({"loss": 1.0})  # nothing requested: nothing to do


def test_value_errors_name_the_key(tmp_path: Path) -> None:
    run = init_trackers(["jsonl", "csv"], "p", None, tmp_path)
    with pytest.raises(TypeError, match=r"values\['w'\] is a Tensor of shape \(3,\)"):
        run.log({"w": torch.ones(3)})
    with pytest.raises(TypeError, match=r"values\['d'\] is a dict"):
        run.log({"d": {"a": 1}})
    with pytest.raises(ValueError, match="key 'step'"):
        run.log({"step": 3})
    with pytest.raises(TypeError, match="expects a dict"):
        run.log([("a", 1)])  # type: ignore[arg-type]


def test_missing_tensorboard_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import now fails as if absent
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'accel\[tensorboard\]'"):
        init_trackers("tensorboard", "p", None, tmp_path, is_main=False)


@pytest.mark.skipif(not is_available("tensorboard"),
                    reason="tensorboard is not installed (pip install 'accel[tensorboard]')")
def test_tensorboard_writes_readable_events(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    run = init_trackers("tensorboard", "exp", {"lr": 0.1, "layers": [2]}, tmp_path)
    assert isinstance(run.get_tracker("tensorboard", unwrap=True), SummaryWriter)
    run.log({"loss": torch.tensor(0.5), "note": "hello"}, step=1)
    run.log({"loss": 0.25, "pair": {"a": 1.0, "b": 2.0}}, step=2)
    run.get_tracker("tensorboard").log_images({"batch": np.zeros((2, 3, 4, 4))}, step=2)
    run.get_tracker("tensorboard").log_images({"hwc": np.ones((1, 4, 4, 3))}, step=3,
                                              dataformats="NHWC")
    run.end_training()
    events = EventAccumulator(str(tmp_path / "exp"))
    events.Reload()
    loss = [(e.step, e.value) for e in events.Scalars("loss")]
    assert loss == [(1, 0.5), (2, 0.25)]
    assert "note/text_summary" in events.Tags()["tensors"]
    batch = events.Images("batch")  # add_images: one image summary of the batch
    assert [(e.step, e.width, e.height) for e in batch] == [(2, 8, 4)]  # 2 images, tiled
    assert [(e.step, e.width, e.height) for e in events.Images("hwc")] == [(3, 4, 4)]
    assert (tmp_path / "exp" / "pair_a").is_dir()  # add_scalars writes one run per key
    assert not list(tmp_path.glob("*/*.csv"))
    off_main = init_trackers("tensorboard", "exp2", None, tmp_path, is_main=False)
    off_main.log({"loss": 1.0}, step=1)
    assert not (tmp_path / "exp2").exists()


def test_log_and_get_tracker_before_init_follow_accelerate(tmp_path: Path) -> None:
    """The common script calls init_trackers under `if is_main_process:` and log on every rank."""
    import warnings as _warnings

    from accel import Accelerator

    acc = Accelerator(cpu=True, log_with="jsonl", project_dir=str(tmp_path))
    with pytest.warns(UserWarning, match="log\\(\\) before init_trackers"):
        acc.log({"loss": 1.0})  # main process: dropped, said once
    with _warnings.catch_warnings():
        _warnings.simplefilter("error")
        acc.log({"loss": 2.0})  # not repeated
    assert acc.trackers == []
    stand_in = acc.get_tracker("jsonl", unwrap=True)
    stand_in.log({"x": 1})  # a do-nothing stand-in, as Accelerate's blank tracker
    off_main = TrackerSet.pending(is_main=False)
    with _warnings.catch_warnings():
        _warnings.simplefilter("error")
        off_main.log({"loss": 1.0})  # other ranks: silent no-op
    acc.init_trackers("run")
    acc.log({"loss": 3.0}, step=1)
    acc.end_training()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and '"loss": 3.0' in lines[0]


def test_on_main_process_decorator_reads_the_rank_at_call_time() -> None:
    from accel.tracking import on_main_process
    from accel.utils import patch_environment

    class Tracker:
        def __init__(self, main_process_only: bool) -> None:
            self.main_process_only = main_process_only
            self.calls: list[int] = []

        @on_main_process
        def log(self, value: int) -> str:
            self.calls.append(value)
            return "logged"

    everywhere, main_only = Tracker(False), Tracker(True)
    assert main_only.log(1) == "logged" and Tracker.log.__name__ == "log"
    rank1 = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    with patch_environment(**rank1):
        assert main_only.log(2) is None
        assert everywhere.log(3) == "logged"
    assert main_only.calls == [1] and everywhere.calls == [3]


class _Run(GeneralTracker):
    """A tracker that records its life, and fails to start when asked to."""

    def __init__(self, name: str, events: list[str], fail: bool = False,
                 fail_finish: bool = False) -> None:
        self.name, self.events, self.fail, self.fail_finish = name, events, fail, fail_finish

    def start(self) -> None:
        if self.fail:
            raise ConnectionError(f"{self.name}: the service is unreachable")
        self.events.append(f"start {self.name}")

    def log(self, values: Any, step: int | None = None, **kwargs: Any) -> None:
        self.events.append(f"log {self.name}")

    def finish(self) -> None:
        self.events.append(f"finish {self.name}")
        if self.fail_finish:
            raise OSError(f"{self.name}: cannot flush")


def test_a_tracker_that_fails_to_start_leaves_no_other_run_open() -> None:
    events: list[str] = []
    trackers = [_Run("a", events), _Run("b", events, fail_finish=True), _Run("c", events, True),
                _Run("d", events)]
    with pytest.warns(UserWarning, match="'b' could not be finished.*cannot flush"), \
            pytest.raises(ConnectionError, match="c: the service is unreachable"):
        init_trackers(trackers, "exp")
    # a and b were started, so they are finished (newest first); d was never started
    assert events == ["start a", "start b", "finish b", "finish a"]


def test_logger_type_to_class_is_the_read_only_table_of_built_in_trackers() -> None:
    from accel.tracking import LOGGER_TYPE_TO_CLASS

    assert LOGGER_TYPE_TO_CLASS["csv"] is CSVTracker
    assert list(LOGGER_TYPE_TO_CLASS)[:3] == ["jsonl", "csv", "tensorboard"]
    assert {"wandb", "mlflow", "comet_ml", "aim"} <= set(LOGGER_TYPE_TO_CLASS)
    with pytest.raises(TypeError):
        LOGGER_TYPE_TO_CLASS["mine"] = Recorder  # type: ignore[index]


def test_a_file_tracker_without_a_logging_dir_is_refused_when_log_with_is_checked() -> None:
    from accel.tracking.trackers import check_log_with

    with pytest.raises(ValueError, match="Logging with `csv` requires a `logging_dir`.*project_dir"):
        check_log_with(["csv"])
    check_log_with("csv", logging_dir="runs")  # given: fine
    check_log_with(Recorder())  # an instance: built by the caller, nothing to check
    check_log_with("all")  # what can run: checked when the trackers start, as in Accelerate
    check_log_with(["all", Recorder()])


def test_the_project_name_may_be_none_only_for_tracker_instances(tmp_path: Path) -> None:
    tracker = Recorder()
    run = init_trackers(tracker, None, {"lr": 0.1})  # type: ignore[arg-type]
    run.log({"loss": 1.0}, step=0)
    assert tracker.calls == [("config", {"lr": 0.1}), ("log", {"loss": 1.0}, 0, {})]
    with pytest.raises(ValueError, match="project_name must be a non-empty string.*instances"):
        init_trackers(["jsonl", Recorder()], None, None, tmp_path)  # type: ignore[arg-type]
