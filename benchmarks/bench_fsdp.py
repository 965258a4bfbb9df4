"""FSDP2: accel's training step against the same loop written with ``fully_shard`` by hand, and
the per-rank memory of parameters, gradients and optimizer state at 1, 2 and 4 processes.

Step time. Two processes on CPU over gloo train a small transformer-like model (embedding,
blocks of attention-free MLPs with a residual and a LayerNorm, a head), at two sizes, with
AdamW and cross-entropy. Plain PyTorch: ``fully_shard`` on every block and then on the root,
on a 1-D ``init_device_mesh("cpu", (2,))``, a ``DistributedSampler``; accel:
``Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(auto_wrap_policy=
"transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]))``, ``prepare``, then
``accumulate`` (optional, as many scripts do), ``backward``, ``step``. Same units, same mesh
shape, same model and data. The variants run in blocks of steps interleaved in the same
processes (rotating which goes first); "torch again" is the hand-written loop timed a second
time, the A/A control whose ratio to the first is the noise floor of the run.

Memory. After one step, each rank counts the bytes of the storage behind its parameters,
gradients and AdamW state (for FSDP the local shards, ``DTensor.to_local()``, padding included;
a storage shared by several tensors counts once). 1 process is the plain model without FSDP;
2 and 4 processes shard it with accel. The bound is the issue's target: the unsharded total / N
plus the largest unit (its parameters, gradients and two AdamW moments).

Run:  python benchmarks/bench_fsdp.py [--repeats 20] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

__all__ = ["main"]

TARGET = 1.03  # accel / torch, step time
AA = "torch again"
MEMORY_WORLDS = (1, 2, 4)


@dataclass(frozen=True)
class Case:
    name: str
    vocab: int
    dim: int
    blocks: int
    seq: int
    batch: int  # sequences per rank and step
    steps: int  # steps per timed block
    accumulate: bool = False


CASES: tuple[Case, ...] = (Case("small", 256, 64, 2, 32, 8, 10),
                           Case("small + accumulate()", 256, 64, 2, 32, 8, 10, True),
                           Case("medium", 2048, 256, 4, 64, 8, 2, True))
#: small enough for 4 processes on a 2-core machine
#: 1001 tokens: the embedding and head do not split evenly, so FSDP pads their shards
MEMORY_CASE = Case("memory", 1001, 64, 4, 16, 4, 1)


@functools.cache
def _classes() -> tuple[type, type]:
    """The model's classes (defined on first use: torch is imported lazily)."""
    from torch import nn

    class Block(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.up = nn.Linear(dim, 4 * dim)
            self.down = nn.Linear(4 * dim, dim)
            self.norm = nn.LayerNorm(dim)

        def forward(self, x: Any) -> Any:
            return self.norm(x + self.down(nn.functional.gelu(self.up(x))))

    class TinyLM(nn.Module):
        def __init__(self, case: Case) -> None:
            super().__init__()
            self.embed = nn.Embedding(case.vocab, case.dim)
            self.blocks = nn.Sequential(*(Block(case.dim) for _ in range(case.blocks)))
            self.norm = nn.LayerNorm(case.dim)
            self.head = nn.Linear(case.dim, case.vocab, bias=False)

        def forward(self, tokens: Any) -> Any:
            return self.head(self.norm(self.blocks(self.embed(tokens))))

    return Block, TinyLM


def _model(case: Case) -> Any:
    import torch

    torch.manual_seed(0)
    return _classes()[1](case)


def _units(model: Any) -> list[int]:
    """Parameter counts of the units: each block, and the root holding the rest."""
    block = _classes()[0]
    blocks = [sum(p.numel() for p in m.parameters()) for m in model.modules()
              if type(m).__name__ == block.__name__]
    return blocks + [sum(p.numel() for p in model.parameters()) - sum(blocks)]


def _dataset(case: Case, world: int) -> Any:
    import torch

    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, case.vocab, (case.batch * world * 64, case.seq), generator=generator)
    return torch.utils.data.TensorDataset(tokens, torch.roll(tokens, 1, dims=1))


def _loss(model: Any, tokens: Any, targets: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())


def _torch_variant(case: Case, mesh: Any, rank: int, world: int) -> Callable[[], None]:
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.utils.data import DataLoader, DistributedSampler

    model = _model(case)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dataset = _dataset(case, world)
    sampler: DistributedSampler[Any] = DistributedSampler(dataset, num_replicas=world,
                                                          rank=rank, shuffle=True, seed=0)
    loop = _common.Loop(DataLoader(dataset, batch_size=case.batch, sampler=sampler),
                        sampler.set_epoch)

    def block() -> None:
        for _ in range(case.steps):
            tokens, targets = loop.batch()
            _loss(model, tokens, targets).backward()
            optimizer.step()
            optimizer.zero_grad()

    return block


def _accel_variant(accelerator: Any, case: Case, world: int) -> Callable[[], None]:
    import torch
    from torch.utils.data import DataLoader

    model = _model(case)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(_dataset(case, world), batch_size=case.batch, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loop = _common.Loop(loader)

    def step() -> None:
        tokens, targets = loop.batch()
        accelerator.backward(_loss(model, tokens, targets))
        optimizer.step()
        optimizer.zero_grad()

    def block() -> None:
        for _ in range(case.steps):
            if case.accumulate:
                with accelerator.accumulate(model):
                    step()
            else:
                step()

    return block


def _plugin() -> Any:
    from accel import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap",
                                          transformer_cls_names_to_wrap=["Block"])


def _step_worker(rank: int, cases: tuple[Case, ...], repeats: int, warmup: int
                 ) -> dict[str, dict[str, dict[str, list[float]]]]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    warnings.simplefilter("ignore")  # FSDP's notes on CPU/gloo are no figure
    torch.set_num_threads(1)
    from accel import Accelerator

    accelerator = Accelerator(cpu=True, fsdp_plugin=_plugin())  # starts the gloo group
    world = accelerator.num_processes
    mesh = init_device_mesh("cpu", (world,))
    out: dict[str, dict[str, dict[str, list[float]]]] = {"wall": {}, "cpu": {}}
    for case in cases:
        variants = {"torch": _torch_variant(case, mesh, rank, world),
                    AA: _torch_variant(case, mesh, rank, world),
                    "accel": _accel_variant(accelerator, case, world)}
        for clock, times in zip(("wall", "cpu"),
                                _common.interleave(variants, repeats=repeats, warmup=warmup),
                                strict=True):
            out[clock][case.name] = {name: [t / case.steps for t in values]
                                     for name, values in times.items()}
    return out


# -- memory -----------------------------------------------------------------------------------
def _storage_bytes(tensors: Any) -> int:
    """Bytes of the storages behind ``tensors`` (DTensors: their local shard), each once."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _memory_worker(rank: int, case: Case) -> dict[str, int]:
    import torch

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    model = _model(case)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    units = _units(model)
    tokens, targets = _dataset(case, 1).tensors
    tokens, targets = tokens[:case.batch], targets[:case.batch]
    backward: Callable[[Any], None] = lambda loss: loss.backward()  # noqa: E731
    if int(os.environ["WORLD_SIZE"]) > 1:
        from accel import Accelerator

        accelerator = Accelerator(cpu=True, fsdp_plugin=_plugin())
        model, optimizer = accelerator.prepare(model, optimizer)
        backward = accelerator.backward
    backward(_loss(model, tokens, targets))
    optimizer.step()  # creates the AdamW state; the gradients stay until zero_grad
    params = list(model.parameters())
    state = [t for s in optimizer.state.values() for t in s.values()
             if isinstance(t, torch.Tensor)]
    sizes = {"params": _storage_bytes(params),
             "grads": _storage_bytes(p.grad for p in params if p.grad is not None),
             "state": _storage_bytes(state)}
    sizes["total"] = sum(sizes.values())
    # the largest unit unsharded: its parameters, gradients and AdamW's two moments (fp32)
    sizes["largest_unit"] = max(units) * 4 * 4
    return sizes


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def _memory_table(case: Case) -> tuple[str, list[bool]]:
    """The table, and whether each row met the bound; records the sharded rows."""
    rows, met = [], []
    unsharded = 0.0
    for world in MEMORY_WORLDS:
        ranks = _common.run_workers(_memory_worker, world, (case,))
        worst = max(ranks, key=lambda r: r["total"])
        if world == 1:
            unsharded = float(worst["total"])
            bound = unsharded
        else:
            bound = unsharded / world + worst["largest_unit"]
        ok = worst["total"] <= bound
        met.append(ok)
        if world > 1:  # the ideal is unsharded / N; the bound allows the largest unit on top
            ideal = unsharded / world
            _common.record("bench_fsdp", f"memory per rank, {world} processes",
                           accel=float(worst["total"]), baseline=ideal,
                           baseline_name="unsharded / N", unit="bytes", target=bound / ideal,
                           note="target: + the largest unit")
        rows.append([str(world), _size(worst["params"]), _size(worst["grads"]),
                     _size(worst["state"]), _size(worst["total"]), _size(unsharded / world),
                     f"{worst['total'] / (unsharded / world):.3f}", _size(bound),
                     f"{worst['total'] / bound:.2f}", "met" if ok else "MISSED"])
    title = ("Per-rank memory after one AdamW step (the rank with the most; 1 process: no FSDP; "
             f"model of {case.vocab} tokens x {case.dim}, {case.blocks} blocks)")
    header = ["processes", "params", "grads", "AdamW state", "total", "unsharded / N",
              "total / (unsharded / N)", "bound", "total / bound", "target"]
    return _common.format_table(title, header, rows), met


def _table(title: str, results: dict[str, dict[str, list[float]]], columns: list[str]) -> str:
    rows = [[name] + [_common.median(times[c]) for c in columns]
            for name, times in results.items()]
    return _common.format_table(title, ["model"] + columns, rows, ratio_of=columns[1:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _common.add_common_args(parser, repeats=20)
    args = parser.parse_args(argv)  # --no-accelerate is accepted: there is no accelerate column
    cases, memory_case = CASES, MEMORY_CASE
    repeats, warmup = args.repeats, 3
    if args.quick:
        cases = tuple(replace(c, vocab=32, dim=8, seq=4, batch=2, steps=2) for c in CASES)
        memory_case = replace(MEMORY_CASE, vocab=33, dim=8, seq=4, batch=2)
        repeats, warmup = 2, 1
    results = _common.run_workers(_step_worker, 2, (cases, repeats, warmup))[0]
    columns = ["torch", AA, "accel"]
    what = f"2 processes (gloo), rank 0, median of {repeats} interleaved blocks"
    print(_table(f"Wall time per FSDP training step, {what}", results["wall"], columns))
    print()
    print(_table(f"CPU time per FSDP training step (all threads of rank 0), {what}",
                 results["cpu"], columns))
    print(_common.spread_lines("per step (wall)", results["wall"], columns))
    print(_common.machine_line())
    for case in cases:
        figures = []
        for clock in ("wall", "cpu"):
            times = results[clock][case.name]
            value = _common.ratio(_common.median(times["accel"]), _common.median(times["torch"]))
            control = _common.ratio(_common.median(times[AA]), _common.median(times["torch"]))
            figures.append(f"{clock} {value:.3f} ({'met' if value <= TARGET else 'MISSED'}; "
                           f"A/A {control:.3f})")
            _common.record("bench_fsdp", f"FSDP step, {case.name} ({clock})",
                           accel=times["accel"], baseline=times["torch"],
                           baseline_name="fully_shard by hand", target=TARGET,
                           note=f"torch against itself {control:.2f}")
        print(f"target: accel / torch <= {TARGET}, {case.name}: " + ", ".join(figures))
    print()
    table, met = _memory_table(memory_case)
    print(table)
    print(_common.machine_line())
    print("target: per-rank total <= unsharded total / N + the largest unit: "
          + ("met" if all(met) else "MISSED"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
