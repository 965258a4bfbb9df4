"""e2e worker: trains 3 epochs, saving every 4 steps; optionally, rank 1 dies during a save.

argv: <project dir> <blocking|non_blocking> <save number to die in, or -1>. On the first
attempt (TORCHELASTIC_RESTART_COUNT=0) rank 1 starts that non-blocking save, holds its
background part (its files are written, the checkpoint is not sealed) and SIGKILLs itself;
``accel launch --max_restarts 1`` starts the job again and ``load_state(missing_ok=True)``
resumes from the newest complete checkpoint. Rank 0 prints ``RESULT {...}`` with the final
parameters (exact float reprs), where it resumed from and what the checkpoint folder held.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import torch
from fail_restart import prepared_run, report  # this directory is on sys.path: the same job

import accel.checkpoint.protocol.save as save_mod

EPOCHS = 3
SAVE_EVERY = 4


def _hold_background() -> None:
    """This rank's background part never reports its files: the save stays in flight."""
    def held(self: object) -> object:
        threading.Event().wait()
        raise AssertionError("unreachable")

    save_mod._RankFiles.result = held  # type: ignore[method-assign,assignment]


def main() -> None:
    project, mode, die_in = sys.argv[1], sys.argv[2], int(sys.argv[3])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    accelerator, model, optimizer, loader, progress = prepared_run(project)
    root = os.path.join(project, "checkpoints")
    found = sorted(os.listdir(root)) if os.path.isdir(root) else []
    resumed = accelerator.load_state(missing_ok=True)
    saves = 0
    while progress.epoch < EPOCHS:
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            progress.step += 1
            if progress.step % SAVE_EVERY:
                continue
            dying = saves == die_in and attempt == 0 and accelerator.process_index == 1
            if dying:
                _hold_background()
            accelerator.save_state(total_limit=2, blocking=mode == "blocking")
            saves += 1
            if dying:
                time.sleep(0.5)  # the writer's threads write this rank's files meanwhile
                os.kill(os.getpid(), signal.SIGKILL)
        progress.epoch += 1
    report(accelerator, model, progress, attempt=attempt,
           resumed=os.path.basename(resumed or ""), found=found)
    accelerator.end_training()


if __name__ == "__main__":
    main()
