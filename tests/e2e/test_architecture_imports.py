"""Import cost in a fresh interpreter: ``import accel``, the launcher, env and the L0 modules do
not import torch (moved out of tests/unit/test_architecture.py, which starts no processes; the
module table and the layers are that file's)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.unit.test_architecture import MODULES, ROOT, layer_of


def test_import_accel_and_launch_modules_do_not_import_torch() -> None:
    names = ["accel", *sorted(n for n in MODULES if n.startswith(("accel.launch", "accel.env"))
                              or layer_of(MODULES[n][0]) == "L0" and n != "accel._base.tree"
                              or n == "accel.logging")]
    code = textwrap.dedent(f"""
        import importlib, sys
        for name in {names!r}:
            importlib.import_module(name)
            if "torch" in sys.modules:
                print("TORCH after", name)
                break
        else:
            print("no torch")
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "no torch", (
        f"{out.stdout.strip()}: `import accel` and `accel --help` must not import torch; "
        "import it inside the functions that need it")
