"""``python -m accel.launch.bootstrap --no-python CMD``: the bootstrap execs a non-Python
executable (a fresh process; moved out of tests/unit/launch/test_cli_flags.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_bootstrap_no_python_runs_the_executable(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE"))}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "accel.launch.bootstrap", "--no-python",
                           "echo", "hello", "world"], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert (done.returncode, done.stdout) == (0, "hello world\n"), done.stderr
