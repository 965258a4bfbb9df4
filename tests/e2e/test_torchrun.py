"""`torchrun --nproc_per_node 2 script.py` on a machine without a GPU gives a 2-process gloo group.

The script (tests/e2e/scripts/torchrun_probe.py) uses accel the way the Accelerator does:
detect_launch -> select_device -> build_context -> start_process_group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spawn import LAUNCHER_NAMES, LAUNCHER_PREFIXES

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "e2e" / "scripts" / "torchrun_probe.py"


def _clean_env() -> dict[str, str]:
    """This environment without any launcher variables (a stale RANK would be an error)."""
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_NAMES and not k.startswith(LAUNCHER_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    return env


def _torchrun(*script_args: str) -> list[dict[str, object]]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", str(PROBE), *script_args]
    proc = subprocess.run(cmd, cwd=ROOT, env=_clean_env(), capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    reports = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
               if line.startswith("PROBE ")]
    assert len(reports) == 2, f"expected 2 PROBE lines:\n{proc.stdout}\n{proc.stderr}"
    return sorted(reports, key=lambda r: r["rank"])  # type: ignore[arg-type,return-value]


@pytest.mark.slow
def test_torchrun_two_processes_make_a_gloo_group() -> None:
    # auto-detection: this machine has no GPU, so select_device() picks the CPU and gloo;
    # on a GPU machine the same script would get nccl, hence --cpu there.
    from accel.device.cuda import CUDADevice

    args = ("--cpu",) if CUDADevice.count() > 0 else ()
    reports = _torchrun(*args)
    for rank, r in enumerate(reports):
        assert r["launcher"] == "torchrun" and r["use_agent_store"]
        assert (r["rank"], r["world"], r["local_rank"]) == (rank, 2, rank)
        assert (r["dist_rank"], r["dist_world"]) == (rank, 2)
        assert r["backend"] == r["dist_backend"] == "gloo" and r["device"] == "cpu"
        assert r["all_reduce"] == 3.0
        assert r["owned"] and r["closed"]
