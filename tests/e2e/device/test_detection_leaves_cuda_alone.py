"""accel.device in a fresh interpreter: selection, counting and reports leave CUDA uninitialised
(moved out of tests/unit/device/test_device.py, which starts no processes)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_detection_does_not_initialise_cuda() -> None:
    """In a fresh interpreter: selection, counting and reports leave CUDA uninitialised."""
    code = textwrap.dedent("""
        import torch
        from accel.device import select_device
        from accel.device.cuda import CUDADevice
        device = select_device()
        CUDADevice.count(); CUDADevice.available(); CUDADevice.names()
        device.describe(2)
        print("initialised", torch.cuda.is_initialized(), device.kind)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "initialised False" in out.stdout, out.stdout
