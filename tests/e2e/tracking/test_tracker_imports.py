"""``Accelerator(log_with=...)`` in a fresh interpreter: requesting every tracker imports none of
their libraries (moved out of tests/unit/tracking/test_tracking_services.py, which starts no
processes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.spawn import clean_env


def test_requesting_trackers_imports_no_library(tmp_path: Path) -> None:
    """Accelerator(log_with=...) runs on every rank: it checks the libraries are installed
    without importing them (wandb/mlflow/aim take about a second each to import)."""
    code = ("import sys; from accel import Accelerator; from accel.tracking import "
            "available_trackers as a; "
            f"Accelerator(cpu=True, log_with=a(), project_dir={str(tmp_path)!r}); "
            "print(sorted(m for m in ('wandb', 'mlflow', 'comet_ml', 'aim', 'clearml', 'dvclive', "
            "'swanlab', 'trackio') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120, env=clean_env(tmp_path))
    assert out.stdout.strip() == "[]", out.stderr
