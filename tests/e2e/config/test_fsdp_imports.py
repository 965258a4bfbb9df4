"""accel.config.fsdp and the launcher's FSDP path in a fresh interpreter: neither imports torch
(moved out of tests/unit/config/test_fsdp_config.py, which starts no processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_module_and_the_launchers_fsdp_path_do_not_import_torch() -> None:
    code = ("import sys\n"
            "from accel.config.fsdp import plugin_from_launch\n"
            "from tests.unit.launch.test_cli import settings\n"
            "s = settings(['--cpu', '-n', '2', '--use_fsdp', '--fsdp_offload_params', 'true',\n"
            "              '--fsdp_state_dict_type', 'FULL_STATE_DICT', 't.py'])\n"
            "assert s.use_fsdp and s.fsdp['fsdp_offload_params'] == 'true'\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
