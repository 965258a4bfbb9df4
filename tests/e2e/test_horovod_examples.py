"""Horovod-shaped example scripts, with only their import line changed, under ``accel launch``
and under ``mpirun`` (simulated: Open MPI's per-rank variables plus ``-x MASTER_ADDR -x
MASTER_PORT``, in real processes; Open MPI is not installed here).

The MNIST-style script gives the same numbers, to the last printed digit, whichever launcher
starts it: the launcher decides only who is rank 0, never the training.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_examples import argv
from tests.spawn import clean_env, free_port

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 240

MNIST = "accel launch --cpu -np 2 examples/horovod_mnist.py"
SYNTHETIC = "accel launch --cpu -np 2 examples/horovod_synthetic_benchmark.py --num-iters 3"
#: README's commands (test_readme.py checks them against these)
COMMANDS = (MNIST, SYNTHETIC)

pytestmark = pytest.mark.slow


def _run(command: str, tmp_path: Path) -> str:
    done = subprocess.run(argv(command), cwd=ROOT, env=clean_env(tmp_path),
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _mpirun(script: str, args: list[str], world: int, tmp_path: Path) -> list[str]:
    """``mpirun -np WORLD -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=P python SCRIPT ARGS``."""
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = clean_env(tmp_path, OMPI_COMM_WORLD_RANK=str(rank),
                        OMPI_COMM_WORLD_SIZE=str(world), OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
                        OMPI_COMM_WORLD_LOCAL_SIZE=str(world), OMPI_COMM_WORLD_NODE_RANK="0",
                        PMIX_RANK=str(rank), PMIX_NAMESPACE=f"hvd-example-{port}",
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, script, *args], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, out + err
        outputs.append(out)
    return outputs


def _numbers(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if re.match(r"(epoch|test|final)", line)]


def test_only_the_import_line_differs_from_horovod() -> None:
    for name in ("horovod_mnist.py", "horovod_synthetic_benchmark.py", "horovod_elastic.py"):
        text = (ROOT / "examples" / name).read_text()
        accel_lines = [line for line in text.splitlines()
                       if re.match(r"\s*(import|from) accel\b", line)]
        assert len(accel_lines) == 1, (name, accel_lines)
        assert "horovod.torch as hvd" in accel_lines[0], accel_lines[0]


def test_mnist_same_numbers_under_accel_launch_and_mpirun(tmp_path: Path) -> None:
    launched = _numbers(_run(MNIST, tmp_path))
    rank0, rank1 = _mpirun("examples/horovod_mnist.py", [], 2, tmp_path)
    assert _numbers(rank1) == []  # only rank 0 prints
    assert launched == _numbers(rank0), (launched, rank0)
    final = re.search(r"final accuracy ([\d.]+)% on 2 process", "\n".join(launched))
    assert final is not None and float(final.group(1)) > 80.0, launched


def test_synthetic_benchmark_under_accel_launch_and_mpirun(tmp_path: Path) -> None:
    out = _run(SYNTHETIC, tmp_path)
    assert "Model: 32-wide CNN, batch size 16, 2 process(es)" in out
    assert re.search(r"Total img/sec on 2 process\(es\): [\d.]+", out), out
    rank0, rank1 = _mpirun("examples/horovod_synthetic_benchmark.py",
                           ["--num-iters", "1", "--fp16-allreduce"], 2, tmp_path)
    assert re.search(r"Total img/sec on 2 process\(es\)", rank0) and "img/sec" not in rank1
