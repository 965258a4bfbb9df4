"""A diffusers-style training script (tests/compat/scripts/diffusers_style.py), written for
Hugging Face Accelerate, runs under accel with only its import lines changed, and trains on
exactly what it trains on under Accelerate: the same batches before and after a resume from its
main-process-only checkpoint, the same losses, the same final weights.

Both libraries run it in 2 CPU processes: Accelerate through torchrun, accel through
``accel launch``. Each runs it twice: to step 5 (a checkpoint is saved at step 4), then resumed
from that checkpoint to step 8, skipping the finished batches by hand as the script does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("accelerate", reason="the comparison runs the script under Accelerate too: "
                    "install the test extra (pip install -e '.[test]')")

from tests.compat.harness import swap_imports
from tests.spawn import clean_env, free_port

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "diffusers_style.py"

#: Plain torch.distributed, and so Accelerate, can abort a finished worker at exit (SIGABRT,
#: this line): a gloo thread releases the last collective's tensors while Python shuts down
#: (see tests/e2e/test_exit.py; accel lets those threads finish first). Accepted for the
#: Accelerate run only, after the script's work is done (its report is checked).
UPSTREAM_EXIT_ABORT = "terminate called without an active exception"


def _run(library: str, script: Path, out: Path, *args: str) -> None:
    env = clean_env(out.parent, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    if library == "accel":
        cmd = [sys.executable, "-m", "accel", "launch", "--num_processes", "2",
               "--main_process_port", str(free_port())]
    else:
        env["ACCELERATE_USE_CPU"] = "1"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_port", str(free_port())]
    cmd += [str(script), "--output_dir", str(out), "--checkpointing_steps", "4", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = proc.stdout + proc.stderr
    before = output.split(UPSTREAM_EXIT_ABORT)[0]
    upstream_abort = (library == "accelerate" and UPSTREAM_EXIT_ABORT in output
                      and "exitcode: -6" in output and f'File "{script}"' not in before)
    assert proc.returncode == 0 or upstream_abort, f"{library} {args}: exit " \
        f"{proc.returncode}\n" + "\n".join(output.splitlines()[-60:])


def _train_and_resume(library: str, tmp: Path) -> dict[str, Any]:
    out = tmp / library / "run"
    out.mkdir(parents=True)
    script = tmp / library / "train.py"
    source = SCRIPT.read_text()
    script.write_text(swap_imports(source) if library == "accel" else source)
    _run(library, script, out, "--max_train_steps", "5")
    first = json.loads((out / "report-first.json").read_text())
    checkpoints = sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))
    _run(library, script, out, "--max_train_steps", "8", "--resume_from_checkpoint", "latest")
    resumed = json.loads((out / "report-resumed.json").read_text())
    weights = load_file(str(out / "final" / "diffusion_pytorch_model.safetensors"))
    return {"first": first, "resumed": resumed, "weights": weights, "out": out,
            "checkpoints": checkpoints}


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("diffusers")
    return {lib: _train_and_resume(lib, tmp) for lib in ("accelerate", "accel")}


def test_runs_as_under_accelerate(both: dict[str, dict[str, Any]]) -> None:
    ours, theirs = both["accel"], both["accelerate"]
    for phase in ("first", "resumed"):
        assert ours[phase]["seen"] == theirs[phase]["seen"], f"{phase}: different batches"
        assert ours[phase]["global_step"] == theirs[phase]["global_step"]
        torch.testing.assert_close(torch.tensor(ours[phase]["losses"]),
                                   torch.tensor(theirs[phase]["losses"]), rtol=1e-5, atol=1e-6)
    # The resumed run starts after the checkpoint (step 4), not from the start.
    assert ours["resumed"]["global_step"] == 8 and len(ours["resumed"]["losses"]) == 4
    assert ours["weights"].keys() == theirs["weights"].keys()
    for name, tensor in ours["weights"].items():
        torch.testing.assert_close(tensor, theirs["weights"][name], rtol=1e-5, atol=1e-6)


def test_state_trackers_and_checkpoint_layout(both: dict[str, dict[str, Any]]) -> None:
    ours = both["accel"]
    report = ours["resumed"]
    assert report["num_processes"] == 2 and report["distributed_type"] == "MULTI_CPU"
    assert report["trackers"] == ["tensorboard"]  # initialised on the main process only
    assert list((ours["out"] / "logs").rglob("events.out.tfevents.*")), "no tensorboard run"
    assert ours["checkpoints"] == ["checkpoint-4"]
    checkpoint = ours["out"] / "checkpoint-4"
    # The save hook wrote the sub-model itself (save_pretrained) into the checkpoint, and popped
    # its weights, so the checkpoint holds them once. The script registers its hooks only when
    # accelerate.__version__ >= 0.16.0 (diffusers' gate): accel.__version__ must pass it.
    assert (checkpoint / "unet" / "diffusion_pytorch_model.safetensors").is_file()
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    listed = json.dumps(manifest)
    assert "unet/diffusion_pytorch_model.safetensors" in listed
