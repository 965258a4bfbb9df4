"""benchmarks/report.py and run_all.sh: the records every script writes become results.json,
results.md and a chart (no timing is asserted: the figures here are synthetic or --quick)."""

from __future__ import annotations

import doctest
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "benchmarks"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def bench() -> Any:
    """benchmarks/_common.py and benchmarks/report.py as modules."""
    sys.path.insert(0, str(BENCH))
    try:
        import _common
        import report
    finally:
        sys.path.remove(str(BENCH))
    return _common, report


def _records(common: Any, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four figures as the scripts record them: a met target with Accelerate beside it, a missed
    throughput target (higher is better), one without a target, bytes."""
    monkeypatch.setenv(common.RESULTS_ENV, str(path))
    common.record("bench_step", "training step, tiny (wall)", accel=[1.0e-3, 1.1e-3, 0.9e-3],
                  baseline=[1.0e-3, 1.02e-3, 0.98e-3], baseline_name="DDP",
                  accelerate=[1.2e-3, 1.25e-3, 1.4e-3], target=1.05,
                  note="DDP against itself 1.01")
    common.record("bench_ckpt", "save", accel=[80.0, 100.0, 90.0], baseline=[120.0, 119.0],
                  unit="MB/s", target=1.0, higher_is_better=True)
    common.record("bench_big_model", "disk offload", accel=[5.0, 6.0], baseline=[1.0, 1.0],
                  baseline_name="in memory")
    common.record("bench_fsdp", "memory, 2 processes", accel=3 * 2**20, baseline=2 * 2**20,
                  unit="bytes", target=1.2)


def _strict_json(text: str) -> Any:
    def no_constant(name: str) -> None:
        raise AssertionError(f"results.json holds {name}: not strict JSON")

    return json.loads(text, parse_constant=no_constant)


def test_report_writes_json_markdown_and_chart(bench: Any, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib", reason="the chart needs matplotlib (the test extra and "
                                             "the benchmarks extra install it)")
    common, report = bench
    records, out = tmp_path / "records.jsonl", tmp_path / "out"
    _records(common, records, monkeypatch)
    (tmp_path / "runs.tsv").write_text("bench_step.py\t--quick\t12\tok\n"
                                       "bench_ckpt.py\t\t3\tfailed\n")
    assert report.main([str(records), "--out", str(out), "--runs",
                        str(tmp_path / "runs.tsv")]) == 0

    data = _strict_json((out / "results.json").read_text())
    machine = data["machine"]
    for key in ("cpu", "cores", "ram_bytes", "os", "python", "torch", "accel", "commit", "date",
                "load_average"):
        assert machine[key], key
    assert machine["python"] == ".".join(map(str, sys.version_info[:3]))
    assert len(machine["load_average"]) == 3 and re.fullmatch(r"[0-9a-f]{40}(\+dirty)?",
                                                               machine["commit"])
    assert [r["figure"] for r in data["records"]] == [
        "training step, tiny (wall)", "save", "disk offload", "memory, 2 processes"]
    step, save = data["records"][:2]
    assert step["accel"] == {"median": 1.0e-3, "min": 0.9e-3, "max": 1.1e-3, "n": 3}
    assert step["accelerate"]["median"] == 1.25e-3 and step["met"] is True
    assert save["ratio"] == pytest.approx(119.5 / 90.0) and save["met"] is False
    assert data["summary"] == {"figures": 4, "with_target": 3, "met": 1}
    assert data["runs"] == [
        {"script": "bench_step.py", "options": "--quick", "seconds": 12.0, "status": "ok"},
        {"script": "bench_ckpt.py", "options": "", "seconds": 3.0, "status": "failed"}]
    assert data["quick"] is False

    md = (out / "results.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| bench_")]
    load = re.search(r"load average ([0-9.]+)", step["machine"]).group(1)
    assert rows[0] == (f"| bench_step | training step, tiny (wall) | 1.00 ms | 1.00 ms (DDP) "
                       f"| 1.00 [0.90, 1.10] | ≤ 1.05 | yes | 1.25 | {load} "
                       f"| DDP against itself 1.01 |")
    # throughput: baseline / accel, so the slowest sample (80 MB/s) is the worst ratio
    assert rows[1].startswith("| bench_ckpt | save | 90 MB/s | 119.5 MB/s (torch) "
                              "| 1.33 [1.20, 1.49] | ≤ 1.00 | **no** | - |"), rows[1]
    assert rows[2].startswith("| bench_big_model | disk offload | 5.50 s | 1.00 s (in memory) "
                              "| 5.50 [5.00, 6.00] | - | - | - |"), rows[2]
    assert rows[3].startswith("| bench_fsdp | memory, 2 processes | 3.00 MiB | 2.00 MiB (torch) "
                              "| 1.50 [1.50, 1.50] | ≤ 1.20 | **no** |"), rows[3]
    assert len(rows) == 4 and f"Machine: {machine['cpu']} ({machine['cores']} cores" in md
    assert "![accel / baseline per figure](results.png)" in md
    assert "1 of 3 targets met (4 figures)" in md and "`bench_ckpt.py` 3 s (FAILED)" in md

    assert (out / "results.png").read_bytes()[:8] == PNG_MAGIC
    svg = (out / "results.svg").read_text()
    assert svg.startswith("<?xml")
    for text in ("bench_step: training step, tiny (wall) (vs DDP)", "5.50 (off the axis)",
                 "Hugging Face Accelerate", "target met", " 1.33"):
        assert text in svg, text


def test_report_without_matplotlib_writes_the_rest(bench: Any, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    common, report = bench
    records, out = tmp_path / "records.jsonl", tmp_path / "out"
    _records(common, records, monkeypatch)
    out.mkdir()
    (out / "results.png").write_bytes(PNG_MAGIC)  # an earlier run's chart must not stay
    for name in ("matplotlib", "matplotlib.pyplot"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails: not installed
    assert report.main([str(records), "--out", str(out), "--quick"]) == 0
    err = capsys.readouterr().err
    assert "chart skipped: matplotlib is not installed" in err
    assert "pip install -e .[benchmarks]" in err
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md"]
    data = _strict_json((out / "results.json").read_text())
    assert len(data["records"]) == 4 and data["quick"] is True
    md = (out / "results.md").read_text()
    assert "results.png" not in md and "--quick` run" in md
    assert md.count("\n| bench_") == 4


def test_report_names_a_bad_line(bench: Any, tmp_path: Path) -> None:
    _common, report = bench
    records = tmp_path / "records.jsonl"
    records.write_text('{"benchmark": "x"}\n\nnot json\n')
    with pytest.raises(SystemExit, match=r"records\.jsonl:3 is not a JSON record"):
        report.main([str(records), "--out", str(tmp_path / "out")])


def test_benchmark_helpers_docstring_examples(bench: Any) -> None:
    for module in bench:
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted, module


def _run_all(tmp_path: Path, only: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BENCH_ONLY": only, "PYTHON": sys.executable}
    env.pop("ACCEL_BENCH_RESULTS", None)
    return subprocess.run(["bash", str(BENCH / "run_all.sh"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_run_all_quick_one_script(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = _run_all(tmp_path, "bench_import.py", "--quick", "--no-accelerate", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "== bench_import.py --quick --no-accelerate" in done.stdout
    assert "bench_step" not in done.stdout and "bench_gpu" not in done.stdout  # only that one
    data = _strict_json((out / "results.json").read_text())
    assert data["quick"] is True
    assert [(r["script"], r["options"], r["status"]) for r in data["runs"]] == [
        ("bench_import.py", "--quick --no-accelerate", "ok")]
    figures = {r["figure"]: r for r in data["records"]}
    assert set(figures) == {"from accel import Accelerator", "import accel (lazy: no torch)",
                            "accel --help"}
    for record in figures.values():
        assert record["benchmark"] == "bench_import" and record["accel"]["n"] == 1
        assert record["accelerate"] is None  # --no-accelerate
    assert figures["accel --help"]["target"] > 1 and figures["accel --help"]["met"] is not None
    jsonl = (out / "records.jsonl").read_text().splitlines()
    assert [json.loads(line)["figure"] for line in jsonl] == list(figures)
    assert "Fresh-interpreter wall time" in (out / "output.txt").read_text()
    md = (out / "results.md").read_text()
    assert md.count("\n| bench_import |") == 3


def test_run_all_rejects_an_unknown_script(tmp_path: Path) -> None:
    done = _run_all(tmp_path, "bench_nope.py", "--quick", "--out", str(tmp_path / "r"))
    assert done.returncode == 2
    assert "BENCH_ONLY names bench_nope.py" in done.stderr and "bench_step.py" in done.stderr
    assert not (tmp_path / "r").exists()
    done = _run_all(tmp_path, "bench_import.py", "--fast")
    assert done.returncode == 2 and "unknown option --fast" in done.stderr
