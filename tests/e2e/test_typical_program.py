"""A typical Accelerate program runs unchanged apart from its import line (notebook_launcher)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parent / "scripts" / "typical_accelerate_program.py"


@pytest.mark.slow
def test_typical_accelerate_program(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # every one of the 37 eval samples counted exactly once, printed once (main process only)
    assert proc.stdout.count("evaluated 37 samples") == 1, proc.stdout
    assert "RESULT {'rank': 0, 'total': 37, 'world': 2}" in proc.stdout
    # accelerator.save wrote what Accelerate writes there: torch.save's format, read back the
    # way such scripts read it (and safely: weights_only)
    state = torch.load(tmp_path / "model.pth", weights_only=True)
    assert set(state) == {"conv.weight", "conv.bias", "fc.weight", "fc.bias"}
    assert state["fc.weight"].shape == torch.Size([2, 128])
