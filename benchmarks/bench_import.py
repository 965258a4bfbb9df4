"""Import and CLI start-up cost: ``import accel`` against ``import torch``, and ``accel --help``.

Each variant runs in a fresh interpreter, many times, interleaved (rotating which goes first).
``import accel`` alone does not import torch (names load lazily); ``from accel import
Accelerator`` does, so that line is compared with ``import torch``. ``accel --help`` is the
console script's own start-up (it must not import torch at all). With Hugging Face accelerate
installed, ``from accelerate import Accelerator`` is shown too. Children may write bytecode
(``PYTHONDONTWRITEBYTECODE`` is dropped) as an installed package would have it; the warm-up
runs write it. One extra run with ``-X importtime`` lists the slowest accel modules to import
(cumulative, torch excluded). The table gives min / median / max; the figures go to
run_all.sh's results file with the absolute targets as ratios over this run's baselines.

Run:  python benchmarks/bench_import.py [--repeats 20] [--quick] [--no-accelerate]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

__all__ = ["main"]

ADDED_TARGET = 0.100  # seconds that `from accel import Accelerator` may add to `import torch`
HELP_TARGET = 0.300  # seconds for `accel --help`


def _variants(use_accelerate: bool) -> dict[str, list[str]]:
    py = _common.python()
    # the console script installed next to this interpreter (not a shim elsewhere on PATH)
    script = shutil.which("accel", path=os.path.dirname(py))
    helper = [script, "--help"] if script else [py, "-m", "accel", "--help"]
    variants = {
        "python -c pass": [py, "-c", "pass"],
        "import torch": [py, "-c", "import torch"],
        "import accel": [py, "-c", "import accel"],
        "from accel import Accelerator": [py, "-c", "import accel; from accel import Accelerator"],
        "accel --help": helper,
    }
    if use_accelerate:
        variants["from accelerate import Accelerator"] = [
            py, "-c", "import accelerate; from accelerate import Accelerator"]
    return variants


def _slowest_accel_modules(env: dict[str, str], count: int = 5) -> list[tuple[str, float]]:
    """(module, cumulative seconds) of the slowest ``accel.*`` imports, torch excluded."""
    done = subprocess.run([_common.python(), "-X", "importtime", "-c",
                           "import torch; import accel; from accel import Accelerator"],
                          capture_output=True, text=True, check=True, env=env)
    rows = []
    for line in done.stderr.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[2].lstrip().startswith("accel") and parts[1].isdigit():
            rows.append((parts[2].strip(), int(parts[1]) / 1e6))
    return sorted(rows, key=lambda r: -r[1])[:count]


def _base(name: str) -> str:
    """What a command is compared with: ``import torch`` for the Accelerator lines."""
    return "import torch" if "Accelerator" in name else "python -c pass"


def _record(wall: dict[str, list[float]]) -> None:
    """The targets as ratios over this run's baselines (they are absolute: +100 ms, 0.3 s)."""
    torch_s, bare_s = _common.median(wall["import torch"]), _common.median(wall["python -c pass"])
    _common.record("bench_import", "from accel import Accelerator",
                   accel=wall["from accel import Accelerator"], baseline=wall["import torch"],
                   baseline_name="import torch",
                   accelerate=wall.get("from accelerate import Accelerator"),
                   target=(torch_s + ADDED_TARGET) / torch_s,
                   note=f"target: +{ADDED_TARGET * 1e3:.0f} ms")
    _common.record("bench_import", "import accel (lazy: no torch)", accel=wall["import accel"],
                   baseline=wall["python -c pass"], baseline_name="python -c pass")
    _common.record("bench_import", "accel --help", accel=wall["accel --help"],
                   baseline=wall["python -c pass"], baseline_name="python -c pass",
                   target=HELP_TARGET / bare_s, note=f"target: {HELP_TARGET:.1f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _common.add_common_args(parser, repeats=20)
    args = parser.parse_args(argv)
    repeats, warmup = (1, 0) if args.quick else (args.repeats, 2)
    use_accelerate = _common.has_accelerate() and not args.no_accelerate
    # Installed packages import from bytecode (.pyc); without it every accel module would be
    # compiled on each run while torch's (compiled at install) would not.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ACCEL_") and k != "PYTHONDONTWRITEBYTECODE"}
    commands = _variants(use_accelerate)
    wall, _ = _common.interleave(
        {name: functools.partial(_common.time_command, argv, env=env)
         for name, argv in commands.items()}, repeats=repeats, warmup=warmup)
    medians = {name: _common.median(times) for name, times in wall.items()}
    rows = []
    for name in commands:
        base = _base(name)
        extra = "-" if name == base else f"{(medians[name] - medians[base]) * 1e3:+.0f} ms"
        rows.append([name, medians[name], _common.spread(wall[name]), extra,
                     "" if name == base else base])
    print(_common.format_table(
        f"Fresh-interpreter wall time, median of {repeats} interleaved runs",
        ["command", "wall", "min / median / max", "added", "over"], rows))
    print(_common.machine_line())
    print("slowest accel modules to import (cumulative, after torch): " + ", ".join(
        f"{name} {seconds * 1e3:.1f} ms" for name, seconds in _slowest_accel_modules(env)))
    added = medians["from accel import Accelerator"] - medians["import torch"]
    helps = medians["accel --help"]
    print(f"target: `from accel import Accelerator` adds <= {ADDED_TARGET * 1e3:.0f} ms to "
          f"`import torch`: {added * 1e3:+.0f} ms ({'met' if added <= ADDED_TARGET else 'MISSED'})")
    print(f"target: `accel --help` <= {HELP_TARGET:.1f} s: {helps:.3f} s "
          f"({'met' if helps <= HELP_TARGET else 'MISSED'})")
    _record(wall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
