"""``pytest -m unit``, ``-m multiprocess`` and ``-m e2e`` select the cost tiers that
tests/conftest.py marks from each test's folder, with ``cuda``/``xla``/``slow`` still working
(pytest runs in a subprocess, so this belongs to the e2e tier)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ["tests/unit/_base", "tests/e2e/_base", "tests/distributed/checkpoint",
          "tests/cuda/test_cuda_paths.py"]


def _collect(marks: str, *paths: str) -> list[str]:
    """Node ids ``pytest --collect-only -m marks paths`` selects."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "-m", marks, *paths], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: none selected
    return [line for line in done.stdout.splitlines() if "::" in line]


def _folders(ids: list[str]) -> set[str]:
    return {"/".join(node.split("::")[0].split("/")[:2]) for node in ids}


def test_each_marker_selects_its_tier() -> None:
    unit = _collect("unit", *SAMPLE)
    assert _folders(unit) == {"tests/unit"}
    assert "tests/unit/_base/test_parse.py::test_parse_gpu_ids" in unit
    assert _folders(_collect("multiprocess", *SAMPLE)) == {"tests/distributed", "tests/cuda"}
    assert _collect("e2e", *SAMPLE) == [
        "tests/e2e/_base/test_parse_imports.py::test_parse_imports_only_the_standard_library"]


def test_the_old_markers_still_select_within_the_tiers() -> None:
    cuda = _collect("multiprocess and cuda", *SAMPLE)
    assert cuda and _folders(cuda) == {"tests/cuda"}
    assert _collect("unit and cuda", *SAMPLE) == []


def test_every_test_has_a_tier() -> None:
    assert _collect("not unit and not multiprocess and not e2e", "tests") == []
