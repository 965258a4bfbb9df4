"""accel._base.parse in a fresh interpreter: it imports only the standard library (moved out of
tests/unit/_base/test_parse.py, which starts no processes)."""

from __future__ import annotations

import subprocess
import sys


def test_parse_imports_only_the_standard_library() -> None:
    code = ("import sys, accel._base.parse; "
            "print(sorted(m for m in sys.modules if m.startswith(('accel.', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    # `import accel` itself brings only its version module along
    assert out.stdout.strip() == "['accel._base', 'accel._base.parse', 'accel._base.version']"
