"""An evaluation loop with ``gather_for_metrics`` per batch against the same loop in plain PyTorch.

Two processes on CPU over gloo evaluate the same model on the same dataset, whose length is not
a multiple of world x batch size, written three ways, each a whole epoch:

- torch: ``DistributedSampler(shuffle=False)`` + ``DataLoader``, ``model.eval()``,
  ``torch.no_grad()``, forward, one ``dist.all_gather`` (into ``empty_like`` buffers) per
  tensor per batch, ``torch.cat``, and at the end the concatenation cut to ``len(dataset)``
  (the padding ``DistributedSampler`` adds). The model is wrapped in
  ``DistributedDataParallel``, as a training script's model is.
- accel: ``accelerator.prepare(model, loader)`` (model and loader both prepared: the model is
  the same ``DistributedDataParallel``) and ``accelerator.gather_for_metrics(outputs)``, which
  drops the padded samples of the last batch itself.
- accelerate (Hugging Face, when installed; ``--no-accelerate`` leaves it out): the same loop.

Cases: a small MLP classifier (per-batch cost is mostly overhead) and a larger one; outputs as
the common ``(preds, labels)`` tuple of same-shape tensors, as a dict
``{"logits": (B, classes) float, "labels": (B,) int}``, and (small MLP) ``preds`` alone, where
the plain loop also needs only one collective per batch, so accel's own overhead shows most.
Whole epochs of the contenders are alternated (rotating which goes first) ``--repeats`` times in
the same processes; the tables show min/median/max per batch on rank 0 (wall and CPU time) and
the ratio of medians to torch.
"torch again" is the plain loop a second time: its ratio to the first is the noise floor.

Exactness: the final gathered results of every contender are compared with one process
evaluating the whole dataset in order: accel (and accelerate) must be equal to it, element for
element; the plain loop's results are equal to it only after reordering (its batches
interleave the ranks' strided samples), and with 2 processes its truncation happens to drop
exactly its one padded sample.

Records (``_common.record``, benchmark ``bench_eval``): one figure per case and clock ("<case>
(wall)", "<case> (cpu)"), seconds per batch, accel against torch (and accelerate), target 1.05.
The exit status is 1 when accel's results are not exact. ``profile_eval.py`` shows where the
time of these loops goes.

Run:  python benchmarks/bench_eval.py [--repeats 9] [--quick] [--no-accelerate]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

__all__ = ["main"]

TARGET = 1.05  # accel / torch per batch, every case
#: the plain loop measured a second time: its ratio to the first shows the noise
AA = "torch again"


@dataclass(frozen=True)
class Case:
    name: str
    width: int  # input features and hidden width
    depth: int  # hidden layers
    classes: int
    batch: int  # per rank
    batches: int  # per rank and epoch (the last one is short)
    output: str  # "tuple" (preds, labels), "tensor" (preds) or "dict" {"logits", "labels"}


CASES: tuple[Case, ...] = (Case("small MLP, (preds, labels)", 16, 1, 10, 32, 60, "tuple"),
                           Case("small MLP, preds alone", 16, 1, 10, 32, 60, "tensor"),
                           Case("small MLP, dict(logits, labels)", 16, 1, 10, 32, 60, "dict"),
                           Case("large MLP, (preds, labels)", 512, 4, 100, 64, 12, "tuple"),
                           Case("large MLP, dict(logits, labels)", 512, 4, 100, 64, 12,
                                "dict"))


def _length(case: Case, world: int) -> int:
    return case.batch * world * case.batches - 3  # not a multiple of world x batch


def _model(case: Case) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(case.depth):
        layers += [nn.Linear(case.width, case.width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(case.width, case.classes))


def _dataset(case: Case, world: int) -> Any:
    import torch

    generator = torch.Generator().manual_seed(1)
    n = _length(case, world)
    x = torch.randn(n, case.width, generator=generator)
    return torch.utils.data.TensorDataset(x, torch.randint(0, case.classes, (n,),
                                                           generator=generator))


def _outputs(case: Case, logits: Any, labels: Any) -> Any:
    if case.output == "tuple":
        return logits.argmax(dim=-1), labels
    if case.output == "tensor":
        return logits.argmax(dim=-1)
    return {"logits": logits, "labels": labels}


def _collect(case: Case, parts: list[Any]) -> dict[str, Any]:
    """The epoch's gathered per-batch outputs, concatenated (as a dict of tensors)."""
    import torch

    if case.output == "tensor":
        return {"preds": torch.cat(parts)}
    names = ("preds", "labels") if case.output == "tuple" else ("logits", "labels")
    if case.output == "tuple":
        return {name: torch.cat([p[i] for p in parts]) for i, name in enumerate(names)}
    return {name: torch.cat([p[name] for p in parts]) for name in names}


def _torch_variant(case: Case, rank: int, world: int) -> Callable[[], dict[str, Any]]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    model = DistributedDataParallel(_model(case))
    dataset = _dataset(case, world)
    sampler: DistributedSampler[Any] = DistributedSampler(dataset, num_replicas=world,
                                                          rank=rank, shuffle=False)
    loader = DataLoader(dataset, batch_size=case.batch, sampler=sampler)

    def gather(tensor: Any) -> Any:
        parts = [torch.empty_like(tensor) for _ in range(world)]
        dist.all_gather(parts, tensor)
        return torch.cat(parts)

    def epoch() -> dict[str, Any]:
        model.eval()
        parts = []
        with torch.no_grad():
            for x, y in loader:
                out = _outputs(case, model(x), y)
                if isinstance(out, torch.Tensor):
                    parts.append(gather(out))
                elif isinstance(out, tuple):
                    parts.append(tuple(gather(t) for t in out))
                else:
                    parts.append({k: gather(v) for k, v in out.items()})
        return {k: v[:len(dataset)] for k, v in _collect(case, parts).items()}

    return epoch


def _framework_variant(accelerator: Any, case: Case, world: int) -> Callable[[], dict[str, Any]]:
    """The same loop through accel's or accelerate's Accelerator (identical public API)."""
    import torch
    from torch.utils.data import DataLoader

    model, loader = accelerator.prepare(_model(case),
                                        DataLoader(_dataset(case, world), batch_size=case.batch))

    def epoch() -> dict[str, Any]:
        model.eval()
        parts = []
        with torch.no_grad():
            for x, y in loader:
                parts.append(accelerator.gather_for_metrics(_outputs(case, model(x), y)))
        return _collect(case, parts)

    return epoch


def _reference(case: Case, world: int) -> dict[str, Any]:
    """One process, the whole dataset in order (what every exact contender must give)."""
    import torch
    from torch.utils.data import DataLoader

    model = _model(case).eval()
    parts = []
    with torch.no_grad():
        for x, y in DataLoader(_dataset(case, world), batch_size=case.batch):
            parts.append(_outputs(case, model(x), y))
    return _collect(case, parts)


def _plain_order(case: Case, world: int) -> list[int]:
    """Dataset index of every position of the plain loop's (truncated) result."""
    from torch.utils.data import DistributedSampler

    dataset = _dataset(case, world)
    shards = [list(DistributedSampler(dataset, num_replicas=world, rank=r, shuffle=False))
              for r in range(world)]
    order: list[int] = []
    for start in range(0, len(shards[0]), case.batch):
        for shard in shards:
            order += shard[start:start + case.batch]
    return order[:len(dataset)]


def _equal(got: Any, want: Any) -> bool:
    """Same shape and dtype; integers equal, floats equal to 1e-5 (a batch of another size,
    such as the short or padded last one, can change the last bits of a matrix product)."""
    import torch

    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if got.dtype.is_floating_point:
        return bool(torch.allclose(got, want, rtol=1e-5, atol=1e-6))
    return bool(torch.equal(got, want))


def _exactness(case: Case, world: int, results: dict[str, dict[str, Any]]) -> dict[str, str]:
    import torch

    ref = _reference(case, world)
    order = torch.tensor(_plain_order(case, world))
    verdicts = {}
    for name, got in results.items():
        plain = name in ("torch", AA)
        if plain and sorted(order.tolist()) != list(range(len(order))):
            verdicts[name] = "wrong: some samples twice, others missing"
            continue
        want = {k: v[order] for k, v in ref.items()} if plain else ref
        same = all(_equal(got[k], want[k]) for k in ref)
        verdicts[name] = (("equal after reordering" if plain else "equal") if same
                          else "DIFFERENT")
    return verdicts


def _keeping(last: dict[str, Any], name: str, epoch: Callable[[], Any]) -> Callable[[], None]:
    """``epoch``, keeping its result in ``last[name]`` (checked for exactness at the end)."""
    def run() -> None:
        last[name] = epoch()

    return run


def _worker(rank: int, cases: tuple[Case, ...], repeats: int, use_accelerate: bool
            ) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    accel_acc, other = _common.accelerators(use_accelerate)
    world = accel_acc.num_processes
    out: dict[str, Any] = {"wall": {}, "cpu": {}, "exact": {}}
    for case in cases:
        variants = {"torch": _torch_variant(case, rank, world),
                    AA: _torch_variant(case, rank, world),
                    "accel": _framework_variant(accel_acc, case, world)}
        if other is not None:
            variants["accelerate"] = _framework_variant(other, case, world)
        last: dict[str, dict[str, Any]] = {}
        timed = {name: _keeping(last, name, fn) for name, fn in variants.items()}
        wall, cpu = _common.interleave(timed, repeats=repeats, warmup=1)
        batches = -(-_length(case, world) // (case.batch * world))
        out["wall"][case.name] = {k: [t / batches for t in v] for k, v in wall.items()}
        out["cpu"][case.name] = {k: [t / batches for t in v] for k, v in cpu.items()}
        out["exact"][case.name] = _exactness(case, world, last)
    return out


def _spread(samples: list[float]) -> str:
    return " / ".join(_common.format_seconds(f(samples)) for f in (min, _common.median, max))


def _report(title: str, results: dict[str, dict[str, list[float]]], columns: list[str]) -> str:
    rows = [[name] + [_common.median(times[c]) for c in columns]
            for name, times in results.items()]
    lines = [_common.format_table(title, ["case"] + columns, rows, ratio_of=columns[1:]),
             "min / median / max per batch:"]
    for name, times in results.items():
        lines.append(f"  {name}: " + "; ".join(f"{c} {_spread(times[c])}" for c in columns))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _common.add_common_args(parser, repeats=9)
    args = parser.parse_args(argv)
    cases, repeats = CASES, args.repeats
    if args.quick:
        cases = tuple(Case(c.name, c.width, c.depth, c.classes, 4, 3, c.output) for c in CASES)
        repeats = 2
    use_accelerate = _common.has_accelerate() and not args.no_accelerate
    results = _common.run_workers(_worker, 2, (cases, repeats, use_accelerate))[0]
    columns = ["torch", AA, "accel"] + (["accelerate"] if use_accelerate else [])
    what = f"2 processes (gloo), rank 0, {repeats} interleaved epochs"
    print(_report(f"Wall time per evaluation batch, {what}", results["wall"], columns))
    print()
    print(_report(f"CPU time per evaluation batch (all threads of rank 0), {what}",
                  results["cpu"], columns))
    print(_common.machine_line())
    print("exactness (final gathered results against one process over the whole dataset):")
    exact = True
    for name, verdicts in results["exact"].items():
        print(f"  {name}: " + "; ".join(f"{c} {v}" for c, v in verdicts.items()))
        exact = exact and all(v != "DIFFERENT" for c, v in verdicts.items()
                              if c not in ("torch", AA))
    note = "prepare(model, loader); gather_for_metrics per batch; whole epochs"
    for clock in ("wall", "cpu"):
        worst = 0.0
        for name, times in results[clock].items():
            rec = _common.record("bench_eval", f"{name} ({clock})", accel=times["accel"],
                                 baseline=times["torch"], accelerate=times.get("accelerate"),
                                 target=TARGET, note=note)
            worst = max(worst, rec["ratio"])
        control = max(abs(_common.ratio(_common.median(t[AA]), _common.median(t["torch"])) - 1)
                      for t in results[clock].values())
        print(f"target ({clock}): accel / torch per batch <= {TARGET} on every case: worst "
              f"{worst:.3f} ({'met' if worst <= TARGET else 'MISSED'}; torch against itself "
              f"within {control:.1%})")
    print(f"exactness: accel equal to one process on every case: {'met' if exact else 'MISSED'}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
