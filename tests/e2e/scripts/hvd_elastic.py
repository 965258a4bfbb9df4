"""e2e worker: Horovod-style elastic training (``hvd.elastic``) that may lose a worker once.

argv: <kill step or -1>. 2 ranks, 64 samples, 4 per rank per step (8 steps an epoch), 3
epochs, a commit every 3 steps. On the first attempt rank 1 kills itself (SIGKILL) right after
the commit of the kill step; ``accel launch --max_restarts 1`` restarts both workers and
``hvd.elastic.run`` resumes them from the newest commit. Printed lines (parsed by the test):
``ENTER {...}`` when the training function starts, ``SEEN {...}`` after each step with the
sample indices this rank trained on, ``RESET {...}`` from the reset callback, and on rank 0
``RESULT {...}`` with the final parameters (exact float reprs).
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import accel.horovod as hvd

EPOCHS, PER_RANK, COMMIT_EVERY, SAMPLES = 3, 4, 3, 64


def emit(tag: str, **row: object) -> None:
    print(f"{tag} {json.dumps(row)}", flush=True)


def main() -> None:
    kill_step = int(sys.argv[1])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    hvd.init()
    torch.manual_seed(0)
    x = torch.randn(SAMPLES, 4)
    data = TensorDataset(torch.arange(SAMPLES), x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=PER_RANK, sampler=sampler)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        emit("ENTER", attempt=attempt, rank=hvd.rank(), epoch=state.epoch, step=state.step,
             remaining=len(state.sampler.remaining_indices))
        for state.epoch in range(state.epoch, EPOCHS):  # noqa: B020 (Horovod's idiom)
            for index, xb, yb in loader:
                loss = torch.nn.functional.mse_loss(state.model(xb), yb)
                state.optimizer.zero_grad()
                loss.backward()
                grads = [p.grad for p in state.model.parameters()]
                for grad, mean in zip(grads, hvd.grouped_allreduce(grads), strict=True):
                    grad.copy_(mean)
                state.optimizer.step()
                state.sampler.record_batch(0, PER_RANK)
                state.step += 1
                emit("SEEN", attempt=attempt, rank=hvd.rank(), epoch=state.epoch,
                     step=state.step, indices=index.tolist())
                if state.step % COMMIT_EVERY == 0:
                    state.commit()
                    if attempt == 0 and hvd.rank() == 1 and state.step == kill_step:
                        os.kill(os.getpid(), signal.SIGKILL)
            state.sampler.set_epoch(state.epoch + 1)

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, step=0)
    state.register_reset_callbacks([lambda: emit("RESET", attempt=attempt, rank=hvd.rank(),
                                                 size=hvd.size())])
    train(state)
    if hvd.rank() == 0:
        emit("RESULT", attempt=attempt, step=state.step,
             params=[repr(v) for p in model.parameters() for v in p.detach().flatten().tolist()])
    hvd.shutdown()


if __name__ == "__main__":
    main()
