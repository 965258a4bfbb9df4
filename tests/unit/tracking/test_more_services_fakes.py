"""The clearml, dvclive, swanlab and trackio trackers against fake libraries.

Each fake is a module put in ``sys.modules`` under the library's name (with a module spec, so
accel's availability probe finds it) whose classes have the signatures of the real ones and
record every call; they run whether the real libraries are installed or not (the real,
offline read-backs are in test_more_services_offline.py and, for clearml, whose runs start
processes, tests/e2e/tracking/test_more_tracker_services.py).
"""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch

from accel import Accelerator
from accel.tracking import (
    ClearMLTracker,
    DVCLiveTracker,
    SwanLabTracker,
    TrackioTracker,
    available_trackers,
    init_trackers,
)

Calls = list[tuple[Any, ...]]


def fake_module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> ModuleType:
    module = ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


# -- clearml -------------------------------------------------------------------------------------
@pytest.fixture
def clearml(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """A fake ``clearml``: ``Task.init``/``current_task`` and the ``Logger`` report methods."""
    calls: Calls = []

    class Logger:
        def report_scalar(self, title: str, series: str, value: float, iteration: int,
                          **extra: Any) -> None:
            calls.append(("scalar", title, series, value, iteration, extra))

        def report_single_value(self, name: str, value: float, **extra: Any) -> None:
            calls.append(("single", name, value, extra))

        def report_image(self, title: str, series: str, iteration: int | None = None,
                         image: Any = None, **extra: Any) -> None:
            calls.append(("image", title, series, iteration, image, extra))

        def report_table(self, title: str, series: str, iteration: int | None = None,
                         table_plot: Any = None, **extra: Any) -> None:
            calls.append(("table", title, series, iteration, table_plot, extra))

    class Task:
        running: ClassVar[Task | None] = None

        def __init__(self, options: dict[str, Any]) -> None:
            self.options = options

        @classmethod
        def current_task(cls) -> Task | None:
            return cls.running

        @classmethod
        def init(cls, project_name: str | None = None, task_name: str | None = None,
                 **options: Any) -> Task:
            calls.append(("init", project_name, task_name, options))
            return cls(options)

        def get_logger(self) -> Logger:
            return Logger()

        def connect_configuration(self, configuration: dict[str, Any]) -> dict[str, Any]:
            calls.append(("config", configuration))
            return configuration

        def close(self) -> None:
            calls.append(("close",))

    monkeypatch.delenv("CLEARML_PROJECT", raising=False)
    monkeypatch.delenv("CLEARML_TASK", raising=False)
    fake_module(monkeypatch, "clearml", Task=Task)
    yield SimpleNamespace(Task=Task, calls=calls)


def test_clearml_starts_when_init_trackers_runs_on_the_main_process(
        clearml: SimpleNamespace) -> None:
    assert "clearml" in available_trackers()  # so log_with="all" takes it
    accelerator = Accelerator(cpu=True, log_with="clearml")
    tracker = ClearMLTracker("built")
    assert clearml.calls == []  # deferred: nothing opens before init_trackers/start
    assert init_trackers("clearml", "proj", {"lr": 0.1}, is_main=False).trackers == []
    assert clearml.calls == []  # other ranks open no task
    accelerator.init_trackers("proj", config={"lr": torch.tensor(0.5), "out": Path("o")},
                              init_kwargs={"clearml": {"tags": ["a"]}})
    task = accelerator.get_tracker("clearml", unwrap=True)
    assert isinstance(task, clearml.Task) and accelerator.get_tracker("clearml").task is task
    accelerator.log({"loss": 1.0}, step=2)
    accelerator.end_training()
    assert clearml.calls == [("init", "proj", "proj", {"tags": ["a"]}),
                             ("config", {"lr": 0.5, "out": "o"}),
                             ("scalar", "loss", "train", 1.0, 2, {}), ("close",)]
    assert tracker.init_kwargs == {} and tracker.user_provided_run_name == "built"


def test_clearml_names_come_from_the_environment_then_init_kwargs(
        clearml: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEARML_PROJECT", "team")
    monkeypatch.setenv("CLEARML_TASK", "")  # empty: not set
    ClearMLTracker("proj").start()
    ClearMLTracker("proj", project_name="p", task_name="t").start()
    assert clearml.calls == [("init", "team", "proj", {}), ("init", "p", "t", {})]


def test_clearml_uses_and_leaves_open_the_task_the_script_opened(
        clearml: SimpleNamespace) -> None:
    clearml.Task.running = mine = clearml.Task({})
    run = init_trackers("clearml", "proj", is_main=True)
    assert run.get_tracker("clearml", unwrap=True) is mine
    run.end_training()
    assert clearml.calls == []  # neither Task.init nor close


def test_clearml_log_reports_scalars_by_prefix_and_single_values(
        clearml: SimpleNamespace) -> None:
    tracker = ClearMLTracker("proj")
    tracker.start()
    tracker.log({"loss": 1, "eval_loss": 2.0, "test_acc": 0.5, "train_lr": 0.1,
                 "evaluation": 3.0}, step=4, extra_option=True)
    with pytest.warns(UserWarning, match="clearml tracker: 'note' is a str; ClearML scalars are "
                                         "numbers, so it is not recorded"):
        tracker.log({"note": "text", "best": 0.25})
    tracker.log({"note": "again"})  # warned once per key
    assert clearml.calls[1:] == [
        ("scalar", "loss", "train", 1, 4, {"extra_option": True}),
        ("scalar", "loss", "eval", 2.0, 4, {"extra_option": True}),
        ("scalar", "acc", "test", 0.5, 4, {"extra_option": True}),
        ("scalar", "lr", "train", 0.1, 4, {"extra_option": True}),
        ("scalar", "evaluation", "train", 3.0, 4, {"extra_option": True}),
        ("single", "best", 0.25, {})]


def test_clearml_log_images_and_tables(clearml: SimpleNamespace) -> None:
    tracker = ClearMLTracker("proj")
    tracker.start()
    image = object()
    tracker.log_images({"eval_sample": image}, step=1, max_image_history=2)
    tracker.log_table("preds", columns=["x", "y"], data=[[1, 2]], step=3)
    tracker.log_table("test_rows", data=[["h"], [5]])
    frame = object()
    tracker.log_table("df", dataframe=frame)
    assert clearml.calls[1:] == [
        ("image", "sample", "eval", 1, image, {"max_image_history": 2}),
        ("table", "preds", "train", 3, [["x", "y"], [1, 2]], {}),
        ("table", "rows", "test", None, [["h"], [5]], {}),
        ("table", "df", "train", None, frame, {})]
    with pytest.raises(ValueError, match="either `data`.*or `dataframe`, not both"):
        tracker.log_table("t")
    with pytest.raises(ValueError, match="either `data`.*or `dataframe`, not both"):
        tracker.log_table("t", data=[[1]], dataframe=frame)
    with pytest.raises(ValueError, match="`dataframe` has its own column names"):
        tracker.log_table("t", columns=["a"], dataframe=frame)


# -- dvclive -------------------------------------------------------------------------------------
@pytest.fixture
def dvclive(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A fake ``dvclive``: ``Live`` and ``dvclive.plots.Metric.could_log`` (numbers, strings)."""
    calls: Calls = []

    class Live:
        def __init__(self, dir: str = "dvclive", **options: Any) -> None:  # noqa: A002
            calls.append(("Live", dir, options))
            self.step = 0

        def log_params(self, params: dict[str, Any]) -> None:
            calls.append(("params", params))

        def log_metric(self, name: str, val: Any, timestamp: bool = False,
                       plot: bool = True) -> None:
            calls.append(("metric", self.step, name, val, plot))

        def next_step(self) -> None:
            calls.append(("next",))
            self.step += 1

        def end(self) -> None:
            calls.append(("end",))

    class Metric:
        @staticmethod
        def could_log(val: object) -> bool:
            return isinstance(val, (int, float, str))

    fake_module(monkeypatch, "dvclive", Live=Live)
    fake_module(monkeypatch, "dvclive.plots", Metric=Metric)
    return SimpleNamespace(Live=Live, calls=calls)


def test_dvclive_logs_one_step_per_call(dvclive: SimpleNamespace) -> None:
    accelerator = Accelerator(cpu=True, log_with="dvclive")
    assert dvclive.calls == []
    accelerator.init_trackers("proj", {"lr": torch.tensor(0.5)},
                              init_kwargs={"dvclive": {"dir": "out", "report": None}})
    tracker = accelerator.get_tracker("dvclive")
    assert tracker.live is accelerator.get_tracker("dvclive", unwrap=True)
    assert tracker.run_name == "proj"
    accelerator.log({"loss": 0.5, "tag": "a"})
    with pytest.warns(UserWarning, match="'w' is a list; dvclive metrics are numbers or strings"):
        accelerator.log({"loss": 0.25, "w": [1]}, step=5, log_kwargs={"dvclive": {"plot": False}})
    accelerator.end_training()
    assert dvclive.calls == [
        ("Live", "out", {"report": None}), ("params", {"lr": 0.5}),
        ("metric", 0, "loss", 0.5, True), ("metric", 0, "tag", "a", True), ("next",),
        ("metric", 5, "loss", 0.25, False), ("next",), ("end",)]


def test_dvclive_logs_to_the_live_it_is_given(dvclive: SimpleNamespace) -> None:
    live = dvclive.Live("mine")
    tracker = DVCLiveTracker(live=live)
    tracker.start()
    assert tracker.tracker is live and dvclive.calls == [("Live", "mine", {})]
    with pytest.raises(ValueError, match=r"options \['dir'\] for a new one would not be used"):
        DVCLiveTracker(live=live, dir="elsewhere")


# -- swanlab and trackio -------------------------------------------------------------------------
def fake_run_library(monkeypatch: pytest.MonkeyPatch, name: str) -> SimpleNamespace:
    """A fake ``swanlab``/``trackio``: ``init(project=..., **options)`` returns a run with a
    ``config`` dict, ``log(data, step=None, **options)`` and ``finish()``; ``Image``."""
    calls: Calls = []

    class Run:
        def __init__(self) -> None:
            self.config: dict[str, Any] = {}

        def log(self, data: dict[str, Any], step: int | None = None, **options: Any) -> None:
            calls.append(("log", data, step, options))

        def finish(self) -> None:
            calls.append(("finish",))

    def init(project: str | None = None, **options: Any) -> Run:
        calls.append(("init", project, options))
        return Run()

    class Image:
        def __init__(self, data: Any) -> None:
            self.data = data

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Image) and other.data == self.data

    fake_module(monkeypatch, name, init=init, Image=Image)
    return SimpleNamespace(calls=calls, Image=Image)


@pytest.mark.parametrize(("name", "cls"), [("swanlab", SwanLabTracker),
                                           ("trackio", TrackioTracker)])
def test_run_trackers_open_a_run_per_project(name: str, cls: type, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    library = fake_run_library(monkeypatch, name)
    accelerator = Accelerator(cpu=True, log_with=name)
    assert library.calls == [] and cls("p").init_kwargs == {}
    assert init_trackers(name, "proj", is_main=False).trackers == []
    accelerator.init_trackers("proj", {"lr": torch.tensor(0.5)},
                              init_kwargs={name: {"name": "first"}})
    tracker = accelerator.get_tracker(name)
    assert isinstance(tracker, cls)
    run = accelerator.get_tracker(name, unwrap=True)
    assert tracker.run is run and run.config == {"lr": 0.5}  # no allow_val_change key
    accelerator.log({"loss": torch.tensor(0.25)}, step=3, log_kwargs={name: {"opt": 1}})
    accelerator.end_training()
    assert library.calls == [("init", "proj", {"name": "first"}),
                             ("log", {"loss": 0.25}, 3, {"opt": 1}), ("finish",)]


def test_swanlab_log_images_wraps_each_image(monkeypatch: pytest.MonkeyPatch) -> None:
    library = fake_run_library(monkeypatch, "swanlab")
    tracker = SwanLabTracker("proj")
    tracker.start()
    tracker.log_images({"samples": ["a", "b"]}, step=2, print_to_console=False)
    assert library.calls[1:] == [("log", {"samples": [library.Image("a"), library.Image("b")]},
                                  2, {"print_to_console": False})]
