"""LocalSGD, DDP communication hooks and synchronize_rng_states with 2 real processes (issue 15).

One spawn checks all of it (process start is slow on 2 cores).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests.spawn import run_workers

K = 3  # local_sgd_steps


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _local_sgd(rank: int) -> dict[str, Any]:
    from accel import Accelerator
    from accel.local_sgd import LocalSGD

    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(10 + rank))  # ranks differ
    out: dict[str, Any] = {"differ": [], "averaged": [], "grads_local": None}
    with LocalSGD(acc, model, local_sgd_steps=K) as local_sgd:
        for step in range(1, 2 * K + 2):  # 7 steps: averaged after 3 and 6, and on exit
            model(x).pow(2).mean().backward()
            if step == 1:  # DDP did not all-reduce: each rank keeps its own gradient
                grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
                both = acc.gather(grads[None])
                out["grads_local"] = bool((both[0] != both[1]).any())
            opt.step()
            opt.zero_grad()
            before = _flat(model)
            local_sgd.step()
            after = _flat(model)
            both_before, both_after = acc.gather(before[None]), acc.gather(after[None])
            if step % K:
                out["differ"].append(bool((both_after[0] != both_after[1]).any()))
                out["unchanged_between"] = torch.equal(before, after)
            else:
                out["averaged"].append(torch.equal(both_after[0], both_after[1])
                                       and torch.allclose(after, both_before.mean(0)))
        last = acc.gather(_flat(model)[None])
    out["exit_averaged"] = torch.equal(*acc.gather(_flat(model)[None]).unbind(0))
    out["exit_was_needed"] = bool((last[0] != last[1]).any())
    return out


def _grads(acc: Any, model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(DDP's all-reduced gradient, the fp32 mean of every rank's local gradient)."""
    reference = nn.Linear(16, 8)
    reference.load_state_dict(acc.unwrap_model(model).state_dict())
    reference(x).pow(2).mean().backward()
    local = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
    model(x).pow(2).mean().backward()
    synced = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return synced, acc.gather(local[None]).mean(0)


def _hooks(rank: int) -> dict[str, Any]:
    from accel import Accelerator, DDPCommunicationHookType, DistributedDataParallelKwargs

    out: dict[str, Any] = {}
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(20 + rank))
    fp16 = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16)
    acc = Accelerator(cpu=True, kwargs_handlers=[fp16])
    torch.manual_seed(0)
    model = acc.prepare(nn.Linear(16, 8))
    out["fp16_hook"] = [hook.__name__ for hook, _ in model._comm_hooks]
    synced, mean = _grads(acc, model, x)
    out["fp16_close"] = torch.allclose(synced, mean, rtol=2e-3, atol=1e-4)
    out["fp16_err"] = float((synced - mean).abs().max())

    power = DistributedDataParallelKwargs(
        comm_hook=DDPCommunicationHookType.POWER_SGD, comm_wrapper=DDPCommunicationHookType.FP16,
        comm_state_option={"matrix_approximation_rank": 2, "start_powerSGD_iter": 2,
                           "min_compression_rate": 0})
    acc2 = Accelerator(cpu=True, kwargs_handlers=[power])
    torch.manual_seed(0)
    model2 = nn.Linear(16, 8)
    opt = torch.optim.SGD(model2.parameters(), lr=0.05)
    model2, opt = acc2.prepare(model2, opt)
    ((hook, state),) = model2._comm_hooks
    out["power_state"] = (type(state).__name__, state.matrix_approximation_rank,
                          state.start_powerSGD_iter)
    losses = []
    for _ in range(6):  # past start_powerSGD_iter: compressed all-reduces
        loss = model2(x).pow(2).mean()
        acc2.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(acc2.reduce(loss.detach(), "mean")))
    out["power_losses"] = losses
    out["power_iter"] = state.iter
    out["power_replicas_equal"] = torch.equal(*acc2.gather(_flat(model2)[None]).unbind(0))
    return out


def _rng(rank: int) -> dict[str, Any]:
    from accel.utils import synchronize_rng_states

    torch.manual_seed(100 + rank)
    gen = torch.Generator().manual_seed(200 + rank)
    synchronize_rng_states(["torch", "generator"], generator=gen)
    return {"torch": torch.rand(3).tolist(), "gen": torch.rand(3, generator=gen).tolist()}


def _worker(rank: int) -> dict[str, Any]:
    out = _local_sgd(rank)
    out["rng"] = _rng(rank)  # on the default group the Accelerator started
    out.update(_hooks(rank))
    from accel.utils import wait_for_everyone

    wait_for_everyone()
    return out


def test_local_sgd_comm_hooks_and_rng_sync_with_two_processes() -> None:
    r0, r1 = run_workers(_worker, 2, timeout=240)
    for r in (r0, r1):
        # LocalSGD: local gradients, replicas drift between averagings and agree at them
        assert r["grads_local"] is True
        assert r["differ"] == [True] * 5 and r["unchanged_between"] is True
        assert r["averaged"] == [True, True]
        assert r["exit_was_needed"] and r["exit_averaged"]
        # FP16 hook: the mean gradient, within fp16 rounding
        assert r["fp16_hook"] == ["fp16_compress_hook"]
        assert r["fp16_close"], r["fp16_err"]
        # PowerSGD (wrapped in FP16): state from comm_state_option, and it trains
        assert r["power_state"] == ("PowerSGDState", 2, 2)
        assert r["power_iter"] >= 6 and r["power_replicas_equal"]
        assert r["power_losses"][-1] < r["power_losses"][0]
    assert r0["power_losses"] == r1["power_losses"]
    # synchronize_rng_states: rank 0's streams everywhere (the seeds differed)
    assert r0["rng"] == r1["rng"]
