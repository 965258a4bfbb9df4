"""Gather the benchmark records into results.json, results.md and a chart (results.png/.svg).

Every benchmark script appends one JSON line per figure to ``$ACCEL_BENCH_RESULTS``
(``_common.record``: accel's samples, the plain-PyTorch baseline's, Accelerate's when it ran,
the ratio and its target). ``run_all.sh`` points that variable at a fresh file, runs the scripts
and then this one, which writes into the output directory:

- ``results.json``: the machine (CPU model, cores, RAM, OS, Python, torch, accel version and
  commit, date, load average), the scripts run (options, seconds, status) and every record;
- ``results.md``: one table row per figure: accel and baseline medians, the ratio with the
  spread of accel's samples, the target, whether it was met, Accelerate's ratio and the load
  average when the figure was taken;
- ``results.png`` and ``results.svg``: one bar group per figure, accel / baseline with whiskers
  from accel's fastest to slowest sample (over the baseline's median), Accelerate's ratio
  beside it, the target as a red mark and 1.0 as a dashed line. Needs matplotlib
  (``pip install -e .[benchmarks]``); without it the chart is skipped, the rest is written.

Every ratio reads "below 1 is better for accel" (for throughput figures the record already
inverts it).

Run:  python benchmarks/report.py RECORDS.jsonl [--out benchmarks/results] [--runs runs.tsv]
          [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["chart", "load_records", "machine_info", "main", "markdown", "write_report"]

ROOT = Path(__file__).resolve().parents[1]
CHART_HINT = "pip install -e .[benchmarks]"


# -- input ------------------------------------------------------------------------------------
def load_records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (blank lines skipped); a bad line names its number."""
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise SystemExit(f"{path}:{number} is not a JSON record ({error}); every line must "
                             "be one record written by benchmarks/_common.py's record()"
                             ) from None
    return records


def load_runs(path: Path | None) -> list[dict[str, Any]]:
    """run_all.sh's table of scripts run: ``script<TAB>options<TAB>seconds<TAB>status``."""
    if path is None or not path.exists():
        return []
    runs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            script, options, seconds, status = line.split("\t")
            runs.append({"script": script, "options": options, "seconds": float(seconds),
                         "status": status})
    return runs


# -- the machine ------------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    if shutil.which("git") is None:
        return None
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def _gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                          capture_output=True, text=True)
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def machine_info() -> dict[str, Any]:
    """Where the figures were taken: hardware, software versions, the commit and the load."""
    commit = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": _cpu_model(), "cores": cores, "ram_bytes": _ram_bytes(), "gpus": _gpus(),
        "os": platform.platform(), "python": platform.python_version(),
        "torch": _version("torch"), "accel": _version("accel"),
        "accelerate": _version("accelerate"),
        "commit": None if commit is None else commit + ("+dirty" if dirty else ""),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average": [round(x, 2) for x in load],
    }


def machine_line(machine: dict[str, Any]) -> str:
    """The machine in one line, for the table and the chart."""
    ram = machine.get("ram_bytes")
    parts = [f"{machine['cpu']} ({machine['cores']} cores"
             + (f", {ram / 2**30:.0f} GiB RAM)" if ram else ")")]
    if machine.get("gpus"):
        parts.append(", ".join(machine["gpus"]))
    parts += [machine["os"], f"Python {machine['python']}", f"torch {machine['torch']}",
              f"accel {machine['accel']}"
              + (f" ({machine['commit'][:12]})" if machine.get("commit") else "")]
    if machine.get("accelerate"):
        parts.append(f"accelerate {machine['accelerate']}")
    load = machine.get("load_average") or []
    if load:
        parts.append("load average " + " / ".join(f"{x:.2f}" for x in load) + " (1/5/15 min)")
    parts.append(machine["date"])
    return "; ".join(parts)


# -- figures ----------------------------------------------------------------------------------
def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def ratio_of(record: dict[str, Any], side: str = "accel", stat: str = "median") -> float:
    """``side``'s ``stat`` against the baseline's median, oriented so that below 1 is better
    for accel (throughput figures: baseline / value).

    Example:
        >>> rec = {"accel": {"median": 50.0, "min": 40.0}, "baseline": {"median": 100.0},
        ...        "higher_is_better": True}
        >>> ratio_of(rec), ratio_of(rec, stat="min"), ratio_of(rec, "accelerate")
        (2.0, 2.5, nan)
    """
    stats, base = record.get(side), record["baseline"]["median"]
    if not stats or not _finite(stats.get(stat)) or not _finite(base):
        return math.nan
    value = stats[stat]
    if record.get("higher_is_better"):
        return base / value if value else math.nan
    return value / base if base else math.nan


def ratio_range(record: dict[str, Any], side: str = "accel") -> tuple[float, float]:
    """(best, worst) ratio of ``side``'s fastest and slowest samples to the baseline median."""
    low, high = ratio_of(record, side, "min"), ratio_of(record, side, "max")
    return (min(low, high), max(low, high)) if _finite(low) and _finite(high) else (low, high)


def _amount(value: Any, unit: str) -> str:
    if not _finite(value):
        return "-"
    if unit == "s":
        if value >= 1:
            return f"{value:.2f} s"
        return f"{value * 1e3:.2f} ms" if value >= 1e-3 else f"{value * 1e6:.1f} µs"
    if unit == "bytes":
        return f"{value / 2**20:.2f} MiB" if value >= 2**20 else f"{value / 2**10:.1f} KiB"
    return f"{value:.4g} {unit}"


def _number(value: float) -> str:
    return f"{value:.2f}" if _finite(value) else "-"


_LOAD = re.compile(r"load average ([0-9.]+)")


def label(record: dict[str, Any]) -> str:
    """``bench_step: tiny MLP, wall (vs DDP)``."""
    name = record["benchmark"].removesuffix(".py")
    return f"{name}: {record['figure']} (vs {record.get('baseline_name', 'torch')})"


def markdown(records: Sequence[dict[str, Any]], machine: dict[str, Any],
             runs: Sequence[dict[str, Any]] = (), chart_name: str | None = "results.png",
             quick: bool = False) -> str:
    """The results as markdown: the machine, the chart, one table row per figure."""
    lines = ["# Benchmark results: accel against plain PyTorch", ""]
    if quick:
        lines += ["**`--quick` run: tiny sizes and repeat counts, the figures mean nothing.**", ""]
    lines += [f"Machine: {machine_line(machine)}.", ""]
    if chart_name:
        lines += [f"![accel / baseline per figure]({chart_name})", ""]
    lines += ["Ratio: accel's median / the baseline's median, measured side by side in one run "
              "(below 1: accel is faster or smaller; throughput figures are inverted so the same "
              "holds); in brackets the ratio of accel's fastest and slowest sample. Accelerate: "
              "Hugging Face Accelerate's median over the same baseline. Load: the 1-minute load "
              "average when the figure was taken (the machine's cores: see above).", "",
              "| benchmark | figure | accel | baseline | ratio [min, max] | target | met "
              "| Accelerate | load | note |",
              "|---|---|---:|---:|---:|---:|:---:|---:|---:|---|"]
    for rec in records:
        unit = rec.get("unit", "s")
        low, high = ratio_range(rec)
        spread = f" [{_number(low)}, {_number(high)}]" if _finite(low) else ""
        target = rec.get("target")
        met = {None: "-", True: "yes", False: "**no**"}[rec.get("met")]
        load = _LOAD.search(rec.get("machine", ""))
        lines.append(
            f"| {rec['benchmark'].removesuffix('.py')} | {rec['figure']} "
            f"| {_amount(rec['accel']['median'], unit)} "
            f"| {_amount(rec['baseline']['median'], unit)} ({rec.get('baseline_name', 'torch')}) "
            f"| {_number(rec['ratio'])}{spread} "
            f"| {'-' if target is None else f'≤ {target:.2f}'} | {met} "
            f"| {_number(ratio_of(rec, 'accelerate'))} | {load.group(1) if load else '-'} "
            f"| {rec.get('note') or ''} |")
    with_target = [r for r in records if r.get("met") is not None]
    lines += ["", f"{sum(1 for r in with_target if r['met'])} of {len(with_target)} targets met "
              f"({len(records)} figures)."]
    if runs:
        total = sum(r["seconds"] for r in runs)
        lines += ["", f"Scripts run ({total / 60:.1f} min in all): " + ", ".join(
            f"`{r['script']}` {r['seconds']:.0f} s" + ("" if r["status"] == "ok" else " (FAILED)")
            for r in runs) + "."]
    return "\n".join(lines) + "\n"


# -- the chart --------------------------------------------------------------------------------
COLOURS = {True: "#2e7d32", False: "#c62828", None: "#1565c0"}  # target met, missed, none
ACCELERATE_COLOUR = "#f9a825"
TICKS = (0.1, 0.2, 0.33, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 3)
#: the axis ends here: farther ratios are drawn to the edge with their value written out, so
#: that one slow outlier does not squeeze the figures near 1.0 that the chart is about
CLIP = (1 / 3, 3.0)


def _clip(value: float) -> float:
    return min(max(value, CLIP[0]), CLIP[1]) if _finite(value) else value


def _bar(ax: Any, y: float, value: float, spread: tuple[float, float], height: float,
         colour: str, target: float | None = None) -> list[float]:
    """One bar from 1.0 to ``value`` with whiskers over ``spread`` and its value written beside
    (with the target when that is off the axis); returns the clipped values drawn."""
    shown, low, high = _clip(value), _clip(spread[0]), _clip(spread[1])
    xerr = ([[max(shown - low, 0)], [max(high - shown, 0)]]
            if _finite(low) and _finite(high) else None)
    ax.barh(y, shown - 1.0, left=1.0, height=height, color=colour, xerr=xerr, capsize=3,
            ecolor="#333333", error_kw={"linewidth": 1},
            hatch="//" if shown != value else None, edgecolor="white", linewidth=0)
    text = f" {value:.2f}" + (" (off the axis)" if shown != value else "")
    if target is not None and _clip(target) != target:
        text += f", target {target:.2f}"
    right = max(v for v in (shown, low, high, 1.0) if _finite(v))
    ax.text(right * 1.01, y, text, va="center", fontsize=7)
    return [shown, low, high]


def chart(records: Sequence[dict[str, Any]], machine: dict[str, Any], out: Path,
          quick: bool = False) -> list[Path]:
    """results.png and results.svg in ``out``; raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "accel-benchmarks"  # same input, same svg
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: searchable, smaller
    shown = [r for r in records if _finite(r.get("ratio")) and r["ratio"] > 0]
    count = max(len(shown), 1)
    fig, ax = plt.subplots(figsize=(11, 1.8 + 0.42 * count))
    values = [1.0]
    for index, rec in enumerate(shown):
        y = count - 1 - index  # first record on top
        theirs = ratio_of(rec, "accelerate")
        both = _finite(theirs) and theirs > 0
        target = rec.get("target")
        values += _bar(ax, y + (0.2 if both else 0), rec["ratio"], ratio_range(rec),
                       0.38 if both else 0.6, COLOURS[rec.get("met")], target)
        if both:
            values += _bar(ax, y - 0.2, theirs, ratio_range(rec, "accelerate"), 0.38,
                           ACCELERATE_COLOUR)
        if target is not None and _clip(target) == target:
            ax.vlines(target, y - 0.45, y + 0.45, colors="#d50000", linewidth=2.5)
            values.append(target)
    _x_axis(ax, [v for v in values if _finite(v) and v > 0])
    ax.axvline(1.0, color="#555555", linestyle="--", linewidth=1)
    ax.set_yticks(range(count))
    ax.set_yticklabels([label(r) for r in reversed(shown)] or ["(no figures)"], fontsize=8)
    ax.set_ylim(-0.6, count - 0.4)
    ax.set_xlabel("accel / baseline (median; below 1: accel is faster or smaller)")
    _legend(ax)
    title = "accel against plain PyTorch" + (" (--quick: figures mean nothing)" if quick else "")
    ax.set_title(f"{title}\n{_short_machine(machine)}", fontsize=9)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.png", out / "results.svg"]
    fig.savefig(paths[0], dpi=110, bbox_inches="tight", metadata={"Software": None})
    fig.savefig(paths[1], bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return paths


def _x_axis(ax: Any, values: list[float]) -> None:
    """Log scale (ratios: 0.5 and 2 are as far from 1), ticks at round ratios in range."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    low, high = min(values) / 1.15, max(values) * 1.25
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    gap = (math.log(high) - math.log(low)) / 14  # ticks at least 1/14 of the axis apart
    ticks = [1.0]
    for tick in sorted(TICKS, key=lambda t: abs(math.log(t))):  # 1.0 first, then outwards
        if low <= tick <= high and all(abs(math.log(tick / t)) >= gap for t in ticks):
            ticks.append(tick)
    ax.xaxis.set_major_locator(FixedLocator(sorted(ticks)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())


def _legend(ax: Any) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.transforms import offset_copy

    ax.legend(handles=[Patch(color=COLOURS[True], label="accel, target met"),
                       Patch(color=COLOURS[False], label="accel, target missed"),
                       Patch(color=COLOURS[None], label="accel, no target"),
                       Patch(color=ACCELERATE_COLOUR, label="Hugging Face Accelerate"),
                       Line2D([], [], color="#d50000", linewidth=2.5, label="target"),
                       Line2D([], [], color="#333333", marker="|", linestyle="-",
                              label="fastest..slowest sample / baseline median"),
                       Line2D([], [], color="#555555", linestyle="--", label="baseline (1.0)")],
              fontsize=7, loc="upper center", ncol=4, frameon=False, bbox_to_anchor=(0.5, 0),
              # below the axis label, whatever the figure's height
              bbox_transform=offset_copy(ax.transAxes, fig=ax.figure, y=-0.5, units="inches"))


def _short_machine(machine: dict[str, Any]) -> str:
    load = machine.get("load_average") or [math.nan]
    gpu = f", {machine['gpus'][0]}" if machine.get("gpus") else ""
    return (f"{machine['cpu']} ({machine['cores']} cores){gpu}, torch {machine['torch']}, "
            f"accel {machine['accel']} {(machine.get('commit') or '')[:12]}, "
            f"load {load[0]:.2f}, {machine['date']}")


# -- output -----------------------------------------------------------------------------------
def _json_safe(value: Any) -> Any:
    """NaN and infinities become null: results.json is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def write_report(records: Sequence[dict[str, Any]], out: Path,
                 runs: Sequence[dict[str, Any]] = (), quick: bool = False,
                 machine: dict[str, Any] | None = None) -> list[Path]:
    """Write results.json, results.md and (with matplotlib) the chart; return the paths."""
    machine = machine_info() if machine is None else machine
    out.mkdir(parents=True, exist_ok=True)
    try:
        paths = chart(records, machine, out, quick)
    except ImportError:
        paths = []
        for stale in ("results.png", "results.svg"):  # never leave an old run's chart
            (out / stale).unlink(missing_ok=True)
        print(f"report: chart skipped: matplotlib is not installed ({CHART_HINT} adds it)",
              file=sys.stderr)
    data = {"machine": machine, "quick": quick, "runs": list(runs), "records": list(records),
            "summary": {"figures": len(records),
                        "with_target": sum(1 for r in records if r.get("met") is not None),
                        "met": sum(1 for r in records if r.get("met"))}}
    (out / "results.json").write_text(
        json.dumps(_json_safe(data), indent=1, sort_keys=True, allow_nan=False) + "\n",
        encoding="utf-8")
    (out / "results.md").write_text(
        markdown(records, machine, runs, "results.png" if paths else None, quick),
        encoding="utf-8")
    return [out / "results.json", out / "results.md", *paths]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="?", default=os.environ.get("ACCEL_BENCH_RESULTS"),
                        help="the JSON-lines file the scripts wrote (default: "
                             "$ACCEL_BENCH_RESULTS)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"),
                        help="output directory (default: benchmarks/results)")
    parser.add_argument("--runs", default=None,
                        help="run_all.sh's table of scripts run (script, options, seconds, "
                             "status; tab-separated)")
    parser.add_argument("--quick", action="store_true",
                        help="the records come from a --quick run (said in the table/chart)")
    args = parser.parse_args(argv)
    if not args.records:
        parser.error("no records: pass the JSON-lines file, or set ACCEL_BENCH_RESULTS")
    records = load_records(Path(args.records))
    if not records:
        print(f"report: {args.records} holds no records (did every script fail?)",
              file=sys.stderr)
    paths = write_report(records, Path(args.out), load_runs(args.runs and Path(args.runs)),
                         args.quick)
    print("report: wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
