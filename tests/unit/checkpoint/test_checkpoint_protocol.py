"""accel.checkpoint.protocol without an Accelerator, and the boundaries of the two subpackages.

The protocol works on a RunSnapshot, goes through the snapshot's model_io for model state, and
returns what the caller must apply (it mutates no run state besides loading into the objects).
Multi-process behaviour: tests/distributed/test_resume.py.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import accel
from accel.checkpoint import (
    CheckpointError,
    LoadedRun,
    RunSnapshot,
    check_registrable,
    load_run,
    load_tensors,
    read_manifest,
    save_run,
)
from accel.device import select_device
from accel.distributed import Communicator, ProcessContext

PACKAGE = Path(accel.__file__).resolve().parent / "checkpoint"


def _comm() -> Communicator:
    return Communicator(ProcessContext.single())


class _Counter:
    def __init__(self, n: int = 0) -> None:
        self.n = n

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = state["n"]


class _Wrapper(nn.Module):
    """Stands for a DDP/FSDP wrapper: only model_io knows how to reach the inner module."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner


class _InnerIO:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        self.calls.append("save")
        return dict(model.inner.state_dict())  # type: ignore[operator]

    def load_model_state_dict(self, model: nn.Module, state: dict[str, torch.Tensor],
                              strict: bool) -> Any:
        self.calls.append(f"load strict={strict}")
        return model.inner.load_state_dict(state, strict=strict)  # type: ignore[operator]


def _snapshot(model: nn.Module, io: _InnerIO, counter: _Counter, **changes: Any) -> RunSnapshot:
    snap = RunSnapshot(models=(model,), optimizers=(), schedulers=(), loaders=(),
                       custom=(counter,), scaler=_Counter(), model_io=io,
                       device=select_device(cpu=True), accumulation_step=1,
                       accumulation_steps=2, sync_gradients=True, optimizer_steps=7,
                       loaded_dir=None)
    return dataclasses.replace(snap, **changes)


class _NoScaler:
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise AssertionError("an empty scaler state is never written, so never loaded")


def test_save_and_load_through_model_io_return_what_the_caller_applies(tmp_path: Path) -> None:
    io, counter = _InnerIO(), _Counter(3)
    model = _Wrapper(nn.Linear(2, 2))
    snap = _snapshot(model, io, counter, scaler=_NoScaler())
    path = save_run(_comm(), snap=snap, output_dir=None, total_limit=None, project_dir=tmp_path, project_total_limit=None)
    manifest = read_manifest(path)
    assert path.name == "checkpoint_0" and manifest.step == 7
    assert manifest.accel_version == accel.__version__  # passed in by the protocol
    assert manifest.meta["accumulation_step"] == 1 and "scaler.json" not in manifest.files
    assert sorted(load_tensors(path, "model_0.safetensors")) == ["bias", "weight"]  # inner names

    before = {k: v.clone() for k, v in model.inner.state_dict().items()}
    with torch.no_grad():
        model.inner.weight.add_(1.0)
    counter.n = 0
    loaded = load_run(_comm(), snap=snap, input_dir=None, project_dir=tmp_path, strict=True)
    assert loaded == LoadedRun(path=path, accumulation_step=1, optimizer_steps=7)
    assert all(torch.equal(v, model.inner.state_dict()[k]) for k, v in before.items())
    assert counter.n == 3 and io.calls == ["save", "load strict=True"]


def test_total_limit_keeps_the_loaded_one_and_warns_with_an_output_dir(tmp_path: Path) -> None:
    snap = _snapshot(_Wrapper(nn.Linear(1, 1)), _InnerIO(), _Counter())
    first = save_run(_comm(), snap=snap, output_dir=None, total_limit=None, project_dir=tmp_path, project_total_limit=None)
    kept = dataclasses.replace(snap, loaded_dir=first)
    for _ in range(2):
        save_run(_comm(), snap=kept, output_dir=None, total_limit=1, project_dir=tmp_path, project_total_limit=5)  # total_limit wins over the project's
    assert sorted(p.name for p in first.parent.iterdir()) == ["checkpoint_0", "checkpoint_2"]
    with pytest.warns(UserWarning, match="total_limit=1.*ignored"):
        save_run(_comm(), snap=snap, output_dir=tmp_path / "explicit", total_limit=1, project_dir=tmp_path, project_total_limit=None)
    mid_group = dataclasses.replace(snap, sync_gradients=False)
    with pytest.warns(UserWarning, match="micro-step 1 of 2"):
        save_run(_comm(), snap=mid_group, output_dir=tmp_path / "explicit", total_limit=None, project_dir=None, project_total_limit=None)


def test_missing_project_dir_and_missing_checkpoints_say_what_to_do(tmp_path: Path) -> None:
    snap = _snapshot(_Wrapper(nn.Linear(1, 1)), _InnerIO(), _Counter())
    with pytest.raises(ValueError, match="needs Accelerator\\(project_dir"):
        save_run(_comm(), snap=snap, output_dir=None, total_limit=None, project_dir=None, project_total_limit=None)
    assert load_run(_comm(), snap=snap, input_dir=None, project_dir=tmp_path, missing_ok=True) is None
    with pytest.raises(FileNotFoundError, match="missing_ok=True"):
        load_run(_comm(), snap=snap, input_dir=None, project_dir=tmp_path)
    path = save_run(_comm(), snap=snap, output_dir=None, total_limit=None, project_dir=tmp_path, project_total_limit=None)
    (path / "custom_0.json").write_text("{}")
    with pytest.raises(CheckpointError, match="custom_0"):
        load_run(_comm(), snap=snap, input_dir=path, project_dir=None)


def test_check_registrable_names_the_type() -> None:
    counter = _Counter()
    assert check_registrable(counter) is counter
    with pytest.raises(TypeError, match="int has no state_dict"):
        check_registrable(3)


def _accel_imports(path: Path) -> set[str]:
    """Every module an accel source file imports (lazy and TYPE_CHECKING ones too)."""
    name = ".".join(path.relative_to(PACKAGE.parent.parent).with_suffix("").parts)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found |= {f"{module}.{alias.name}" for alias in node.names}  # names may be modules
    return found


def test_storage_knows_no_collectives_and_protocol_no_facade() -> None:
    storage = {i for p in (PACKAGE / "storage").glob("*.py") for i in _accel_imports(p)}
    assert not {i for i in storage if i.startswith(("torch.distributed", "accel"))
                and not i.startswith(("accel.checkpoint.storage", "accel._base.version",
                                      "accel._base.warn"))}  # warn: stdlib only
    protocol = {i for p in (PACKAGE / "protocol").glob("*.py") for i in _accel_imports(p)}
    allowed = ("accel.checkpoint.storage", "accel.checkpoint.protocol",
               "accel.checkpoint.sharded", "accel.run.rng",
               "accel.distributed", "accel.device", "accel._base.tree", "accel._base.version",
               "accel._base.warn", "accel.config")
    assert {i for i in protocol if i.startswith("accel") and not i.startswith(allowed)} == set()


def _facade_load(snap: RunSnapshot, path: Path) -> Any:
    """Stands for Accelerator.load_state: warnings must name the line that calls it."""
    return load_run(_comm(), snap=snap, input_dir=path, project_dir=None, strict=False)


def test_lenient_load_warnings_name_the_caller_of_the_facade(tmp_path: Path) -> None:
    snap = _snapshot(_Wrapper(nn.Linear(2, 2)), _InnerIO(), _Counter())
    path = save_run(_comm(), snap=snap, output_dir=tmp_path / "ckpt", total_limit=None, project_dir=None, project_total_limit=None)
    (path / "custom_0.json").write_text("{}")  # corrupt: skipped with a warning
    other = _snapshot(_Wrapper(nn.Sequential(nn.Linear(2, 2))), _InnerIO(), _Counter())
    with pytest.warns(UserWarning) as caught:
        _facade_load(other, path)  # different key names: a missing/unexpected keys warning
    messages = {str(w.message).split(": ", 2)[-1][:20]: Path(w.filename).name for w in caught}
    assert len(messages) == 2 and set(messages.values()) == {Path(__file__).name}, messages


def _facade_save(comm: Communicator, snap: RunSnapshot, path: Path, attendance: Any) -> Path:
    """Stands for Accelerator.save_state: warnings must name the line that calls it."""
    return save_run(comm, snap=snap, output_dir=path, total_limit=None, project_dir=None, project_total_limit=None, attendance=attendance)


def test_main_only_save_writes_alone_and_a_late_rank_takes_its_outcome(tmp_path: Path) -> None:
    """No collective on either side (there is no process group here): rank 0 waits for rank 1,
    level with it and silent, then saves alone; rank 1 calls after all and shares the outcome."""
    from datetime import timedelta

    import torch.distributed as dist

    from accel.distributed.health.attendance import Attendance
    from accel.distributed.health.stall import CollectiveMonitor

    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30),
                          wait_for_workers=False)
    monitors = [CollectiveMonitor(r, 2, store, threshold=4.0) for r in (0, 1)]
    zero, one = (Attendance(m, level_wait=0.3) for m in monitors)
    comms = [Communicator(ProcessContext(rank=r, local_rank=r, world_size=2, local_world_size=2,
                                         node_rank=0, device=torch.device("cpu"), backend="gloo",
                                         launcher="none"))
             for r in (0, 1)]
    snap = _snapshot(_Wrapper(nn.Linear(2, 2)), _InnerIO(), _Counter(5))
    try:
        monitors[1].publish_progress()
        with pytest.warns(UserWarning, match="neither called it nor went on") as caught:
            path = _facade_save(comms[0], snap, tmp_path / "ckpt", zero)
        assert [Path(w.filename).name for w in caught] == [Path(__file__).name]
        manifest = read_manifest(path)
        assert manifest.world_size == 2 and manifest.meta["absent_rank_states"] == [1]
        assert not [f for f in manifest.files if f.startswith("rank_1/")]
        with pytest.warns(UserWarning, match="after the main process had started") as caught:
            assert _facade_save(comms[1], snap, tmp_path / "ckpt", one) == path
        assert [Path(w.filename).name for w in caught] == [Path(__file__).name]
    finally:
        for monitor in monitors:
            monitor.close()
