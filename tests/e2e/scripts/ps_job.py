"""e2e job for accel.ps, started by tests/e2e/test_ps.py with ``accel launch --server_num``.

``ps_job.py save DIR``: sync training equals a one-process reference (torch's own sparse
optimizers on the whole global batch), then a checkpoint (servers' shards included) in DIR and
the rows it holds in DIR.expected.safetensors.
``ps_job.py load DIR``: the same tables from that checkpoint (any server count: re-partition),
then the same checks on fresh tables, a save/train/load cycle, async and geo on a small
synthetic CTR task, and an out-of-range id.
``ps_job.py drill-worker|drill-server``: a worker (or a server) kills itself mid-training.
``ps_job.py lost-server``: the server kills itself mid-training and the worker reports the error
its next pull raises (started without ``accel launch``, so that no agent stops the worker first).
Each worker prints ``RESULT {json}`` lines for the test.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel import Accelerator, ps
from accel.checkpoint.storage import load, save

N, DIM, FIELDS, BATCH, STEPS = 300, 4, 3, 8, 4


def result(**fields: Any) -> None:
    os.write(1, ("RESULT " + json.dumps({"worker": ps.worker_index(), **fields}) + "\n")
             .encode())


class Net(nn.Module):
    """Three tables (one per optimizer) and a mean bag, then a linear head."""

    def __init__(self, tables: list[nn.Module]) -> None:
        super().__init__()
        self.tables = nn.ModuleList(tables)
        self.head = nn.Linear(DIM * (FIELDS * 3 + 1), 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        parts = [t(ids).flatten(1) for t in self.tables[:3]] + [self.tables[3](ids)]
        return self.head(torch.cat(parts, 1)).squeeze(1)


def ps_tables(prefix: str, partition: str) -> list[nn.Module]:
    return [ps.ShardedEmbedding(N, DIM, ps.SGD(lr=0.5), partition=partition, name=f"{prefix}sgd"),
            ps.ShardedEmbedding(N, DIM, ps.Adagrad(lr=0.1), partition="range",
                                name=f"{prefix}adagrad"),
            ps.ShardedEmbedding(N, DIM, ps.Adam(lr=0.05), partition=partition,
                                name=f"{prefix}adam"),
            ps.ShardedEmbeddingBag(N, DIM, mode="mean", sparse_optimizer=ps.Adagrad(lr=0.2),
                                   partition=partition, name=f"{prefix}bag")]


def reference_tables(tables: list[Any]) -> list[nn.Module]:
    """torch modules with the servers' initial rows (sparse gradients)."""
    out: list[nn.Module] = []
    for t in tables:
        cfg = t._config
        weight = ps.initial_weight(N, DIM, seed=cfg.seed, scale=cfg.init_scale)
        cls = nn.EmbeddingBag if isinstance(t, ps.ShardedEmbeddingBag) else nn.Embedding
        module = cls(N, DIM, sparse=True, **({"mode": "mean"} if cls is nn.EmbeddingBag else {}))
        module.weight.data.copy_(weight)
        out.append(module)
    return out


def lazy_adam(weight: torch.Tensor, state: dict[str, torch.Tensor], grad: torch.Tensor,
              lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> None:
    grad = grad.coalesce()
    rows, g = grad.indices()[0], grad.values()
    state["t"][rows] += 1
    state["m"][rows] = b1 * state["m"][rows] + (1 - b1) * g
    state["v"][rows] = b2 * state["v"][rows] + (1 - b2) * g * g
    t = state["t"][rows]
    m_hat, v_hat = state["m"][rows] / (1 - b1 ** t), state["v"][rows] / (1 - b2 ** t)
    weight[rows] -= lr * m_hat / (v_hat.sqrt() + eps)


def batch(step: int, workers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step (every worker makes the same one)."""
    gen = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, N, (BATCH * workers, FIELDS), generator=gen)
    return ids, torch.randint(0, 2, (BATCH * workers,), generator=gen).float()


def sync_equals_reference(acc: Accelerator, prefix: str, partition: str
                          ) -> tuple[nn.Module, torch.optim.Optimizer, float]:
    """Train STEPS sync steps; the largest difference to the one-process run."""
    torch.manual_seed(0)
    net = Net(ps_tables(prefix, partition))
    ref = Net(reference_tables(list(net.tables)))
    ref.head.load_state_dict(copy.deepcopy(net.head.state_dict()))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    model, opt = acc.prepare(net, opt)
    ref_dense = torch.optim.SGD(ref.head.parameters(), lr=0.1)
    ref_sgd = torch.optim.SGD([ref.tables[0].weight], lr=0.5)
    ref_ada = torch.optim.Adagrad([ref.tables[1].weight], lr=0.1, eps=1e-10)
    ref_bag = torch.optim.Adagrad([ref.tables[3].weight], lr=0.2, eps=1e-10)
    adam = {k: torch.zeros(N, DIM) for k in ("m", "v", "t")}
    w, rank = acc.num_processes, acc.process_index
    loss_fn = nn.BCEWithLogitsLoss()
    for step in range(STEPS):
        ids, labels = batch(step, w)
        mine = slice(rank * BATCH, (rank + 1) * BATCH)
        loss = loss_fn(model(ids[mine]), labels[mine])
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        ref_loss = loss_fn(ref(ids), labels)
        ref_loss.backward()
        for o in (ref_dense, ref_sgd, ref_ada, ref_bag):
            o.step()
            o.zero_grad()
        with torch.no_grad():
            lazy_adam(ref.tables[2].weight, adam, ref.tables[2].weight.grad, lr=0.05)
        ref.tables[2].weight.grad = None
    every = torch.arange(N)
    torch.set_grad_enabled(False)
    diffs = [float((t.pull(every) - r.weight).abs().max()) for t, r in
             zip(net.tables, ref.tables, strict=True)]
    head = acc.unwrap_model(model).head
    pairs = zip(head.parameters(), ref.head.parameters(), strict=True)
    diffs.append(float(max((a - b).abs().max() for a, b in pairs)))
    moved = float((net.tables[2].pull(every) - ref_tables_initial(net.tables[2])).abs().max())
    torch.set_grad_enabled(True)
    return model, opt, max(diffs) if moved > 0 else float("nan")


def ref_tables_initial(table: Any) -> torch.Tensor:
    return ps.initial_weight(N, DIM, seed=table._config.seed, scale=table._config.init_scale)


def all_rows(model: nn.Module, acc: Accelerator) -> dict[str, torch.Tensor]:
    tables = acc.unwrap_model(model).tables
    return {t.name: t.pull(torch.arange(N)) for t in tables}


class CTR(nn.Module):
    def __init__(self, table: nn.Module, width: int) -> None:
        super().__init__()
        self.emb, self.head = table, nn.Linear(width, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids).flatten(1)).squeeze(1)


def train_ctr(acc: Accelerator, mode: str, steps: int = 150) -> tuple[float, float]:
    """A small synthetic CTR task: the label's log-odds is a sum of hidden per-id weights;
    returns the loss on held-out data before and after training."""
    vocab, fields, b = 500, 4, 32
    truth = torch.randn(vocab, generator=torch.Generator().manual_seed(7)) * 1.5
    kwargs: dict[str, Any] = {"k_steps": 4} if mode == "geo" else {}
    table = ps.ShardedEmbedding(vocab, 4, ps.Adagrad(lr=0.2), mode=mode, name=f"ctr_{mode}",
                                **kwargs)
    torch.manual_seed(1)
    net = CTR(table, 4 * fields)
    model, opt = acc.prepare(net, torch.optim.Adam(net.head.parameters(), lr=0.02))
    loss_fn = nn.BCEWithLogitsLoss()

    def data(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab, (n, fields), generator=gen)
        return ids, torch.bernoulli(torch.sigmoid(truth[ids].sum(1)), generator=gen)

    held_out = data(99, 2048)
    with torch.no_grad():
        initial = float(loss_fn(acc.unwrap_model(model)(held_out[0]), held_out[1]))
    for step in range(steps):
        ids, labels = data(10_000 * acc.process_index + step, b)
        acc.backward(loss_fn(model(ids), labels))
        opt.step()
        opt.zero_grad()
    table.flush()
    if mode == "geo":
        table.push_deltas()
    acc.wait_for_everyone()  # every worker's updates are in before the evaluation
    with torch.no_grad():
        return initial, float(loss_fn(acc.unwrap_model(model)(held_out[0]), held_out[1]))


def phase_save(acc: Accelerator, directory: str) -> None:
    model, opt, diff = sync_equals_reference(acc, "A_", "hash")
    ps.checkpoint_with(acc)
    acc.save_state(directory)
    if acc.is_main_process:
        save(all_rows(model, acc), directory + ".expected.safetensors")
    else:
        all_rows(model, acc)
    result(phase="save", diff=diff, processes=acc.num_processes, servers=ps.server_num())


def phase_load(acc: Accelerator, directory: str) -> dict[str, Any]:
    torch.manual_seed(0)
    net = Net(ps_tables("A_", "hash"))
    model, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    ps.checkpoint_with(acc)
    acc.load_state(directory)
    expected = load(directory + ".expected.safetensors")
    got = all_rows(model, acc)
    repartitioned = all(torch.equal(got[k], v) for k, v in expected.items())
    # a sync run on 1 server + 2 workers, then save / train on / load
    model2, opt2, diff = sync_equals_reference(acc, "B_", "range")
    acc.save_state(directory + "_b")
    before, head = all_rows(model2, acc), copy.deepcopy(acc.unwrap_model(model2).head)
    ids, labels = batch(50, acc.num_processes)
    for _ in range(2):
        acc.backward(nn.BCEWithLogitsLoss()(model2(ids[:BATCH]), labels[:BATCH]))
        opt2.step()
        opt2.zero_grad()
    changed = any(not torch.equal(v, all_rows(model2, acc)[k]) for k, v in before.items())
    acc.load_state(directory + "_b")
    after = all_rows(model2, acc)
    restored = all(torch.equal(after[k], v) for k, v in before.items()) and torch.equal(
        acc.unwrap_model(model2).head.weight, head.weight)
    manifest = json.loads((Path(directory + "_b") / "manifest.json").read_text())
    files = manifest.get("files", manifest)
    shard_files = sorted(k for k in files if str(k).startswith("ps/"))
    return {"repartitioned": repartitioned, "diff": diff, "changed": changed,
            "restored": restored, "shard_files": shard_files}


def phase_modes(acc: Accelerator) -> dict[str, Any]:
    runs = {mode: train_ctr(acc, mode) for mode in ("sync", "async", "geo")}
    losses = {mode: after for mode, (_, after) in runs.items()}
    losses["initial"] = runs["sync"][0]
    table = ps.ShardedEmbedding(10, 2, name="small")
    try:
        table(torch.tensor([[1, 10]]))
        error = ""
    except IndexError as exc:
        error = str(exc)
    return {"losses": losses, "error": error}


def _die_once_trained() -> None:
    """On the server: SIGKILL once the workers' training is under way (5 rows pushed)."""
    from accel.ps import _remote

    while True:
        state = _remote._Served.state
        shard = state.shards.get("drill") if state is not None else None
        if shard is not None and shard.pushed_rows >= 5:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.05)


def drill(kind: str) -> None:
    """A process kills itself with SIGKILL in the middle of training."""
    if ps.is_server():
        if kind == "drill-server":
            threading.Thread(target=_die_once_trained, daemon=True).start()
        ps.run_server()
        return
    acc = Accelerator(cpu=True)
    table = ps.ShardedEmbedding(N, DIM, name="drill")
    start = time.monotonic()
    step = 0
    while time.monotonic() - start < 60:
        if kind == "drill-worker" and ps.worker_index() == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        table(torch.tensor([step % N])).sum().backward()
        acc.wait_for_everyone()
        step += 1
        time.sleep(0.05)
    result(phase=kind, survived=True)


def lost_server() -> None:
    """The server dies mid-training; the worker's next pull must raise a ConnectionError that
    names the server (the message a user reads when no agent stopped the worker first)."""
    if ps.is_server():
        threading.Thread(target=_die_once_trained, daemon=True).start()
        ps.run_server()
        return
    table = ps.ShardedEmbedding(N, DIM, name="drill")
    start, step = time.monotonic(), 0
    try:
        while time.monotonic() - start < 60:
            table(torch.tensor([step % N])).sum().backward()
            step += 1
            time.sleep(0.02)
        result(phase="lost-server", error="", steps=step)
    except ConnectionError as exc:
        result(phase="lost-server", error=str(exc), steps=step)
    sys.stdout.flush()
    os._exit(0)  # the servers are gone: stop_worker() at exit could only fail again


def main() -> None:
    phase = sys.argv[1]
    if phase == "lost-server":
        lost_server()
        return
    if phase.startswith("drill"):
        drill(phase)
        return
    if ps.is_server():
        ps.run_server()
        return
    acc = Accelerator(cpu=True)
    if phase == "save":
        phase_save(acc, sys.argv[2])
        if ps.worker_index() == 1:
            return  # forgets stop_worker(): stopped at exit, with a warning, and the job ends
    else:
        report = phase_load(acc, sys.argv[2])
        report.update(phase_modes(acc))
        result(phase="load", processes=acc.num_processes, servers=ps.server_num(), **report)
    ps.stop_worker()


if __name__ == "__main__":
    main()
