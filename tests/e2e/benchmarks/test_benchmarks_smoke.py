"""The benchmark scripts run (``--quick``: tiny repeat counts). No timing is asserted here:
the figures live in the scripts' output, see benchmarks/README.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "benchmarks"

#: script -> (figures recorded with a target, all figures recorded) in a --quick run: every
#: figure printed with a target goes to $ACCEL_BENCH_RESULTS too, with its samples
RECORDED = {"bench_step.py": (2, 4), "bench_import.py": (2, 3), "bench_launch.py": (1, 1),
            "bench_horovod.py": (4, 4), "bench_horovod_elastic.py": (1, 1),
            "bench_big_model.py": (1, 2), "bench_fsdp.py": (8, 8), "bench_gpu.py": (1, 3),
            "bench_eval.py": (10, 10), "bench_checkpoint.py": (4, 4), "bench_gather.py": (6, 6),
            "bench_sharded_checkpoint.py": (0, 2), "bench_async_checkpoint.py": (2, 2)}


def _run(*args: str, timeout: float = 300, results: Path | None = None
         ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ACCEL_BENCH_RESULTS"}
    if results is not None:
        env["ACCEL_BENCH_RESULTS"] = str(results)
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def _check_records(script: str, results: Path) -> None:
    assert script in RECORDED, f"{script}: add how many figures it records to RECORDED"
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert {r["benchmark"] for r in records} == {script.removesuffix(".py")}, records
    with_target, total = RECORDED[script]
    assert (sum(r["target"] is not None for r in records), len(records)) == (with_target, total)
    for r in records:
        assert r["accel"]["n"] >= 1 and r["baseline"]["n"] >= 1 and r["ratio"] > 0, r
        assert r["met"] == (None if r["target"] is None else r["ratio"] <= r["target"]), r


@pytest.mark.slow
@pytest.mark.parametrize("script, title", [
    ("bench_step.py", "Wall time per training step"),
    ("bench_gather.py", "Wall time per gather"),
    ("bench_eval.py", "Wall time per evaluation batch"),
    ("bench_import.py", "Fresh-interpreter wall time"),
    ("bench_launch.py", "Launch of 2 CPU processes"),
    ("bench_horovod.py", "hvd.DistributedOptimizer / DDP"),
    ("bench_horovod_elastic.py", "Wall time of hvd.elastic's commit"),
    ("bench_big_model.py", "Big-model inference"),
    ("bench_async_checkpoint.py", "Time the training loop is blocked per save"),
])
def test_cpu_benchmark_runs(script: str, title: str, tmp_path: Path) -> None:
    done = _run(str(BENCH / script), "--quick", "--no-accelerate",
                results=tmp_path / "records.jsonl")
    assert done.returncode == 0, done.stdout + done.stderr
    assert title in done.stdout and "target" in done.stdout, done.stdout
    assert "accelerate" not in done.stdout, done.stdout  # --no-accelerate: no third column
    _check_records(script, tmp_path / "records.jsonl")


@pytest.mark.slow
def test_fsdp_benchmark_runs(tmp_path: Path) -> None:
    done = _run(str(BENCH / "bench_fsdp.py"), "--quick", results=tmp_path / "records.jsonl")
    assert done.returncode == 0, done.stdout + done.stderr
    _check_records("bench_fsdp.py", tmp_path / "records.jsonl")
    out = done.stdout
    assert "Wall time per FSDP training step" in out and "CPU time per FSDP" in out, out
    assert "target: accel / torch <= 1.03, medium:" in out, out
    memory = out[out.index("Per-rank memory after one AdamW step"):].splitlines()
    assert [line.split()[0] for line in memory[2:5]] == ["1", "2", "4"], out  # processes
    assert "target: per-rank total <= unsharded total / N + the largest unit" in out, out


@pytest.mark.slow
def test_soak_runs() -> None:
    done = _run(str(BENCH / "soak.py"), "--quick")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "Slope per 1000 steps" in out and "verdict:" in out, out
    rows = {line.split()[0] for line in out.splitlines()[3:]}
    assert {"rss_mib", "fds", "threads", "children", "process_groups", "store_keys",
            "py_objects"} <= rows, out


def test_gpu_benchmark_says_why_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the message for machines without one cannot be checked")
    done = _run(str(BENCH / "bench_gpu.py"), "--quick")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "needs a CUDA GPU" in done.stderr and "torch.cuda.is_available() is False" in done.stderr


@pytest.mark.slow
def test_gpu_benchmark_code_runs_on_cpu(tmp_path: Path) -> None:
    done = _run(str(BENCH / "bench_gpu.py"), "--cpu", "--quick",
                results=tmp_path / "records.jsonl")
    assert done.returncode == 0, done.stdout + done.stderr
    _check_records("bench_gpu.py", tmp_path / "records.jsonl")
    assert "bf16 training step" in done.stdout and "fp16 training step" in done.stdout
    assert "gather_for_metrics" in done.stdout, done.stdout


def test_common_table_and_interleave() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import _common
    finally:
        sys.path.remove(str(BENCH))
    order: list[str] = []
    wall, cpu = _common.interleave({"a": lambda: order.append("a"),
                                    "b": lambda: order.append("b")}, repeats=3, warmup=1)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]  # rotated: drift hits both
    assert len(wall["a"]) == len(cpu["b"]) == 3
    table = _common.format_table("t", ["case", "torch", "accel"], [["x", 0.002, 0.003]],
                                 ratio_of=["accel"])
    assert table.splitlines()[1].split() == ["case", "torch", "accel", "accel", "/", "torch"]
    assert table.splitlines()[2].split() == ["x", "2.00", "ms", "3.00", "ms", "1.50"]


@pytest.mark.slow
def test_checkpoint_benchmark_runs_and_records_its_targets(tmp_path: Path) -> None:
    results = tmp_path / "records.jsonl"
    work = tmp_path / "work"
    work.mkdir()
    done = _run(str(BENCH / "bench_checkpoint.py"), "--quick", "--no-accelerate", "--dir",
                str(work), results=results)
    assert done.returncode == 0, done.stdout + done.stderr
    _check_records("bench_checkpoint.py", results)
    out = done.stdout
    assert "Checkpoint save/load of" in out and "target <= 1.00" in out, out
    for contender in ("torch.save+fsync", "accel storage", "accel save_state", "sha256"):
        assert contender in out, out
    assert "page cache" in out and "Accelerate" not in out, out  # --no-accelerate
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert all(r["accel"]["n"] == 2 and r["accelerate"] is None for r in records), records
    assert list(work.iterdir()) == []  # the checkpoints it wrote are removed


@pytest.mark.slow
def test_sharded_checkpoint_benchmark_runs_and_records(tmp_path: Path) -> None:
    done = _run(str(BENCH / "bench_sharded_checkpoint.py"), "--quick",
                results=tmp_path / "records.jsonl", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    _check_records("bench_sharded_checkpoint.py", tmp_path / "records.jsonl")
    assert "accel min / median / max" in done.stdout, done.stdout
