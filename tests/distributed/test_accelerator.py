"""The Accelerator with real processes: equivalence with one process, accumulation, metrics,
precision, coordination helpers. One spawn checks many things (process start is slow)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.spawn import run_workers

N_SAMPLES = 40
BATCH = 2


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_SAMPLES, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    return TensorDataset(x, y)


def _model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Linear(4, 1)


def _train(accelerator: Any, steps_per_group: int) -> list[float]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dl = DataLoader(_data(), batch_size=BATCH, shuffle=False)
    model, opt, dl = accelerator.prepare(model, opt, dl)
    for x, y in dl:
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
    return [float(v) for v in torch.cat([p.detach().reshape(-1) for p in
                                          accelerator.unwrap_model(model).parameters()])]


def _reference(global_batch: int) -> list[float]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in DataLoader(_data(), batch_size=global_batch, shuffle=False):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return [float(v) for v in torch.cat([p.detach().reshape(-1) for p in model.parameters()])]


def _worker(rank: int) -> dict[str, Any]:
    from accel import Accelerator, GradientAccumulationPlugin

    out: dict[str, Any] = {}
    acc = Accelerator(cpu=True, timeout=8)
    out["props"] = (acc.process_index, acc.num_processes, acc.is_main_process,
                    acc.is_last_process, acc.distributed_type.value, acc.use_distributed,
                    str(acc.device), acc.mixed_precision)
    out["plain"] = _train(acc, 1)
    # accumulation over 3 micro-batches; 10 batches per rank is not a multiple of 3
    acc3 = Accelerator(cpu=True, gradient_accumulation_steps=3)
    out["accum"] = _train(acc3, 3)
    out["independent"] = (acc.gradient_accumulation_steps, acc3.gradient_accumulation_steps)
    # no_sync-free accumulation plugin object works the same
    acc_p = Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(
        num_steps=3))
    out["accum_plugin"] = _train(acc_p, 3)

    # gather_for_metrics on a (pred, label) tuple, uneven dataset (7 samples, batch 2)
    ds = TensorDataset(torch.arange(7).float(), torch.arange(7))
    dl = acc.prepare(DataLoader(ds, batch_size=2))
    preds, labels = [], []
    for x, y in dl:
        p, lab = acc.gather_for_metrics((x * 10, y))
        preds.append(p)
        labels.append(lab)
    out["metrics"] = (torch.cat(preds).tolist(), torch.cat(labels).tolist())
    out["metrics_obj"] = []
    for x, _ in dl:
        out["metrics_obj"] += acc.gather_for_metrics([f"s{int(v)}" for v in x])

    # even_batches=False: the last round has a batch on rank 0 only; no hang, exact on rank 0
    from accel import DataLoaderConfiguration
    acc_u = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=False))
    dl_u = acc_u.prepare(DataLoader(list(range(5)), batch_size=2))
    out["uneven_obj"], out["uneven_t"] = [], []
    for batch in dl_u:
        out["uneven_obj"] += acc_u.gather_for_metrics([f"u{int(v)}" for v in batch])
        out["uneven_t"] += acc_u.gather_for_metrics(batch).tolist()

    # coordination: main_process_first must not trip the (short) collective timeout
    with acc.main_process_first():
        if acc.is_main_process:
            time.sleep(12)
        out["first_done_at"] = time.time()
    acc.wait_for_everyone()
    with acc.split_between_processes(list(range(5)), apply_padding=True) as part:
        out["split"] = part
    if rank == 1:
        acc.set_trigger()
    out["trigger"] = acc.check_trigger()
    out["trigger_reset"] = acc.check_trigger()
    out["on_main"] = acc.on_main_process(lambda: "ran")()
    out["reduce"] = acc.reduce(torch.tensor([float(rank + 1)]), "mean").tolist()
    out["gather"] = acc.gather(torch.tensor(float(rank))).tolist()
    acc.end_training()
    return out


@pytest.mark.slow
def test_accelerator_two_processes() -> None:
    results = run_workers(_worker, 2, timeout=180)
    ref = _reference(2 * BATCH)
    ref_accum = _reference(2 * BATCH * 3)
    for rank, r in enumerate(results):
        assert r["props"] == (rank, 2, rank == 0, rank == 1, "MULTI_CPU", True, "cpu", "no")
        assert r["plain"] == pytest.approx(ref, abs=1e-5)
        assert r["accum"] == pytest.approx(ref_accum, abs=1e-6)
        assert r["accum_plugin"] == pytest.approx(ref_accum, abs=1e-6)
        assert r["independent"] == (1, 3)
        assert r["metrics"] == ([10.0 * i for i in range(7)], list(range(7)))
        assert r["metrics_obj"] == [f"s{i}" for i in range(7)]
        # rank 1 has no batch in the last round, so it sees the first 4 samples only
        n_seen = 5 if rank == 0 else 4
        assert r["uneven_obj"] == [f"u{i}" for i in range(n_seen)]
        assert r["uneven_t"] == list(range(n_seen))
        assert r["split"] == ([0, 1, 2] if rank == 0 else [3, 4, 4])
        assert r["trigger"] is True and r["trigger_reset"] is False
        assert r["on_main"] == ("ran" if rank == 0 else None)
        assert r["reduce"] == [1.5]
        assert r["gather"] == [0.0, 1.0]
    # the non-main rank ran its block only after the main rank finished its 12 s block
    assert results[1]["first_done_at"] >= results[0]["first_done_at"] - 1.0


# -- trigger_sync_in_backward: forwards under no_sync, the backward that syncs outside it ---------
SYNC_STEPS = 3


def _rank_batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank ``rank``'s micro-batches (different on every rank, so unsynced grads differ)."""
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(3, 4, generator=g), torch.randn(3, 1, generator=g))
            for _ in range(SYNC_STEPS)]


def _mean_grads(world: int, steps: int) -> list[torch.Tensor]:
    """One process: the gradient DDP should hold after ``steps`` micro-batches of every rank,
    the mean over ranks of each rank's summed micro-batch gradients."""
    model = _model()
    for rank in range(world):
        for x, y in _rank_batches(rank)[:steps]:
            (nn.functional.mse_loss(model(x), y) / world).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b, strict=True))


def _trigger_sync_worker(rank: int) -> dict[str, Any]:
    from accel import Accelerator

    acc = Accelerator(cpu=True)
    world = acc.num_processes
    batches = _rank_batches(rank)
    model = acc.prepare(_model())
    loss = nn.functional.mse_loss
    out: dict[str, Any] = {"wrapped": type(model).__name__}
    # Accelerate's documented pattern: every forward under no_sync, backward of the last one
    # inside trigger_sync_in_backward: its backward all-reduces all the accumulated gradients.
    with acc.no_sync(model):
        losses = [loss(model(x), y) for x, y in batches]
    for k, value in enumerate(losses):
        if k < SYNC_STEPS - 1:
            acc.backward(value)
            out.setdefault("local", []).append(_same(_grads(model), _mean_grads(world, k + 1)))
        else:
            with acc.trigger_sync_in_backward(model):
                acc.backward(value)
    out["synced"] = _same(_grads(model), _mean_grads(world, SYNC_STEPS))
    # both flags are restored: DDP's own values after forwards under no_sync
    out["flags_after"] = (model.require_backward_grad_sync, model.require_forward_param_sync)
    # Nested in no_sync: forward+backward locally, then the last forward under no_sync and its
    # backward in trigger_sync_in_backward; the no_sync flag comes back inside no_sync.
    model.zero_grad(set_to_none=True)
    with acc.no_sync(model):
        for x, y in batches[:-1]:
            acc.backward(loss(model(x), y))
        last = loss(model(batches[-1][0]), batches[-1][1])
        with acc.trigger_sync_in_backward(model):
            acc.backward(last)
        out["flags_inside"] = (model.require_backward_grad_sync, model.require_forward_param_sync)
    out["nested"] = _same(_grads(model), _mean_grads(world, SYNC_STEPS))
    # DDP keeps working as usual afterwards: a plain step is synced.
    model.zero_grad(set_to_none=True)
    acc.backward(loss(model(batches[0][0]), batches[0][1]))
    out["plain_after"] = _same(_grads(model), _mean_grads(world, 1))
    acc.end_training()
    return out


def test_trigger_sync_in_backward_after_forwards_under_no_sync() -> None:
    results = run_workers(_trigger_sync_worker, 2, timeout=120)
    for rank, r in enumerate(results):
        assert r["wrapped"] == "DistributedDataParallel", rank
        assert r["local"] == [False] * (SYNC_STEPS - 1), rank  # no sync before the trigger
        assert r["synced"] and r["nested"] and r["plain_after"], (rank, r)
        assert r["flags_after"] == (True, False), rank
        assert r["flags_inside"] == (False, False), rank
