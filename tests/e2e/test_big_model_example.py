"""README's big-model commands, run verbatim: disk-offloaded inference equal to the full model,
and the memory estimate of the same model built on the meta device."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_examples import argv
from tests.spawn import clean_env

ROOT = Path(__file__).resolve().parents[2]
INFERENCE = "python examples/big_model_inference.py"
ESTIMATE = "accel estimate-memory examples/big_model_inference.py:build_model"
#: README's commands (test_readme.py checks them against these)
COMMANDS = (INFERENCE, ESTIMATE)

pytestmark = pytest.mark.slow


def _run(command: str, tmp_path: Path) -> str:
    done = subprocess.run(argv(command), cwd=ROOT, env=clean_env(tmp_path), capture_output=True,
                          text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_disk_offloaded_inference_equals_the_full_model(tmp_path: Path) -> None:
    out = _run(INFERENCE, tmp_path)
    assert "outputs equal to the fully loaded model's: True" in out, out
    device_map = out.split("device map: ", 1)[1].splitlines()[0]
    assert "'disk'" in device_map and "'cpu'" in device_map, device_map
    assert "'embed': 'cpu', 'head': 'cpu'" in device_map  # tied weights share a device


def test_estimate_memory_of_the_example_model(tmp_path: Path) -> None:
    table = _run(ESTIMATE, tmp_path)
    assert "float32" in table and "training (Adam)" in table and "5,257,216 parameters" in table
    report = json.loads(_run(ESTIMATE + " --json", tmp_path))
    by_dtype = {row["dtype"]: row for row in report["estimates"]}
    # the tied embedding/head counts once; Adam's moments are fp32 whatever the dtype
    assert by_dtype["float32"]["parameters"] == 5_257_216
    assert by_dtype["float32"]["total_bytes"] == 4 * 5_257_216
    assert by_dtype["bfloat16"]["total_bytes"] == 2 * 5_257_216
    assert by_dtype["bfloat16"]["optimizer_bytes"] == 8 * 5_257_216
