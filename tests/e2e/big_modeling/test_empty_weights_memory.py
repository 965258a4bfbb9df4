"""init_empty_weights in a fresh process: building a 1 GiB model under it does not raise the
process's peak memory (Linux /proc; moved out of tests/unit/big_modeling/test_big_modeling.py,
which starts no processes)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

_RSS_SCRIPT = textwrap.dedent("""
    import json, re, torch
    from accel.big_modeling import init_empty_weights

    def peak():  # this process's peak RSS (VmHWM; ru_maxrss would count the forked parent's)
        status = open("/proc/self/status").read()
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1)) * 1024

    open("/proc/self/clear_refs", "w").write("5")  # restart the peak from the current RSS

    def blocks(n):
        return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(4096, 4096),
                                                         torch.nn.LayerNorm(4096))
                                     for _ in range(n)])

    start = peak()
    with init_empty_weights():
        empty = blocks(16)  # 268M parameters: 1 GiB in fp32
    after_empty = peak()
    real = blocks(2)  # 128 MiB built normally: the control
    print(json.dumps({"model": sum(p.numel() * 4 for p in empty.parameters()),
                      "empty": after_empty - start, "real": peak() - after_empty}))
""")


def test_an_empty_model_does_not_take_memory() -> None:
    """Peak RSS of a fresh process while it builds a 1 GiB model under init_empty_weights
    (Linux /proc)."""
    done = subprocess.run([sys.executable, "-c", _RSS_SCRIPT], capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    grown = json.loads(done.stdout.strip().splitlines()[-1])
    assert grown["model"] > 2**30
    assert grown["empty"] < 32 * 2**20, grown
    assert grown["real"] > 100 * 2**20, grown  # the measurement sees a real build
