"""The XLA tier, for real on torch_xla's PJRT CPU runtime, in one process.

Run with ``bash tests/xla/run.sh`` (it builds the torch==2.9.0 + torch-xla==2.9.0 environment).
In an environment without torch_xla this module is skipped, with a reason, unless
``ACCEL_REQUIRE_XLA=1`` (set by run.sh), where the missing package is a failure instead: the tier
can never pass by skipping.

Multi-process XLA (the "xla" process group) is not reliable on PJRT CPU in torch_xla 2.9, so it
is covered with fakes in tests/unit/device/test_xla_fakes.py and needs a TPU to run for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
_REQUIRED = os.environ.get("ACCEL_REQUIRE_XLA") == "1"
_HOW = "run tests/xla/run.sh (it creates the torch==2.9.0 + torch-xla==2.9.0 environment)"

# Checked before importing torch_xla: importing it sets PJRT_DEVICE=CPU when it is unset.
if not os.environ.get("PJRT_DEVICE"):
    if _REQUIRED:
        raise RuntimeError(f"ACCEL_REQUIRE_XLA=1 but PJRT_DEVICE is not set; {_HOW}")
    pytest.skip(f"PJRT_DEVICE is not set, the XLA tier is not requested here; {_HOW}",
                allow_module_level=True)
try:
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
except ImportError as exc:
    if _REQUIRED:
        raise RuntimeError(f"ACCEL_REQUIRE_XLA=1 but torch_xla does not import ({exc}); "
                           f"{_HOW}") from exc
    pytest.skip(f"torch_xla is not importable here ({exc}); {_HOW}", allow_module_level=True)

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from accel.device import select_device  # noqa: E402
from accel.device.xla import XLADevice  # noqa: E402
from accel.distributed import build_context, start_process_group  # noqa: E402
from accel.env import detect_launch, read_settings  # noqa: E402

pytestmark = pytest.mark.xla


def _executions() -> int:
    data = met.metric_data("ExecuteTime")
    return int(data[0]) if data else 0


def _compiles() -> int:
    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def _pending(tensor: torch.Tensor) -> bool:
    """True when ``tensor`` is still an unexecuted lazy graph (not plain device data)."""
    return "aten::" in torch_xla._XLAC._get_xla_tensors_text([tensor])


# --------------------------------------------------------------------------- device level


def test_select_device_picks_xla_when_pjrt_device_is_set() -> None:
    assert os.environ["PJRT_DEVICE"] == "CPU"
    assert select_device().kind == "xla"
    assert select_device(settings=read_settings()).kind == "xla"
    assert select_device("xla").kind == "xla"
    assert select_device(cpu=True).kind == "cpu"  # explicit choice still wins


_NO_PJRT_PROBE = """
import importlib.util, json, sys
from accel.device import select_device
from accel.device.xla import XLADevice
out = {"installed": importlib.util.find_spec("torch_xla") is not None,
       "auto": select_device().kind, "available": XLADevice.available(),
       "count": XLADevice.count(), "imported": "torch_xla" in sys.modules}
try:
    select_device("xla")
    out["explicit"] = "no error"
except RuntimeError as exc:
    out["explicit"] = str(exc)
print(json.dumps(out))
"""


def test_select_device_ignores_installed_torch_xla_without_pjrt_device() -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PJRT_DEVICE", "XRT_TPU_CONFIG", "ACCEL_DEVICE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", _NO_PJRT_PROBE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["installed"] is True  # same interpreter as this tier: torch_xla is there
    assert out["auto"] == "cpu"
    assert out["available"] is False and out["count"] == 0
    assert out["imported"] is False, "detection must not import torch_xla (it sets PJRT_DEVICE)"
    assert "PJRT_DEVICE" in out["explicit"]


def test_xla_device_basics() -> None:
    device = XLADevice()
    assert XLADevice.available()
    assert XLADevice.count() == 1  # PJRT CPU, one process, CPU_NUM_DEVICES unset
    assert XLADevice.names() == ["XLA (PJRT CPU)"]
    assert device.describe(1) == "XLA (PJRT CPU), 1 process(es)"
    tdev = device.torch_device(0)
    assert tdev.type == "xla"
    assert tdev == torch_xla.device()
    assert device.dist_backend == "xla"


def test_synchronize_runs_the_pending_graph() -> None:
    device = XLADevice()
    tensor = torch.arange(4.0, device=device.torch_device(0)) * 3
    assert _pending(tensor)
    before = _executions()
    device.synchronize()
    assert not _pending(tensor)
    assert _executions() == before + 1
    assert tensor.cpu().tolist() == [0.0, 3.0, 6.0, 9.0]


def _draw(device: torch.device) -> torch.Tensor:
    return torch.rand(5, device=device).cpu()


@pytest.mark.parametrize("seed", [7, 2**63 + 11, 2**64 - 5])
def test_rng_seed_and_state_round_trip(seed: int) -> None:
    device = XLADevice()
    tdev = device.torch_device(0)
    device.manual_seed(seed)
    first = _draw(tdev)
    device.manual_seed(seed)
    assert torch.equal(_draw(tdev), first)
    device.manual_seed(seed + 1)
    assert not torch.equal(_draw(tdev), first)

    device.manual_seed(seed)
    state = device.rng_state()
    assert state is not None and state["xla_seed"].dtype == torch.int64
    drawn = _draw(tdev)
    _draw(tdev)  # moves the generator on
    device.set_rng_state(state)
    assert torch.equal(_draw(tdev), drawn)


def test_rng_state_survives_safetensors(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    device = XLADevice()
    tdev = device.torch_device(0)
    device.manual_seed(2**64 - 5)
    _draw(tdev)  # the state is now some arbitrary uint64
    save_file(device.rng_state(), str(tmp_path / "rng.safetensors"))
    expected = _draw(tdev)
    device.set_rng_state(load_file(str(tmp_path / "rng.safetensors")))
    assert torch.equal(_draw(tdev), expected)


def test_process_group_at_world_size_one_starts_nothing() -> None:
    device = XLADevice()
    info = detect_launch({})
    ctx = build_context(info, device)
    assert ctx.device.type == "xla" and ctx.backend == "xla"
    assert (ctx.rank, ctx.world_size, ctx.is_main_process) == (0, 1, True)
    handle = start_process_group(ctx, info=info, device=device)
    assert not handle.active
    handle.close()


# --------------------------------------------------------------------- Accelerator level
# These use only the public, Accelerate-like API; the user's loop is the same as on CPU.


def _accelerator(**kwargs: Any) -> Any:
    from accel import Accelerator

    return Accelerator(**kwargs)


def _regression(n: int = 64) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=gen)
    y = x @ torch.tensor([[1.5], [-2.0], [0.5], [3.0]]) + 0.25
    return TensorDataset(x, y)


def _full_loss(model: nn.Module, data: TensorDataset) -> float:
    weight, bias = (p.detach().cpu() for p in model.parameters())
    x, y = data.tensors
    return float(nn.functional.mse_loss(nn.functional.linear(x, weight, bias), y))


def _batches(loader: Any) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for batch in loader:
        x, y = batch
        yield x, y


def test_accelerator_chooses_xla_and_prepare_moves_everything() -> None:
    accelerator = _accelerator()
    assert accelerator.device.type == "xla"
    assert accelerator.num_processes == 1 and accelerator.is_main_process
    torch.manual_seed(0)
    data = _regression(20)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(data, batch_size=8, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    params = list(model.parameters())
    assert all(p.device.type == "xla" for p in params)
    opt_params = [p for group in optimizer.param_groups for p in group["params"]]
    assert [id(p) for p in opt_params] == [id(p) for p in params], \
        "the optimizer must step the parameters that live on the XLA device"
    seen = list(_batches(loader))
    assert len(seen) == 3  # 8 + 8 + 4: nothing dropped or padded at world size 1
    assert all(x.device.type == "xla" and y.device.type == "xla" for x, y in seen)
    assert torch.equal(torch.cat([x.cpu() for x, _ in seen]), data.tensors[0])


def test_training_loop_converges_with_steps_marked_by_accel() -> None:
    accelerator = _accelerator()
    torch.manual_seed(0)
    data = _regression()
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    start = _full_loss(model, data)
    executions, compiles, steps = _executions(), _compiles(), 0
    for _epoch in range(4):
        for x, y in _batches(loader):  # exactly the CPU loop: no mark_step, no .item()
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            steps += 1
    assert steps == 32
    # accel marked every step: one graph run per step, the same graph reused (few compiles).
    # Graphs run asynchronously and the metric is counted when a run finishes: wait for the
    # device first (reading the count right after the last step missed that step's run once).
    xm.wait_device_ops()
    assert _executions() - executions >= steps
    assert _compiles() - compiles < steps // 4
    assert not any(_pending(p) for p in model.parameters())
    end = _full_loss(model, data)
    assert end < 0.01 * start, (start, end)


def test_gather_for_metrics_reduce_and_wait_at_world_size_one() -> None:
    accelerator = _accelerator()
    torch.manual_seed(0)
    data = _regression(10)
    model = nn.Linear(4, 1)
    loader = DataLoader(data, batch_size=4)  # 4 + 4 + 2
    model, loader = accelerator.prepare(model, loader)
    preds = []
    with torch.no_grad():
        for x, _ in _batches(loader):
            out = accelerator.gather_for_metrics(model(x))
            preds.append(out.cpu())
    weight, bias = (p.detach().cpu() for p in model.parameters())
    expected = nn.functional.linear(data.tensors[0], weight, bias)
    torch.testing.assert_close(torch.cat(preds), expected)

    value = torch.tensor([1.0, -2.0, 4.0], device=accelerator.device)
    for reduction in ("sum", "mean"):
        reduced = accelerator.reduce(value, reduction=reduction)
        assert reduced.device.type == "xla"
        assert reduced.cpu().tolist() == [1.0, -2.0, 4.0]
    nested = accelerator.gather_for_metrics({"a": value, "b": [value * 2]})
    assert nested["b"][0].cpu().tolist() == [2.0, -4.0, 8.0]
    assert accelerator.wait_for_everyone() is None


def _step(accelerator: Any, model: nn.Module, optimizer: Any, x: torch.Tensor,
          y: torch.Tensor) -> None:
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x.to(accelerator.device)), y.to(accelerator.device))
    accelerator.backward(loss)
    optimizer.step()


def _snapshot(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().cpu().clone() for p in model.parameters()]


def _assert_no_pickle(directory: Path) -> None:
    from safetensors.torch import load_file

    files = [f for f in directory.rglob("*") if f.is_file()]
    assert files, f"save_state wrote nothing under {directory}"
    for path in files:
        assert path.suffix not in (".pt", ".pth", ".bin", ".pkl"), path
        assert not path.read_bytes()[:1] == b"\x80", f"{path} looks like a pickle"
        if path.suffix == ".safetensors":
            assert all(t.device.type == "cpu" for t in load_file(str(path)).values())


def test_save_state_load_state_round_trip(tmp_path: Path) -> None:
    accelerator = _accelerator()
    torch.manual_seed(0)
    data = _regression(48)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    batches = [(data.tensors[0][i:i + 8], data.tensors[1][i:i + 8]) for i in range(0, 48, 8)]
    for x, y in batches[:3]:
        _step(accelerator, model, optimizer, x, y)
    ckpt = tmp_path / "ckpt"
    accelerator.save_state(str(ckpt))
    _assert_no_pickle(ckpt)
    saved = _snapshot(model)
    draw_after_save = torch.rand(3, device=accelerator.device).cpu()
    for x, y in batches[3:]:
        _step(accelerator, model, optimizer, x, y)
    continued = _snapshot(model)
    assert not torch.equal(continued[0], saved[0])

    accelerator.load_state(str(ckpt))
    for restored, expected in zip(_snapshot(model), saved):
        assert torch.equal(restored, expected)
    assert all(p.device.type == "xla" for p in model.parameters())
    assert torch.equal(torch.rand(3, device=accelerator.device).cpu(), draw_after_save), \
        "the XLA RNG state must be restored by load_state"
    for x, y in batches[3:]:  # momentum buffers restored too: same trajectory as before
        _step(accelerator, model, optimizer, x, y)
    for resumed, expected in zip(_snapshot(model), continued):
        torch.testing.assert_close(resumed, expected)
