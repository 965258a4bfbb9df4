"""``accel test``: start 2 CPU processes through ``accel launch`` and check that they cooperate.

The workers (:mod:`accel.distributed.health.selftest`) check an all-reduce, an uneven gather, a
broadcast and one DDP training step over gloo (gradients averaged across ranks, parameters
identical afterwards). ``accel test`` prints ``OK`` or what failed.

Example::

    $ accel test
    accel test: OK (2 CPU processes over gloo: reduce, gather, broadcast, DDP step)
"""

from __future__ import annotations

import subprocess
import sys

__all__ = ["run_selftest"]

_WORLD = 2
_TIMEOUT = 180


def run_selftest() -> int:
    """Run ``accel launch --cpu -n 2`` on the worker module; print OK or the failure (0/1)."""
    cmd = [sys.executable, "-m", "accel", "launch", "--cpu", "-n", str(_WORLD), "--quiet",
           "-m", "accel.distributed.health.selftest"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        print(f"accel test: FAILED: the {_WORLD} processes did not finish in {_TIMEOUT} s "
              "(a hang in the rendezvous or a collective)")
        return 1
    oks = [f"rank {rank}: ok" in done.stdout for rank in range(_WORLD)]
    if done.returncode == 0 and all(oks):
        print(f"accel test: OK ({_WORLD} CPU processes over gloo: reduce, gather, broadcast, "
              "DDP step)")
        return 0
    print(f"accel test: FAILED (exit code {done.returncode}); output of `{' '.join(cmd)}`:")
    print(done.stdout + done.stderr)
    return 1
