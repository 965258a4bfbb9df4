"""The training job of the chaos drill (``benchmarks/chaos_drill.py``, ``tests/e2e/test_chaos.py``).

    accel launch --cpu -n 2 --max_restarts R benchmarks/_chaos_train.py <run dir> [options]

It trains a small MLP (with dropout, so that restored RNG streams matter) for ``--steps``
optimizer steps over data made here from a fixed seed, shuffled each epoch, with
``save_state()`` every ``--save_every`` steps (automatic names, ``total_limit``) and
``load_state(missing_ok=True)`` at start: the resume idiom of the README, with
``use_stateful_dataloader=True`` so that a resumed run continues with the next unseen batch.

For the controller that kills it, every rank announces what it is doing in
``<run dir>/status/attempt_<a>_rank_<r>.json`` (written atomically: ``{"attempt", "pid",
"phase", "step", "resumed"}``, phase one of start/load/train/save/done) and appends one line per
finished step to ``<run dir>/steps/rank_<r>.log`` (``attempt step``), which counts the work
done by attempts that were killed. At the end rank 0 writes every parameter and optimizer tensor to
``<run dir>/final.pt`` (``torch.save``; read with ``weights_only=True``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, DataLoaderConfiguration, ProjectConfiguration


class Progress:
    """Epoch and global step, saved with every checkpoint (registered for checkpointing)."""

    def __init__(self) -> None:
        self.epoch = self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.step = int(state["epoch"]), int(state["step"])


class Announcer:
    """This rank's status file (atomic replace) and its append-only log of finished steps."""

    def __init__(self, run_dir: Path, rank: int, attempt: int) -> None:
        self.attempt, self.pid = attempt, os.getpid()
        self.resumed = ""  # the checkpoint this attempt loaded
        (run_dir / "status").mkdir(parents=True, exist_ok=True)
        (run_dir / "steps").mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "status" / f"attempt_{attempt}_rank_{rank}.json"
        self.tmp = self.path.with_name(f".{self.path.name}.tmp")
        self.log = os.open(run_dir / "steps" / f"rank_{rank}.log",
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def phase(self, phase: str, step: int) -> None:
        self.tmp.write_text(json.dumps({"attempt": self.attempt, "pid": self.pid,
                                        "phase": phase, "step": step,
                                        "resumed": self.resumed}))
        os.replace(self.tmp, self.path)

    def finished(self, step: int) -> None:
        os.write(self.log, f"{self.attempt} {step}\n".encode())  # one write: whole lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps in all")
    parser.add_argument("--save_every", type=int, default=5)
    parser.add_argument("--total_limit", type=int, default=2)
    parser.add_argument("--samples", type=int, default=256, help="dataset size (all ranks)")
    parser.add_argument("--batch_size", type=int, default=8, help="per process")
    parser.add_argument("--width", type=int, default=256, help="hidden width of the MLP")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    return parser.parse_args()


def build(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, Any]:
    torch.manual_seed(0)
    x = torch.randn(args.samples, 16)
    y = torch.sin(x @ torch.randn(16, 1))
    model = torch.nn.Sequential(torch.nn.Linear(16, args.width), torch.nn.ReLU(),
                                torch.nn.Dropout(0.1), torch.nn.Linear(args.width, args.width),
                                torch.nn.ReLU(), torch.nn.Linear(args.width, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.9)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers)
    return model, optimizer, scheduler, loader


def final_tensors(accelerator: Accelerator, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {f"model.{k}": v.detach().clone()
           for k, v in accelerator.unwrap_model(model).state_dict().items()}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            out[f"optimizer.{index}.{key}"] = torch.as_tensor(value).clone()
    return out


def main() -> None:
    args = parse_args()
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    announce = Announcer(args.run_dir, rank, attempt)
    announce.phase("start", -1)
    config = ProjectConfiguration(project_dir=str(args.run_dir / "project"),
                                  automatic_checkpoint_naming=True,
                                  total_limit=args.total_limit)
    accelerator = Accelerator(cpu=True, project_config=config, dataloader_config=(
        DataLoaderConfiguration(use_stateful_dataloader=True)))
    model, optimizer, scheduler, loader = accelerator.prepare(*build(args))
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    announce.phase("load", -1)
    announce.resumed = os.path.basename(accelerator.load_state(missing_ok=True) or "")
    announce.phase("train", progress.step)
    while progress.step < args.steps:
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.step += 1
            announce.finished(progress.step)
            if progress.step % args.save_every == 0 or progress.step == args.steps:
                announce.phase("save", progress.step)
                accelerator.save_state()
                announce.phase("train", progress.step)
            if progress.step == args.steps:
                break
        else:
            progress.epoch += 1
    if accelerator.is_main_process:
        tmp = args.run_dir / ".final.pt.tmp"
        torch.save(final_tensors(accelerator, model, optimizer), tmp)
        os.replace(tmp, args.run_dir / "final.pt")
    announce.phase("done", progress.step)
    accelerator.end_training()


if __name__ == "__main__":
    main()
