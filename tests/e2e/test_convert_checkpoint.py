"""``accel convert-checkpoint`` on checkpoints written by the real Hugging Face Accelerate.

A subprocess trains under Accelerate and saves its state (safetensors and .bin weights), the
``accel`` command converts each directory, and accel's ``load_state`` restores parameters,
optimizer state, the scheduler, the registered object, the scaler and the RNG streams exactly.
Needs the ``accelerate`` package (in the ``test`` extra); accel itself never imports it.
"""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from accel import Accelerator
from accel.checkpoint import read_manifest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "accelerate_save_state.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                       reason="needs Hugging Face Accelerate to write the checkpoints to "
                       "convert: pip install accelerate (it is in accel's `test` extra)"),
]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("accelerate_save_state", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("accelerate")
    done = subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True,
                          text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def _convert(source: Path, output: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "accel", "convert-checkpoint", str(source),
                           str(output), *flags], capture_output=True, text=True, timeout=240,
                          cwd=ROOT)


def _restore(ckpt: Path, mixed_precision: str) -> dict[str, Any]:
    """Prepare the script's objects under accel, load ``ckpt``, and read everything back."""
    script = _script()
    acc = Accelerator(cpu=True, mixed_precision=mixed_precision)
    model0, model1, opt0, opt1, sched, loader = acc.prepare(*script.build())
    tracker = script.Tracker()
    acc.register_for_checkpointing(tracker)
    # The loader is not stateful (Accelerate's default): it starts its epoch over, as under
    # Accelerate, and the checkpoint's lack of loader positions needs no warning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert acc.load_state(str(ckpt)) == str(ckpt)
    assert not [w for w in caught if "loader positions" in str(w.message)]
    draws = {"python": random.random(), "numpy": np.random.rand(3).tolist(),
             "torch": torch.rand(5)}
    return {"models": [acc.get_state_dict(model0), acc.get_state_dict(model1)],
            "optimizers": [opt0.state_dict(), opt1.state_dict()], "scheduler": sched,
            "tracker": tracker, "draws": draws, "batches": len(list(loader)),
            "scaler": acc.scaler.state_dict() if acc.scaler is not None else None}


def _check_restored(got: dict[str, Any], root: Path) -> None:
    tensors = load_file(str(root / "reference.safetensors"))
    ref = json.loads((root / "reference.json").read_text())
    for i, state in enumerate(got["models"]):
        expected = {k.split(".", 1)[1]: v for k, v in tensors.items()
                    if k.startswith(f"model_{i}.")}
        assert set(state) == set(expected)
        assert all(torch.equal(state[k], expected[k]) for k in expected), f"model {i}"
    for i, opt in enumerate(got["optimizers"]):
        expected = {k.split(".", 1)[1]: v for k, v in tensors.items()
                    if k.startswith(f"optimizer_{i}.")}
        found = {f"{pid}.{key}": value for pid, st in opt["state"].items()
                 for key, value in st.items()}
        assert set(found) == set(expected), (found.keys(), expected.keys())
        assert all(torch.equal(found[k], expected[k]) for k in expected), f"optimizer {i}"
        assert [g["lr"] for g in opt["param_groups"]] == ref["lrs"][i]
    assert {"0.exp_avg", "0.exp_avg_sq", "0.step"} <= set(
        k.split(".", 1)[1] for k in tensors if k.startswith("optimizer_0."))
    assert got["scheduler"].state_dict() == ref["scheduler_0"]
    assert got["scheduler"].last_epoch == ref["scheduler_0"]["last_epoch"] == 6
    tracker = got["tracker"]
    assert (float(tracker.best), tracker.window.tolist(), tracker.count) == (
        ref["tracker"]["best"], ref["tracker"]["window"], ref["tracker"]["count"])
    assert tracker.window.dtype == np.int32
    assert torch.equal(tracker.history, tensors["tracker.history"])
    assert got["draws"]["python"] == ref["python_draw"]
    assert got["draws"]["numpy"] == ref["numpy_draw"]
    assert torch.equal(got["draws"]["torch"], tensors["torch_draw"])
    assert got["batches"] == 6  # the loader was left where it was: a whole epoch ahead


EXPECTED_FILES = {"custom_checkpoint_0.pkl": "custom_0", "optimizer.bin": "optimizer_0",
                  "optimizer_1.bin": "optimizer_1", "random_states_0.pkl": "rank_0/rng",
                  "scaler.pt": "scaler", "scheduler.bin": "scheduler_0"}


def test_safetensors_checkpoint_converts_and_resumes_exactly(written: Path,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "converted"
    done = _convert(written / "safe", out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skipped 0" in done.stdout and "converted 8 file(s)" in done.stdout, done.stdout
    for name, target in {**EXPECTED_FILES, "model.safetensors": "model_0.safetensors",
                         "model_1.safetensors": "model_1.safetensors"}.items():
        assert any(line.split()[:3] == [name, "converted", target]
                   for line in done.stdout.splitlines()), (name, done.stdout)
    manifest = read_manifest(out)
    ref = json.loads((written / "reference.json").read_text())
    assert (manifest.world_size, manifest.step) == (1, 6)  # AdamW's step count
    assert manifest.meta["converted_from"]["accelerate_step"] == ref["accelerate_step"]
    got = _restore(out, "fp16")
    _check_restored(got, written)
    assert got["scaler"] == torch.amp.GradScaler("cpu", **_script().SCALER).state_dict()


def test_bin_checkpoint_converts_with_json_report_and_resumes_exactly(written: Path,
                                                                      tmp_path: Path) -> None:
    out = tmp_path / "converted"
    done = _convert(written / "bin", out, "--json", "--strict")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["skipped"] == [] and report["output"] == str(out)
    assert {f["file"]: f["written_as"] for f in report["files"]} == {
        **EXPECTED_FILES, "pytorch_model.bin": "model_0.safetensors",
        "pytorch_model_1.bin": "model_1.safetensors"}
    got = _restore(out, "no")  # the scaler state is there, and unused without fp16
    _check_restored(got, written)
    assert got["scaler"] is None
