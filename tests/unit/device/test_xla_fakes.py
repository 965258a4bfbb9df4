"""accel's XLA code paths against a fake torch_xla package (no torch_xla needed).

Multi-process XLA on PJRT CPU is not reliable in torch_xla 2.9 (rendezvous timeouts with
``CPU_NUM_DEVICES=2``), so the multi-process paths (the "xla" process group, gradient reduction,
device counts on a TPU host) are checked here against a small fake package written to disk and put
first on ``sys.path``: imports, ``importlib.util.find_spec`` and lazy ``_optional.require`` behave
exactly as with the real package. Every call into it is recorded in ``torch_xla.CALLS``.
The real single-process tier is tests/xla (run by tests/xla/run.sh).
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist

from accel.device import select_device
from accel.device.cuda import CUDADevice
from accel.device.mps import MPSDevice
from accel.device.xla import XLADevice, seed_from_tensor, seed_to_tensor
from accel.distributed import build_context, start_process_group
from accel.env import detect_launch
from accel.strategy import XLAStrategy, select_strategy

_FAKE = {
    "torch_xla/__init__.py": """
        import torch
        __version__ = "0.0.fake"
        CALLS = []
        DEVICES = 4
        SEED = [0]
        def device(index=None):
            CALLS.append(("device", index))
            return torch.device("xla", 0)
        def sync(wait=False, reset_scope=True):
            CALLS.append(("sync",))
    """,
    "torch_xla/core/__init__.py": "",
    "torch_xla/core/xla_model.py": """
        import torch
        import torch_xla
        CALLS = torch_xla.CALLS
        def xla_device():
            CALLS.append(("xla_device",))
            return torch.device("xla", 0)
        def mark_step():
            CALLS.append(("mark_step",))
        def wait_device_ops(devices=()):
            CALLS.append(("wait_device_ops",))
        def get_rng_state(device=None):
            return torch_xla.SEED[0]
        def set_rng_state(seed, device=None):
            assert isinstance(seed, int) and 0 <= seed < 2**64, seed
            CALLS.append(("set_rng_state", seed))
            torch_xla.SEED[0] = seed
        def reduce_gradients(optimizer, groups=None, pin_layout=True):
            CALLS.append(("reduce_gradients", optimizer))
    """,
    "torch_xla/runtime.py": """
        import torch_xla
        def addressable_device_count():
            torch_xla.CALLS.append(("addressable_device_count",))
            return torch_xla.DEVICES
    """,
    "torch_xla/distributed/__init__.py": "",
    "torch_xla/distributed/xla_backend.py": """
        import torch_xla
        torch_xla.CALLS.append(("import xla_backend",))
    """,
}


def _drop_torch_xla_modules() -> None:
    for name in [n for n in sys.modules if n == "torch_xla" or n.startswith("torch_xla.")]:
        del sys.modules[name]


@pytest.fixture
def fake_xla(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """A fake torch_xla first on sys.path, PJRT_DEVICE=TPU, and 2 visible "GPUs" as well."""
    for rel, text in _FAKE.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    _drop_torch_xla_modules()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    monkeypatch.delenv("ACCEL_DEVICE", raising=False)
    monkeypatch.setattr(CUDADevice, "count", classmethod(lambda cls: 2))
    monkeypatch.setattr(MPSDevice, "available", classmethod(lambda cls: False))
    import torch_xla

    torch_xla.CALLS.clear()
    yield torch_xla
    _drop_torch_xla_modules()


def _calls(fake: ModuleType) -> list[str]:
    return [call[0] for call in fake.CALLS]


# ------------------------------------------------------------------ detection and counts


def test_xla_comes_before_cuda_when_pjrt_device_is_set(fake_xla: ModuleType,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    assert select_device().kind == "xla"
    monkeypatch.delenv("PJRT_DEVICE")
    monkeypatch.delenv("XRT_TPU_CONFIG", raising=False)
    assert select_device().kind == "cuda"  # installed torch_xla alone does not mean XLA


def test_pjrt_device_without_torch_xla_falls_through(monkeypatch: pytest.MonkeyPatch) -> None:
    _drop_torch_xla_modules()
    monkeypatch.setitem(sys.modules, "torch_xla", None)  # "not installed" for find_spec/import
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    monkeypatch.delenv("ACCEL_DEVICE", raising=False)
    monkeypatch.setattr(CUDADevice, "count", classmethod(lambda cls: 2))
    assert not XLADevice.available() and XLADevice.count() == 0
    assert select_device().kind == "cuda"
    with pytest.raises(RuntimeError, match="PJRT_DEVICE"):
        select_device("xla")


def test_detection_does_not_import_torch_xla(fake_xla: ModuleType) -> None:
    _drop_torch_xla_modules()  # the fixture imported it; detection must not import it again
    assert XLADevice.available()
    assert select_device().kind == "xla"
    assert "torch_xla" not in sys.modules


def test_count_uses_addressable_device_count(fake_xla: ModuleType,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    fake_xla.DEVICES = 4
    assert XLADevice.count() == 4
    fake_xla.DEVICES = 1
    assert XLADevice.count() == 1
    assert _calls(fake_xla) == ["addressable_device_count"] * 2
    monkeypatch.delenv("PJRT_DEVICE")
    assert XLADevice.count() == 0
    assert len(fake_xla.CALLS) == 2  # not asked when XLA is not requested


# ------------------------------------------------------------------ device methods


def test_torch_device_is_xla0_for_every_local_rank(fake_xla: ModuleType) -> None:
    device = XLADevice()
    assert [device.torch_device(rank) for rank in (0, 3)] == [torch.device("xla", 0)] * 2
    assert _calls(fake_xla) == ["device", "device"]


def test_old_torch_xla_without_device_and_sync(fake_xla: ModuleType,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(fake_xla, "device")
    monkeypatch.delattr(fake_xla, "sync")
    device = XLADevice()
    assert device.torch_device(0) == torch.device("xla", 0)
    device.synchronize()
    assert _calls(fake_xla) == ["xla_device", "mark_step", "wait_device_ops"]


def test_synchronize_marks_the_step_then_waits(fake_xla: ModuleType) -> None:
    XLADevice().synchronize()
    assert _calls(fake_xla) == ["sync", "wait_device_ops"]


@pytest.mark.parametrize("seed", [0, 5, 2**63 - 1, 2**63, 2**64 - 1])
def test_rng_state_round_trips_every_uint64(fake_xla: ModuleType, seed: int) -> None:
    device = XLADevice()
    fake_xla.SEED[0] = seed
    state = device.rng_state()
    assert state is not None and state["xla_seed"].dtype == torch.int64
    fake_xla.SEED[0] = 123
    device.set_rng_state(state)
    assert fake_xla.SEED[0] == seed
    assert seed_from_tensor(seed_to_tensor(seed)) == seed


def test_manual_seed_and_bad_states(fake_xla: ModuleType) -> None:
    device = XLADevice()
    device.manual_seed(-1)  # torch accepts negative seeds; XLA wants the same bits unsigned
    assert fake_xla.SEED[0] == 2**64 - 1
    with pytest.raises(KeyError, match="xla_seed"):
        device.set_rng_state({"cuda": torch.zeros(1)})
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        seed_to_tensor(2**64)


# ------------------------------------------------------------------ multi-process paths


def _xla_context(world: int, rank: int = 0) -> tuple[Any, Any]:
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
           "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
    info = detect_launch(env)
    return info, build_context(info, XLADevice())


def test_xla_process_group_uses_xla_init_method(fake_xla: ModuleType,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(kw))
    info, ctx = _xla_context(world=4, rank=1)
    assert (ctx.backend, ctx.device, ctx.rank, ctx.world_size) == \
        ("xla", torch.device("xla", 0), 1, 4)
    handle = start_process_group(ctx, info=info, device=XLADevice(), timeout=timedelta(seconds=42))
    assert ("import xla_backend",) in fake_xla.CALLS  # registers the "xla" backend first
    assert calls == [{"backend": "xla", "init_method": "xla://", "rank": 1, "world_size": 4,
                      "timeout": timedelta(seconds=42)}]
    assert handle.owned and handle.backend == "xla"


def test_xla_process_group_keeps_an_explicit_init_method(
        fake_xla: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(kw))
    info, ctx = _xla_context(world=2)
    start_process_group(ctx, info=info, device=XLADevice(), init_method="tcp://127.0.0.1:1234")
    assert calls[0]["init_method"] == "tcp://127.0.0.1:1234" and calls[0]["backend"] == "xla"


def test_xla_world_size_one_starts_no_group(fake_xla: ModuleType,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "init_process_group",
                        lambda **kw: pytest.fail("no process group at world size 1"))
    info, ctx = _xla_context(world=1)
    assert not start_process_group(ctx, info=info, device=XLADevice()).active
    assert ("import xla_backend",) not in fake_xla.CALLS


def test_xla_strategy_reduces_gradients_only_when_distributed(fake_xla: ModuleType) -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    for world, reduced in ((1, False), (4, True)):
        fake_xla.CALLS.clear()
        _info, ctx = _xla_context(world=world)
        strategy = select_strategy(ctx)
        assert isinstance(strategy, XLAStrategy)
        strategy.before_optimizer_step(optimizer)
        strategy.after_optimizer_step()
        names = _calls(fake_xla)
        assert (("reduce_gradients", optimizer) in fake_xla.CALLS) is reduced
        assert {"mark_step", "sync"} & set(names), f"no step was marked: {names}"


def test_placed_loaders_cut_the_xla_graph_after_every_batch(fake_xla: ModuleType) -> None:
    """The per-batch hook is the device's: XLA marks the step, other devices have none."""
    from torch.utils.data import DataLoader

    from accel.config import DataLoaderConfiguration
    from accel.data import DataTracker, build_prepared_loader
    from accel.device.cpu import CPUDevice
    from accel.distributed import Communicator

    hook = XLADevice().batch_hook()
    assert hook is not None and CPUDevice().batch_hook() is None
    _info, ctx = _xla_context(world=1)
    cpu_ctx = type(ctx).single()
    fake_xla.CALLS.clear()
    loader = build_prepared_loader(DataLoader(torch.arange(6.0), batch_size=2), ctx=cpu_ctx,
                                   comm=Communicator(cpu_ctx), device=None,
                                   config=DataLoaderConfiguration(), tracker=DataTracker(),
                                   seed=0, after_batch=hook)
    marks = []
    for _batch in loader:
        marks.append(sum(1 for call in _calls(fake_xla) if call in ("mark_step", "sync")))
    assert marks == [1, 2, 3]  # one cut per batch, before the batch reaches the loop
