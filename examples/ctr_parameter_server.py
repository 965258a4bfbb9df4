"""Wide-and-deep click-through-rate model with a 1M-row embedding table on parameter servers.

The embedding table lives on the server processes (``accel.ps.ShardedEmbedding``): each step a
worker pulls only the rows its batch uses and pushes their gradients back, and the servers
apply Adagrad per row. The dense part (the deep MLP and the wide linear layer) stays on the
workers and is all-reduced among them by the ``Accelerator`` as in any data-parallel run.

    accel launch --cpu --server_num 1 --worker_num 2 examples/ctr_parameter_server.py

``--mode async`` applies gradients on arrival, ``--mode geo --k_steps 8`` trains rows locally
and exchanges deltas every 8 steps. The run saves a checkpoint at the end
(``<project_dir>/checkpoints/checkpoint_<n>``, with the servers' shards under ``ps/``) and a
second run resumes from it. The data are synthetic: 26 categorical fields hashed into the
table, 13 numeric ones, and a click drawn from hidden per-id weights, so the loss can fall.
The same script runs as ``python examples/ctr_parameter_server.py`` (one process that holds
the table itself).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from accel import Accelerator, ProjectConfiguration, ps

FIELDS, NUMERIC = 26, 13


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Wide-and-deep CTR on parameter servers.")
    parser.add_argument("--rows", type=int, default=1_000_000, help="embedding table rows")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=256, help="per worker")
    parser.add_argument("--mode", choices=["sync", "async", "geo"], default="sync")
    parser.add_argument("--k_steps", type=int, default=8, help="geo: steps between exchanges")
    parser.add_argument("--project_dir", default="runs/ctr_ps")
    return parser.parse_args()


class WideAndDeep(nn.Module):
    def __init__(self, table: ps.ShardedEmbedding, wide: ps.ShardedEmbeddingBag,
                 dim: int) -> None:
        super().__init__()
        self.table, self.wide_ids = table, wide  # deep embeddings; wide: a 1-wide bag (sum)
        self.deep = nn.Sequential(nn.Linear(FIELDS * dim + NUMERIC, 128), nn.ReLU(),
                                  nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 1))
        self.wide_dense = nn.Linear(NUMERIC, 1)

    def forward(self, ids: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        deep = self.deep(torch.cat([self.table(ids).flatten(1), numeric], 1))
        wide = self.wide_ids(ids) + self.wide_dense(numeric)
        return (deep + wide).squeeze(1)


def synthetic_batch(step: int, worker: int, size: int, rows: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch of hashed categorical ids (skewed: small ids are frequent), numeric features and
    clicks drawn from hidden weights of the ids."""
    gen = torch.Generator().manual_seed(step * 1000 + worker)
    raw = (torch.rand(size, FIELDS, generator=gen) ** 3 * 5000).long()
    ids = (raw * 2654435761 + torch.arange(FIELDS) * 97) % rows  # field-aware hashing
    numeric = torch.randn(size, NUMERIC, generator=gen)
    hidden = torch.sin(ids.float() * 0.37).sum(1) * 0.4 + numeric[:, 0]
    return ids, numeric, torch.bernoulli(torch.sigmoid(hidden), generator=gen)


def train(args: argparse.Namespace) -> None:
    accelerator = Accelerator(project_config=ProjectConfiguration(
        project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=2))
    kwargs = {"mode": args.mode, "k_steps": args.k_steps}
    table = ps.ShardedEmbedding(args.rows, args.dim, ps.Adagrad(lr=0.05), name="deep",
                                **kwargs)
    wide = ps.ShardedEmbeddingBag(args.rows, 1, mode="sum", sparse_optimizer=ps.Adagrad(lr=0.05),
                                  name="wide", init_scale=0.0, ps_mode=args.mode,
                                  k_steps=args.k_steps)
    model = WideAndDeep(table, wide, args.dim)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    ps.checkpoint_with(accelerator)  # save_state/load_state include the servers' shards
    resumed = accelerator.load_state(missing_ok=True)  # the newest checkpoint, if any
    accelerator.print((f"resumed from {resumed}; " if resumed else "fresh start; ") +
                      f"{ps.server_num()} server(s), {ps.worker_num()} worker(s), "
                      f"mode {args.mode}, {args.rows} rows")
    loss_fn = nn.BCEWithLogitsLoss()
    for step in range(args.steps):
        ids, numeric, clicks = synthetic_batch(step, accelerator.process_index,
                                               args.batch_size, args.rows)
        loss = loss_fn(model(ids, numeric), clicks)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step % 50 == 0 or step == args.steps - 1:
            accelerator.print(f"step {step} train loss {loss.item():.4f}")
    ids, numeric, clicks = synthetic_batch(10**6, 0, 4096, args.rows)
    with torch.no_grad():
        eval_loss = loss_fn(accelerator.unwrap_model(model)(ids, numeric), clicks)
    accelerator.print(f"eval loss {eval_loss.item():.4f}")
    accelerator.save_state()


def main() -> None:
    args = parse_args()
    if ps.is_server():
        ps.run_server()  # holds table shards until every worker has called stop_worker()
        return
    train(args)
    ps.stop_worker()


if __name__ == "__main__":
    main()
