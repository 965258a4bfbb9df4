"""Disk offload in a fresh process under an RLIMIT_DATA cap below the model's size: inference
completes, while building the same model in memory fails (moved out of
tests/unit/big_modeling/test_big_modeling_dispatch.py, which starts no processes)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from accel.checkpoint import save

ROOT = Path(__file__).resolve().parents[3]

CHILD = textwrap.dedent("""
    import resource, sys, torch
    from torch import nn
    from accel.big_modeling import (init_empty_weights, load_checkpoint_and_dispatch,
                                    load_checkpoint_in_model)
    from accel.checkpoint import save

    mode, checkpoint, folder, out, model_bytes = sys.argv[1:6]
    def build():
        return nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)))
    def data_bytes():
        for line in open("/proc/self/status"):
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    nn.Sequential(nn.Linear(64, 64))(torch.ones(2, 64))  # thread pools and allocator warm
    baseline = data_bytes()
    cap = baseline + int(model_bytes) // 2
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    print("baseline", baseline, "cap", cap, flush=True)
    x = torch.ones(2, WIDTH)
    if mode == "disk":
        with init_empty_weights():
            model = build()
        device_map = {str(i): "disk" for i in range(DEPTH)}
        load_checkpoint_and_dispatch(model, checkpoint, device_map=device_map,
                                     offload_folder=folder)
    else:
        model = build()  # the whole model in memory: more than the cap allows
        load_checkpoint_in_model(model, checkpoint)
    with torch.no_grad():
        save({"y": model(x)}, out)
    print("done", flush=True)
""")


@pytest.mark.slow
def test_inference_completes_under_a_memory_cap_below_the_model(tmp_path: Path) -> None:
    width, depth = 1024, 16
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(width, width) for _ in range(depth)))
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    save(model, tmp_path / "model.safetensors")
    with torch.no_grad():
        expected = model(torch.ones(2, width))
    del model
    script = tmp_path / "child.py"
    script.write_text(CHILD.replace("WIDTH", str(width)).replace("DEPTH", str(depth)))
    # glibc otherwise keeps freed multi-MB blocks in its heap (its mmap threshold grows after
    # the first free), so a freed layer still counts against RLIMIT_DATA; a fixed threshold
    # gives large blocks back to the system when freed, as a long-running server would tune it
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}

    def run(mode: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), mode, str(tmp_path / "model.safetensors"),
             str(tmp_path / f"off-{mode}"), str(tmp_path / f"{mode}.safetensors"),
             str(model_bytes)], capture_output=True, text=True, timeout=300, env=env)

    disk = run("disk")
    assert disk.returncode == 0 and "done" in disk.stdout, disk.stdout + disk.stderr
    from accel.checkpoint import load
    assert torch.equal(load(tmp_path / "disk.safetensors")["y"], expected)
    full = run("memory")  # the same model built in memory under the same cap
    assert full.returncode != 0 and "done" not in full.stdout, full.stdout
    assert "alloc" in full.stderr.lower() or "memory" in full.stderr.lower(), full.stderr
