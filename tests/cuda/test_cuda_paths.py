"""CUDA code paths. Skipped with a reason on machines without an NVIDIA GPU (see conftest);
run them on a GPU machine with `python -m pytest -m cuda tests`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.spawn import run_workers

pytestmark = pytest.mark.cuda
ROOT = Path(__file__).resolve().parents[2]


def _gpu_count() -> int:
    from accel.device.cuda import CUDADevice

    return CUDADevice.count()


def test_fp16_gradscaler_trains_and_skips_on_inf() -> None:
    from accel import Accelerator

    acc = Accelerator(mixed_precision="fp16")
    assert acc.device.type == "cuda" and acc.scaler is not None
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    model, opt, sched = acc.prepare(model, opt, sched)
    x = torch.randn(64, 16, device=acc.device)
    y = x.sum(dim=1, keepdim=True)
    with acc.autocast():
        assert nn.functional.linear(x, torch.ones(1, 16, device=acc.device)).dtype == torch.float16
    first = None
    for _ in range(30):
        loss = nn.functional.mse_loss(model(x), y)
        first = first if first is not None else loss.item()
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    assert loss.item() < first
    lr = sched.get_last_lr()
    acc.backward(model(x).sum() * float("inf"))
    opt.step()
    sched.step()
    assert acc.optimizer_step_was_skipped and sched.get_last_lr() == lr


def test_bf16_autocast_on_cuda() -> None:
    from accel import Accelerator

    if not torch.cuda.is_bf16_supported():
        with pytest.raises(ValueError, match="does not support bfloat16"):
            Accelerator(mixed_precision="bf16")
        return
    acc = Accelerator(mixed_precision="bf16")
    model = acc.prepare(nn.Linear(8, 8))
    out = model(torch.randn(4, 8, device=acc.device))
    assert out.dtype == torch.float32 and out.device.type == "cuda"
    with acc.autocast():
        assert model.forward.__wrapped__(torch.randn(4, 8, device=acc.device)).dtype \
            == torch.bfloat16


def test_gather_for_metrics_and_checkpoint_of_cuda_rng(tmp_path: Path) -> None:
    from accel import Accelerator

    acc = Accelerator(project_dir=str(tmp_path))
    dl = acc.prepare(DataLoader(TensorDataset(torch.arange(7.0)), batch_size=2))
    seen = [acc.gather_for_metrics(x) for (x,) in dl]
    assert all(t.device.type == "cuda" for t in seen)
    assert torch.cat(seen).tolist() == [float(i) for i in range(7)]
    acc.save_state()
    expected = torch.rand(3, device="cuda")
    acc.load_state()
    assert torch.equal(torch.rand(3, device="cuda"), expected)


def _nccl_worker(rank: int) -> dict[str, Any]:
    from accel import Accelerator

    acc = Accelerator()
    out = {"device": str(acc.device), "current": torch.cuda.current_device(),
           "backend": str(torch.distributed.get_backend())}
    model = acc.prepare(nn.Linear(4, 1))
    out["ddp"] = type(model).__name__
    out["gather"] = acc.gather(torch.tensor([rank], device=acc.device)).tolist()
    acc.end_training()
    return out


def test_nccl_group_binds_each_local_rank_to_its_gpu() -> None:
    if _gpu_count() < 2:
        pytest.skip("needs 2 GPUs: NCCL refuses two ranks on one GPU")
    results = run_workers(_nccl_worker, 2, timeout=180)
    for rank, r in enumerate(results):
        assert r == {"device": f"cuda:{rank}", "current": rank, "backend": "nccl",
                     "ddp": "DistributedDataParallel", "gather": [0, 1]}


def test_notebook_launcher_refuses_after_cuda_init() -> None:
    code = textwrap.dedent("""
        import torch
        from accel import notebook_launcher
        torch.zeros(1, device="cuda")
        try:
            notebook_launcher(lambda: 1, num_processes=1)
        except RuntimeError as exc:
            print("REFUSED:", exc)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert "REFUSED:" in proc.stdout and "CUDA is already initialised" in proc.stdout, \
        proc.stdout + proc.stderr


def test_inductor_compile_on_cuda_with_bf16(tmp_path: Path) -> None:
    """torch.compile (inductor, Triton kernels) of a prepared model on the GPU, under bf16
    autocast: trains like eager and checkpoints with the user's parameter names."""
    from safetensors import safe_open

    from accel import Accelerator
    from accel.utils import is_compiled_module

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(x)))

    acc = Accelerator(mixed_precision="bf16", dynamo_backend="inductor",
                      project_dir=str(tmp_path))
    eager_acc = Accelerator(mixed_precision="bf16")
    torch.manual_seed(0)
    net, twin = Net(), Net()
    twin.load_state_dict(net.state_dict())
    model, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    ref, ref_opt = eager_acc.prepare(twin, torch.optim.SGD(twin.parameters(), lr=0.1))
    assert is_compiled_module(model) and acc.device.type == "cuda"
    x = torch.randn(32, 64, device=acc.device)
    y = torch.randn(32, 1, device=acc.device)
    for _ in range(5):
        loss = nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        expected = nn.functional.mse_loss(ref(x), y)
        eager_acc.backward(expected)
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss.item() == pytest.approx(expected.item(), rel=2e-2)  # bf16 rounding
    folder = Path(acc.save_state())
    with safe_open(str(folder / "model_0.safetensors"), "pt") as handle:
        assert sorted(handle.keys()) == sorted(Net().state_dict())
