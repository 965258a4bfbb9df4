"""save_state(blocking=False) in a script that ends without a wait point: the end of the
interpreter waits for the save, and a failed one is reported with its cause and exit status 1
(fresh processes; moved out of tests/unit/checkpoint/test_async_checkpoint.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from accel.checkpoint import is_complete

ROOT = Path(__file__).resolve().parents[3]

_EXIT_SCRIPT = """
import sys, torch
import accel.checkpoint.protocol.save as save_mod
from accel import Accelerator
from accel.checkpoint import CheckpointWriter
if sys.argv[2] == "fail":
    class FullDisk(CheckpointWriter):
        def wait(self):
            super().wait()
            raise OSError(28, "No space left on device (injected)")
    save_mod.CheckpointWriter = FullDisk
acc = Accelerator(cpu=True, project_dir=sys.argv[1])
model = acc.prepare(torch.nn.Linear(512, 512))
print(acc.save_state(blocking=False), flush=True)
"""


def test_the_end_of_the_script_waits_and_reports_a_failure(tmp_path: Path) -> None:
    """A script that ends without a wait point: the save completes before the process ends;
    a failed one is printed with its cause and the process exits with status 1."""
    runs = {}
    for mode in ("ok", "fail"):
        runs[mode] = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_EXIT_SCRIPT), str(tmp_path / mode), mode],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
    ok, fail = runs["ok"], runs["fail"]
    assert ok.returncode == 0, ok.stderr
    assert is_complete(ok.stdout.strip())
    assert fail.returncode == 1, fail.stderr
    assert "No space left on device (injected)" in fail.stderr
    assert "save_state(blocking=False)" in fail.stderr
    assert not Path(fail.stdout.strip()).exists()
