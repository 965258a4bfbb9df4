"""``notebook_launcher`` inside a real Jupyter kernel (nbclient), and its refusals."""

from __future__ import annotations

import re
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

SETUP = f"""\
import sys
sys.path.insert(0, {str(ROOT)!r})
from accel import notebook_launcher

class CellError(Exception):
    pass

def train(scale):
    import os
    import torch
    from accel import Accelerator
    accelerator = Accelerator()
    total = accelerator.reduce(torch.tensor([float(accelerator.process_index + 1)])).item()
    out = {{"rank": accelerator.process_index, "world": accelerator.num_processes,
            "total": total * scale, "device": accelerator.device.type,
            "mp": accelerator.mixed_precision, "pid": os.getpid()}}
    accelerator.end_training()
    return out

def fails():
    import os, time
    if os.environ["RANK"] == "1":
        raise CellError("worker 1 says no")
    time.sleep(60)  # stopped by the agent when rank 1 fails
"""

CELLS = [
    SETUP,
    "first = notebook_launcher(train, (10,), num_processes=2, mixed_precision='bf16')\n"
    "print('FIRST', first)",
    "notebook_launcher(fails, num_processes=2)",
    "second = notebook_launcher(train, (1,), num_processes=2)\nprint('SECOND', second)",
    "import os, signal\nprint('HANDLER', getattr(signal.getsignal(signal.SIGINT), '__module__',"
    " None), 'PIDS_DIFFER', first['pid'] != second['pid'] != os.getpid())",
    "from accel import Accelerator\nparent_accelerator = Accelerator(cpu=True)\n"
    "notebook_launcher(train, (1,), num_processes=2)",
]


def _text(cell: Any) -> str:
    return "".join(out.get("text", "") for out in cell.outputs if out["output_type"] == "stream")


def _error(cell: Any) -> dict[str, Any]:
    errors = [out for out in cell.outputs if out["output_type"] == "error"]
    assert len(errors) == 1, cell.outputs
    plain = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in errors[0]["traceback"]]
    return {"ename": errors[0]["ename"], "evalue": errors[0]["evalue"], "tb": "\n".join(plain)}


@pytest.mark.slow
def test_notebook_launcher_in_a_jupyter_kernel(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    client = nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                                     allow_errors=True,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    cells = notebook.cells
    assert not [out for out in cells[0].outputs if out["output_type"] == "error"]
    first = _text(cells[1])
    assert "FIRST {'rank': 0, 'world': 2, 'total': 30.0, 'device': 'cpu', 'mp': 'bf16'" in first
    error = _error(cells[2])
    assert (error["ename"], error["evalue"]) == ("CellError", "worker 1 says no")
    assert 'raise CellError("worker 1 says no")' in error["tb"]  # the worker's own frame
    assert "worker rank 1 (pid " in error["tb"]
    assert "SECOND {'rank': 0, 'world': 2, 'total': 3.0, 'device': 'cpu', 'mp': 'no'" in \
        _text(cells[3])
    # the kernel's Ctrl-C handler is back (torchelastic had replaced it); fresh workers each call
    assert "HANDLER" in _text(cells[4]) and "torch" not in _text(cells[4])
    assert "PIDS_DIFFER True" in _text(cells[4])
    refused = _error(cells[5])
    assert refused["ename"] == "RuntimeError" and "Accelerator already exists" in \
        refused["evalue"]


def test_refuses_when_cuda_is_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from accel.launch import notebook_launcher

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA is already initialised.*Restart the kernel"):
        notebook_launcher(print, num_processes=2)


def test_refuses_when_an_accelerator_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    from accel.launch import notebook_launcher

    fake = types.ModuleType("accel.accelerator.facade")
    exec(textwrap.dedent("""\
        class Accelerator:
            pass
        """), fake.__dict__)
    monkeypatch.setitem(sys.modules, "accel.accelerator.facade", fake)
    keep = fake.Accelerator()  # noqa: F841 - alive while notebook_launcher scans gc
    with pytest.raises(RuntimeError, match="Accelerator already exists.*inside the function"):
        notebook_launcher(print, num_processes=2)


def test_debug_launcher_returns_rank_zero_and_reraises(tmp_path: Path) -> None:
    from accel.launch import debug_launcher

    assert debug_launcher(_rank_and_device, num_processes=2) == (0, 2, "cpu")
    with pytest.raises(KeyError, match="rank 1 lost its key") as info:
        debug_launcher(_fail_on_rank_one, ("lost its key",), num_processes=2)
    assert "in _fail_on_rank_one" in str(info.value.__cause__)
    assert with_note(info.value, "raised in notebook_launcher worker rank 1")


def with_note(exc: BaseException, text: str) -> bool:
    return any(text in note for note in getattr(exc, "__notes__", []))


def _rank_and_device() -> tuple[int, int, str]:
    import os

    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), os.environ["ACCEL_DEVICE"]


def _fail_on_rank_one(message: str) -> None:
    import os

    if os.environ["RANK"] == "1":
        raise KeyError(f"rank 1 {message}")
