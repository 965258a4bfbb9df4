"""``accel --help`` and the subcommands' help in a fresh interpreter: none imports torch (moved
out of tests/unit/launch/test_cli.py, test_cli_estimate.py and test_cli_flags.py, which start no
processes)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_help_does_not_import_torch() -> None:
    code = textwrap.dedent("""\
        import runpy, sys
        for argv in (["accel", "--help"], ["accel", "launch", "--help"], ["accel", "config",
                     "--help"], ["accel", "convert-checkpoint", "--help"]):
            sys.argv = argv
            try:
                runpy.run_module("accel", run_name="__main__", alter_sys=True)
            except SystemExit as exc:
                assert exc.code == 0, exc.code
        loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        print("TORCH", loaded)
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "TORCH []" in done.stdout and "--num_processes" in done.stdout
    assert "ACCELERATE_DIR" in done.stdout and "weights_only=True" in done.stdout


def test_help_imports_no_torch() -> None:
    code = textwrap.dedent("""\
        import runpy, sys
        for argv in (["accel", "--help"], ["accel", "estimate-memory", "--help"]):
            sys.argv = argv
            try:
                runpy.run_module("accel", run_name="__main__", alter_sys=True)
            except SystemExit as exc:
                assert exc.code == 0, exc.code
        print("TORCH", sorted(m for m in sys.modules if m.split(".")[0] == "torch"))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "TORCH []" in done.stdout
    words = " ".join(done.stdout.split())  # however argparse wrapped the lines
    assert "estimate-memory" in words and "Activations are NOT included" in words


def test_launch_help_does_not_import_torch() -> None:
    code = ("import sys; from accel.launch import cli\n"
            "try:\n    cli.main(['launch', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "--dynamo_backend" in done.stdout and "--use_deepspeed" not in done.stdout
