"""``save_state(blocking=False)`` in one process: the snapshot is a copy taken at the call, the
wait points (next save, load, end_training, wait_for_checkpoint, the end of the interpreter),
errors raised at the next wait point with their cause, rotation, refusals. Multi-process runs
and kills: tests/distributed/test_async_checkpoint.py and tests/e2e/test_async_checkpoint.py; the
end of the interpreter in a fresh process: tests/e2e/checkpoint/test_async_save_at_exit.py."""

from __future__ import annotations

import collections
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import accel.checkpoint.protocol.save as save_mod
from accel import Accelerator
from accel.checkpoint import (
    BackgroundSaves,
    CheckpointError,
    CheckpointWriter,
    complete_checkpoints,
    host_copy,
    is_complete,
    latest_complete,
    load_tensors,
    read_manifest,
    read_state,
    save_run,
)
from accel.distributed import Communicator, ProcessContext


class _Gate:
    """Holds every checkpoint file back until :meth:`open` (the writer's queued writes are
    replayed on its first ``wait``, on the background thread), so a test acts while a save is
    surely in flight, and a state the save did not copy would be written as changed."""

    def __init__(self) -> None:
        self.event = threading.Event()
        gate = self

        class GatedWriter(CheckpointWriter):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.deferred: list[tuple[str, tuple[Any, ...]]] = []

            def write_tensors(self, *args: Any, **_: Any) -> None:
                self.deferred.append(("write_tensors", args))

            def write_state(self, *args: Any, **_: Any) -> None:
                self.deferred.append(("write_state", args))

            def wait(self) -> Any:
                assert gate.event.wait(60), "the test never opened the gate"
                for name, args in self.deferred:
                    getattr(CheckpointWriter, name)(self, *args)
                self.deferred.clear()
                return super().wait()

        self.writer = GatedWriter

    def open(self, after: float = 0.0) -> None:
        if after:
            threading.Timer(after, self.event.set).start()
        else:
            self.event.set()


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> _Gate:
    g = _Gate()
    monkeypatch.setattr(save_mod, "CheckpointWriter", g.writer)
    return g


class _Custom:
    def __init__(self) -> None:
        self.buf = torch.zeros(4)
        self.arr = np.zeros(3)
        self.steps = [1]

    def state_dict(self) -> dict[str, Any]:  # references, not copies
        return {"buf": self.buf, "arr": self.arr, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buf, self.arr, self.steps = state["buf"], state["arr"], state["steps"]


def _setup(tmp_path: Path) -> tuple[Accelerator, nn.Module, Any, _Custom]:
    acc = Accelerator(cpu=True, project_dir=str(tmp_path))
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    model, opt = acc.prepare(model, torch.optim.Adam(model.parameters(), lr=0.1))
    custom = _Custom()
    acc.register_for_checkpointing(custom)
    _step(acc, model, opt)
    return acc, model, opt, custom


def _step(acc: Accelerator, model: nn.Module, opt: Any) -> None:
    acc.backward(model(torch.randn(2, 4)).pow(2).mean())
    opt.step()
    opt.zero_grad()


def test_the_checkpoint_holds_the_state_at_the_call(tmp_path: Path, gate: _Gate) -> None:
    acc, model, opt, custom = _setup(tmp_path)
    weight = model.weight.detach().clone()
    exp_avg = opt.state_dict()["state"][0]["exp_avg"].clone()
    path = acc.save_state(blocking=False)
    assert path.endswith("checkpoint_0") and not Path(path).exists()  # in flight
    _step(acc, model, opt)  # changes parameters and optimizer state in place at once
    with torch.no_grad():
        model.weight.add_(1.0)
    custom.buf.add_(5.0)
    custom.arr += 7.0
    custom.steps.append(2)
    gate.open()
    assert acc.wait_for_checkpoint() == path and is_complete(path)
    manifest = read_manifest(path)
    assert torch.equal(load_tensors(path, "model_0.safetensors", manifest)["weight"], weight)
    assert torch.equal(read_state(path, "optimizer_0", manifest)["state"][0]["exp_avg"], exp_avg)
    saved = read_state(path, "custom_0", manifest)
    assert torch.equal(saved["buf"], torch.zeros(4)) and saved["steps"] == [1]
    assert np.array_equal(saved["arr"], np.zeros(3))
    assert acc.wait_for_checkpoint() is None  # nothing in flight any more


def test_next_save_load_and_end_training_wait_for_it(tmp_path: Path, gate: _Gate) -> None:
    acc, model, opt, _custom = _setup(tmp_path)
    gate.open(after=0.3)
    first = acc.save_state(blocking=False)
    second = acc.save_state()  # waits: it must not reuse the name of the one in flight
    assert (Path(first).name, Path(second).name) == ("checkpoint_0", "checkpoint_1")
    assert is_complete(first) and is_complete(second)
    gate.event.clear()
    gate.open(after=0.3)
    _step(acc, model, opt)
    third = acc.save_state(blocking=False)
    _step(acc, model, opt)
    assert acc.load_state() == third  # the newest: it waited for the one in flight
    gate.event.clear()
    gate.open(after=0.3)
    fourth = acc.save_state(blocking=False)
    acc.end_training()
    assert is_complete(fourth)


def test_a_background_failure_is_raised_at_the_next_wait_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    acc, model, opt, _custom = _setup(tmp_path)
    good = acc.save_state()

    class FullDisk(CheckpointWriter):
        def wait(self) -> Any:
            super().wait()
            raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(save_mod, "CheckpointWriter", FullDisk)
    for wait_point in ("wait_for_checkpoint", "save_state", "load_state", "end_training"):
        bad = acc.save_state(blocking=False)
        with pytest.raises(CheckpointError, match="No space left on device") as info:
            getattr(acc, wait_point)()
        assert bad in str(info.value) and "previous complete checkpoint" in str(info.value)
        assert isinstance(info.value.__cause__, CheckpointError)  # the rank's error, chained
        assert "No space left" in str(info.value.__cause__)
        assert not Path(bad).exists() and latest_complete(Path(good).parent) == Path(good)
        assert [p.name for p in Path(good).parent.iterdir() if p.name.startswith(".")] == []
    monkeypatch.setattr(save_mod, "CheckpointWriter", CheckpointWriter)
    assert acc.wait_for_checkpoint() is None  # raised once, then forgotten
    path = acc.save_state(blocking=False)
    assert acc.wait_for_checkpoint() == path and is_complete(path)


def test_a_state_that_cannot_be_stored_raises_at_the_call(tmp_path: Path) -> None:
    acc, _model, _opt, custom = _setup(tmp_path)
    custom.steps = [object()]
    with pytest.raises(CheckpointError, match="custom_0|object"):
        acc.save_state(blocking=False)
    assert acc.wait_for_checkpoint() is None
    assert list((tmp_path / "checkpoints").iterdir()) == []  # nothing left behind
    with pytest.raises(TypeError, match="True or False"):
        acc.save_state(blocking="no")  # type: ignore[arg-type]


def test_rotation_happens_when_a_save_completes(tmp_path: Path) -> None:
    acc, model, opt, _custom = _setup(tmp_path)
    for _ in range(4):
        _step(acc, model, opt)
        acc.save_state(total_limit=2, blocking=False)
    acc.wait_for_checkpoint()
    root = tmp_path / "checkpoints"
    assert [p.name for p in complete_checkpoints(root)] == ["checkpoint_2", "checkpoint_3"]
    acc.load_state(str(root / "checkpoint_2"))
    for _ in range(3):
        acc.save_state(total_limit=1, blocking=False)
    acc.wait_for_checkpoint()  # the loaded one is never rotated away
    assert [p.name for p in complete_checkpoints(root)] == ["checkpoint_2", "checkpoint_6"]
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_2", "checkpoint_6"]


def test_sharded_dcp_state_is_refused_with_what_works(tmp_path: Path) -> None:
    class ShardIO:
        distributed_state = sharded_state = True

        def model_state_dict(self, model: nn.Module) -> Any:
            raise AssertionError("nothing is read before the refusal")

    from accel.checkpoint import RunSnapshot
    from accel.device import select_device

    comm = Communicator(ProcessContext.single())
    snap = RunSnapshot(models=(nn.Linear(2, 2),), optimizers=(), schedulers=(), loaders=(),
                       custom=(), scaler=_Custom(), model_io=ShardIO(),  # type: ignore[arg-type]
                       device=select_device(cpu=True), accumulation_step=0,
                       accumulation_steps=1, sync_gradients=True, optimizer_steps=0,
                       loaded_dir=None)
    with pytest.raises(CheckpointError, match="SHARDED_STATE_DICT.*FULL_STATE_DICT"):
        save_run(comm, snap=snap, output_dir=str(tmp_path / "c"), total_limit=None, project_dir=None, project_total_limit=None, blocking=False,
                 background=BackgroundSaves())
    with pytest.raises(ValueError, match="needs background"):
        save_run(comm, snap=snap, output_dir=str(tmp_path / "c"), total_limit=None, project_dir=None, project_total_limit=None, blocking=False)


def test_host_copy_shares_no_memory() -> None:
    point = collections.namedtuple("point", "x y")
    state = {"t": torch.ones(2), "a": np.ones(2), "n": point(torch.ones(1), 3),
             "o": collections.OrderedDict(k=[torch.ones(1), (np.ones(1), "s")]), "i": 4}
    copy = host_copy(state)
    for tensor in (state["t"], state["n"].x, state["o"]["k"][0]):
        tensor.add_(1)
    state["a"] += 1
    state["o"]["k"][1][0][:] = 9
    assert copy["t"].tolist() == [1.0, 1.0] and copy["a"].tolist() == [1.0, 1.0]
    assert isinstance(copy["n"], point) and copy["n"].x.tolist() == [1.0] and copy["n"].y == 3
    assert isinstance(copy["o"], collections.OrderedDict)
    assert copy["o"]["k"][0].tolist() == [1.0] and copy["o"]["k"][1][0].tolist() == [1.0]
    assert copy["i"] == 4


