"""accel.device: the detection order, explicit choices, rank -> device mapping, RNG, reports.

CUDA availability is simulated by monkeypatching the classmethods so that the order and the
errors are tested on any machine; tests marked ``cuda`` need a real GPU (conftest skips them
with a reason where none is visible).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

from accel.device import DEVICE_KINDS, select_device
from accel.device.cpu import CPUDevice
from accel.device.cuda import CUDADevice
from accel.device.mps import MPSDevice
from accel.device.xla import XLADevice
from accel.env import EnvSettings, LaunchInfo


def _set_available(monkeypatch: pytest.MonkeyPatch, **kinds: bool) -> None:
    """Pretend that the given device kinds are (not) available."""
    classes = {"xla": XLADevice, "cuda": CUDADevice, "mps": MPSDevice}
    for kind, value in kinds.items():
        monkeypatch.setattr(classes[kind], "available",
                            classmethod(lambda cls, _value=value: _value))


@pytest.fixture
def nothing_but_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_available(monkeypatch, xla=False, cuda=False, mps=False)
    monkeypatch.setattr(CUDADevice, "count", classmethod(lambda cls: 0))


# ------------------------------------------------------------------ selection


def test_auto_detection_order(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_available(monkeypatch, xla=False, cuda=False, mps=False)
    assert isinstance(select_device(), CPUDevice)
    _set_available(monkeypatch, mps=True)
    assert isinstance(select_device(), MPSDevice)
    _set_available(monkeypatch, cuda=True)
    assert isinstance(select_device(), CUDADevice)
    _set_available(monkeypatch, xla=True)
    assert isinstance(select_device(), XLADevice)


def test_explicit_cpu_wins_over_available_accelerators(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_available(monkeypatch, xla=True, cuda=True, mps=True)
    assert select_device(cpu=True).kind == "cpu"
    assert select_device(device="cpu").kind == "cpu"
    assert select_device(device=" CPU ").kind == "cpu"
    assert select_device(settings=EnvSettings(device="cpu")).kind == "cpu"
    assert select_device(cpu=True, device="cpu").kind == "cpu"


def test_explicit_names_and_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_available(monkeypatch, cuda=True)
    assert select_device(device="cuda").kind == "cuda"
    assert select_device(device="cuda:1").kind == "cuda"
    assert select_device(device="gpu").kind == "cuda"
    assert select_device(settings=EnvSettings(device="cuda")).kind == "cuda"


def test_constructor_beats_accel_device_with_a_warning(nothing_but_cpu: None) -> None:
    # ACCEL_DEVICE=cuda from `accel launch` on a machine without a GPU; cpu=True still works
    with pytest.warns(UserWarning, match="ACCEL_DEVICE.*'cuda'.*using 'cpu'"):
        device = select_device(cpu=True, settings=EnvSettings(device="cuda"))
    assert device.kind == "cpu"


def test_cpu_true_conflicts_with_another_device(nothing_but_cpu: None) -> None:
    with pytest.raises(ValueError, match="cpu=True conflicts with device='cuda'"):
        select_device(cpu=True, device="cuda")


@pytest.mark.parametrize("kwargs,source", [
    ({"device": "tpu"}, "device='tpu'"),
    ({"settings": EnvSettings(device="npu")}, "ACCEL_DEVICE='npu'"),
])
def test_unknown_kind_lists_the_kinds(kwargs: dict[str, object], source: str) -> None:
    with pytest.raises(ValueError) as err:
        select_device(**kwargs)  # type: ignore[arg-type]
    message = str(err.value)
    assert source in message
    assert all(kind in message for kind in DEVICE_KINDS)


def test_non_string_device_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="must be a string"):
        select_device(device=torch.device("cpu"))  # type: ignore[arg-type]


def test_unavailable_cuda_raises_with_a_hint(nothing_but_cpu: None) -> None:
    with pytest.raises(RuntimeError, match="not available.*CUDA_VISIBLE_DEVICES"):
        select_device(device="cuda")
    with pytest.raises(RuntimeError, match="ACCEL_DEVICE='cuda'.*not available"):
        select_device(settings=EnvSettings(device="cuda"))


def test_unavailable_xla_raises_with_a_hint(nothing_but_cpu: None) -> None:
    with pytest.raises(RuntimeError, match="PJRT_DEVICE"):
        select_device(device="xla")


def test_cuda_count_is_zero_on_a_cpu_build_of_torch() -> None:
    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        pytest.skip("this torch is built with CUDA/ROCm; the CPU-build shortcut does not apply")
    assert CUDADevice.count() == 0 and not CUDADevice.available()


# ------------------------------------------------------------------ rank -> device


def test_cpu_device_for_every_local_rank() -> None:
    device = CPUDevice()
    assert device.torch_device(0) == torch.device("cpu") == device.torch_device(5)
    assert (device.kind, device.dist_backend) == ("cpu", "gloo")
    assert CPUDevice.count() == 1 and len(CPUDevice.names()) == 1


def test_cuda_local_rank_maps_to_gpu_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CUDADevice, "count", classmethod(lambda cls: 2))
    device = CUDADevice()
    assert device.torch_device(0) == torch.device("cuda", 0)
    assert device.torch_device(1) == torch.device("cuda", 1)
    assert device.dist_backend == "nccl"


def test_more_ranks_than_gpus_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CUDADevice, "count", classmethod(lambda cls: 2))
    with pytest.raises(RuntimeError, match="local rank 2 needs GPU 2 but only 2 GPU"):
        CUDADevice().torch_device(2)
    monkeypatch.setattr(CUDADevice, "count", classmethod(lambda cls: 0))
    with pytest.raises(RuntimeError, match="no GPU is visible"):
        CUDADevice().torch_device(0)


# ------------------------------------------------------------------ RNG


def test_cpu_has_no_device_rng_of_its_own() -> None:
    """torch's global CPU generator belongs to the checkpoint's torch state, not the device."""
    device = CPUDevice()
    before = torch.get_rng_state()
    assert device.rng_state() is None
    device.manual_seed(1234)
    device.set_rng_state({})
    assert torch.equal(torch.get_rng_state(), before)


# ------------------------------------------------------------------ reports


def test_describe_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CPUDevice().describe(2) == "CPU, 2 process(es), gloo"
    assert MPSDevice().describe(1) == "MPS (Apple GPU), 1 process(es)"
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    assert XLADevice().describe(8) == "XLA (PJRT TPU), 8 process(es)"


def test_cuda_names_follow_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("accel.device.cuda.nvml_device_names", lambda: ["A100", "T4", "H100"])
    monkeypatch.setattr(CUDADevice, "count", classmethod(lambda cls: 2))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert CUDADevice.names() == ["H100", "A100"]
    assert CUDADevice().describe(4) == "2x CUDA (A100, H100), 4 process(es), nccl"


def test_cuda_names_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("accel.device.cuda.nvml_device_names", lambda: [])
    monkeypatch.setattr(CUDADevice, "count", classmethod(lambda cls: 1))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert CUDADevice.names() == ["CUDA GPU"]


# ------------------------------------------------------------------ real GPU


@pytest.mark.cuda
def test_cuda_binding_per_local_rank_without_a_group() -> None:
    """World size 1 starts no group but still binds the process to its local rank's GPU."""
    import torch.distributed as dist

    from accel.distributed import build_context, start_process_group

    device = select_device("cuda")
    local_rank = CUDADevice.count() - 1  # the last GPU, so the check is not trivially 0
    info = LaunchInfo(launcher="torchrun", rank=0, local_rank=local_rank, world_size=1,
                      local_world_size=CUDADevice.count(), node_rank=0, master_addr="127.0.0.1",
                      master_port=29500)
    ctx = build_context(info, device)
    group = start_process_group(ctx, info=info, device=device, timeout=timedelta(seconds=60))
    try:
        assert ctx.device == torch.device("cuda", local_rank) and ctx.backend == "nccl"
        assert torch.cuda.current_device() == local_rank
        assert group.backend is None and not group.owned and not dist.is_initialized()
    finally:
        group.close()
        torch.cuda.set_device(0)


@pytest.mark.cuda
def test_cuda_rng_state_round_trip() -> None:
    device = select_device("cuda")
    device.manual_seed(11)
    state = device.rng_state()
    assert state is not None and set(state) == {"cuda"}
    first = torch.rand(4, device="cuda")
    device.set_rng_state(state)
    assert torch.equal(torch.rand(4, device="cuda"), first)
    device.manual_seed(11)
    assert torch.equal(torch.rand(4, device="cuda"), first)


@pytest.mark.cuda
def test_cuda_describe_names_the_gpu() -> None:
    text = select_device("cuda").describe(1)
    assert text.startswith(f"{CUDADevice.count()}x CUDA (") and text.endswith("nccl")
