"""``register_save_state_pre_hook`` / ``register_load_state_pre_hook`` with Accelerate's semantics.

The diffusers pattern: a save hook saves one sub-model itself on the main process (and pops its
weights on every rank); the load hook loads it back and pops it from ``models``; accel writes
and loads the rest. What the hook writes is inside the atomic checkpoint and its manifest.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tests.spawn import run_workers


def _scenario(rank: int, project: str) -> dict[str, Any]:
    from safetensors.torch import load_file, save_file

    from accel import Accelerator
    from accel.checkpoint import read_manifest

    accelerator = Accelerator(cpu=True, project_dir=project)
    torch.manual_seed(0)
    unet, head = nn.Linear(3, 3), nn.Linear(3, 1)
    unet, head = accelerator.prepare(unet, head)
    seen: dict[str, Any] = {}

    def save_hook(models: list[nn.Module], weights: list[Any], output_dir: str) -> None:
        seen["save_models"] = len(models)
        for i, model in enumerate(models):
            if accelerator.unwrap_model(model) is accelerator.unwrap_model(unet):
                if accelerator.is_main_process:
                    os.makedirs(os.path.join(output_dir, "unet"), exist_ok=True)
                    save_file({k: v.contiguous() for k, v in
                               accelerator.unwrap_model(model).state_dict().items()},
                              os.path.join(output_dir, "unet", "weights.safetensors"))
                weights.pop(i)

    def load_hook(models: list[nn.Module], input_dir: str) -> None:
        for i, model in enumerate(models):
            if accelerator.unwrap_model(model) is accelerator.unwrap_model(unet):
                state = load_file(os.path.join(input_dir, "unet", "weights.safetensors"))
                accelerator.unwrap_model(models.pop(i)).load_state_dict(state)
                seen["loaded_by_hook"] = True
                return

    accelerator.register_save_state_pre_hook(save_hook)
    handle = accelerator.register_load_state_pre_hook(load_hook)
    path = accelerator.save_state()
    files = sorted(read_manifest(Path(path)).files)
    expected = {k: v.clone() for k, v in {**accelerator.unwrap_model(unet).state_dict(),
                                            **{f"head.{k}": v for k, v in
                                               accelerator.unwrap_model(head).state_dict().items()}
                                            }.items()}
    with torch.no_grad():
        for p in [*unet.parameters(), *head.parameters()]:
            p.zero_()
    accelerator.load_state(path)
    restored = {**accelerator.unwrap_model(unet).state_dict(),
                **{f"head.{k}": v for k, v in accelerator.unwrap_model(head).state_dict().items()}}
    same = all(torch.equal(expected[k], restored[k]) for k in expected)
    handle.remove()
    seen.pop("loaded_by_hook")
    with torch.no_grad():
        for p in head.parameters():
            p.zero_()
    error = ""
    try:  # without the load hook, 2 models are prepared but the checkpoint has 1 for accel
        accelerator.load_state(path)
    except Exception as exc:  # noqa: BLE001 - the message is the result
        error = str(exc)
    accelerator.end_training()
    return {"files": files, "same": same, **seen, "error": error}


def test_save_and_load_hooks_across_two_processes(tmp_path: Path) -> None:
    rank0, rank1 = run_workers(_scenario, 2, args=(str(tmp_path),))
    for result in (rank0, rank1):
        assert result["same"], "the hook-saved and the accel-saved models both came back"
        assert result["save_models"] == 2
        assert "unet/weights.safetensors" in result["files"]  # in the manifest: verified, atomic
        assert "model_0.safetensors" in result["files"]
        assert "model_1.safetensors" not in result["files"]  # the hook took the unet's weights
        assert "models: 1 saved, 2 prepared" in result["error"]
