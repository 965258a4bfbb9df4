"""GPU benchmark (needs CUDA): mixed-precision training step and gather_for_metrics on CUDA.

One process per visible GPU (nccl). In the same processes, the same small transformer
(token embedding, ``nn.TransformerEncoder``, vocabulary head; sized to keep an H100 busy)
is trained with:

* ``torch``: ``torch.autocast`` + ``DistributedDataParallel`` (also with one process, as the
  issue asks) and, for fp16, ``torch.amp.GradScaler``;
* ``torch (no DDP)``: the same without DDP (shown with one process, since accel does not wrap
  a single-process model in DDP);
* ``accel``: ``Accelerator(mixed_precision=...)``, ``prepare``, ``accelerator.backward``.

Blocks of steps are interleaved (rotating which variant goes first) and timed between
``torch.cuda.synchronize()`` calls; medians per step (and min / median / max) and ratios to
``torch`` are printed for bf16 and fp16. Then ``gather_for_metrics`` of a (batch, classes)
tensor on CUDA against one ``all_gather_into_tensor`` (with one process accel returns without
a collective).

Run:  python benchmarks/bench_gpu.py [--repeats 20] [--layers 8] [--d-model 1024]
          [--batch 16] [--seq 512] [--quick]
      (``--cpu`` runs the same code on the CPU in one process: it checks the script itself
      on a machine without a GPU; its figures mean nothing)
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

TARGET = 1.02  # accel / torch, bf16 step


@dataclass(frozen=True)
class Config:
    layers: int
    d_model: int
    batch: int
    seq: int
    vocab: int
    steps: int  # per timed block
    repeats: int
    gather_repeats: int
    device: str  # "cuda", or "cpu" to check the script without a GPU


def _sync(cfg: Config) -> None:
    import torch

    if cfg.device == "cuda":
        torch.cuda.synchronize()


def _model(cfg: Config) -> Any:
    import torch
    from torch import nn

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
            layer = nn.TransformerEncoderLayer(cfg.d_model, nhead=cfg.d_model // 64,
                                               dim_feedforward=4 * cfg.d_model,
                                               batch_first=True, norm_first=True)
            self.body = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
            self.head = nn.Linear(cfg.d_model, cfg.vocab)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.head(self.body(self.embed(tokens)))

    torch.manual_seed(0)
    return TinyLM()


def _loss(logits: Any, targets: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def _torch_variant(cfg: Config, mode: str, ddp: bool, batch: tuple[Any, Any],
                   device: Any) -> Callable[[], None]:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    model = _model(cfg).to(device)
    if ddp:
        model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dtype = torch.bfloat16 if mode == "bf16" else torch.float16
    scaler = torch.amp.GradScaler(device.type) if mode == "fp16" else None
    x, y = batch

    def block() -> None:
        for _ in range(cfg.steps):
            with torch.autocast(device.type, dtype=dtype):
                logits = model(x)
            loss = _loss(logits, y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        _sync(cfg)

    return block


def _accel_variant(accelerator: Any, cfg: Config, batch: tuple[Any, Any]) -> Callable[[], None]:
    import torch

    model = _model(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    x, y = batch

    def block() -> None:
        for _ in range(cfg.steps):
            loss = _loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        _sync(cfg)

    return block


def _steps(cfg: Config, world: int) -> dict[str, dict[str, list[float]]]:
    import torch

    from accel import Accelerator

    out: dict[str, dict[str, list[float]]] = {}
    for mode in ("bf16", "fp16"):
        accelerator = Accelerator(mixed_precision=mode, cpu=cfg.device == "cpu")
        device = accelerator.device
        generator = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=generator)
        batch = (tokens[:, :-1].to(device), tokens[:, 1:].to(device))
        variants = {"torch": _torch_variant(cfg, mode, True, batch, device)}
        if world == 1:
            variants["torch (no DDP)"] = _torch_variant(cfg, mode, False, batch, device)
        variants["accel"] = _accel_variant(accelerator, cfg, batch)
        wall, _ = _common.interleave(variants, repeats=cfg.repeats, warmup=2)
        out[mode] = {name: [t / cfg.steps for t in times] for name, times in wall.items()}
        del variants
        if cfg.device == "cuda":
            torch.cuda.empty_cache()
    return out


def _gather(cfg: Config, world: int) -> dict[str, list[float]]:
    import time

    import torch
    import torch.distributed as dist

    from accel import Accelerator

    accelerator = Accelerator(mixed_precision="bf16", cpu=cfg.device == "cpu")
    rows = 256
    loader = accelerator.prepare(torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.arange(rows * world * (cfg.gather_repeats + 8))),
        batch_size=rows))
    preds = torch.randn(rows, 1000, device=accelerator.device)
    gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def raw() -> None:
        out = torch.empty(world * preds.numel(), device=preds.device)
        gather_into(out, preds.view(-1))  # 1-D: what gloo accepts too
        out.view(world * rows, 1000)
        _sync(cfg)

    def accel() -> None:
        accelerator.gather_for_metrics(preds)
        _sync(cfg)

    calls = {"torch": raw, "accel": accel}
    times: dict[str, list[float]] = {"torch": [], "accel": []}
    for index, _batch in enumerate(loader):
        for name in (("torch", "accel") if index % 2 else ("accel", "torch")):
            start = time.perf_counter()
            calls[name]()
            if index >= 8:  # warm-up: NCCL communicators, capacity growth
                times[name].append(time.perf_counter() - start)
    return times


def _worker(rank: int, cfg: Config, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    # Started here (accel adopts it): plain DDP needs a group even with one process, where
    # accel itself would not start one.
    if cfg.device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cfg.device == "cuda" else "gloo")
    name = torch.cuda.get_device_name(rank) if cfg.device == "cuda" else "CPU (script check)"
    return {"steps": _steps(cfg, world), "gather": _gather(cfg, world), "gpu": name}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _common.add_common_args(parser, repeats=20)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=16, help="sequences per GPU and step")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--cpu", action="store_true",
                        help="run on the CPU in one process to check the script (no figures)")
    args = parser.parse_args(argv)
    import torch

    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu.py needs a CUDA GPU, and torch.cuda.is_available() is False on this "
              "machine; run it on a GPU machine (python benchmarks/bench_gpu.py). The CPU "
              "benchmarks are bench_step.py, bench_gather.py, bench_import.py and "
              "bench_launch.py.", file=sys.stderr)
        return 2
    if args.quick:
        cfg = Config(layers=2, d_model=128, batch=2, seq=32, vocab=256, steps=1, repeats=2,
                     gather_repeats=3, device=device)
    else:
        cfg = Config(args.layers, args.d_model, args.batch, args.seq, vocab=8192, steps=5,
                     repeats=args.repeats, gather_repeats=200, device=device)
    world = torch.cuda.device_count() if device == "cuda" else 1
    result = _common.run_workers(_worker, world, (cfg, world))[0]
    what = (f"{world} process(es) on {result['gpu']}, {cfg.layers} layers x d_model "
            f"{cfg.d_model}, batch {cfg.batch} x {cfg.seq} tokens per GPU")
    for mode, times in result["steps"].items():
        columns = list(times)
        rows = [[mode] + [_common.median(times[c]) for c in columns]]
        print(_common.format_table(f"{mode} training step, {what}, median of {cfg.repeats} "
                                   f"blocks of {cfg.steps} steps", ["precision"] + columns,
                                   rows, ratio_of=columns[1:]))
        print(_common.spread_lines("per step", {mode: times}, columns))
        print()
    gather = result["gather"]
    alone = " (with one process accel runs no collective)" if world == 1 else ""
    print(_common.format_table(
        f"gather_for_metrics of (256, 1000) float32 on {device.upper()} vs one "
        f"all_gather_into_tensor, {world} process(es){alone}, median of "
        f"{len(gather['torch'])} batches",
        ["tensor per rank", "torch", "accel"],
        [["(256, 1000) float32", _common.median(gather["torch"]),
          _common.median(gather["accel"])]], ratio_of=["accel"]))
    print(_common.spread_lines("per gather", {"(256, 1000) float32": gather},
                               ["torch", "accel"]))
    print(_common.machine_line())
    bf16 = result["steps"]["bf16"]
    value = _common.ratio(_common.median(bf16["accel"]), _common.median(bf16["torch"]))
    print(f"target: bf16 step accel / torch <= {TARGET}: {value:.3f} "
          f"({'met' if value <= TARGET else 'MISSED'})")
    _record(result, world, device)
    return 0


def _record(result: dict[str, Any], world: int, device: str) -> None:
    where = f"{world} x {result['gpu']}" if device == "cuda" else "CPU script check"
    for mode, times in result["steps"].items():
        _common.record("bench_gpu", f"{mode} training step, {where}", accel=times["accel"],
                       baseline=times["torch"], baseline_name="autocast + DDP",
                       target=TARGET if mode == "bf16" else None)
    gather = result["gather"]
    _common.record("bench_gpu", f"gather_for_metrics (256, 1000) float32, {where}",
                   accel=gather["accel"], baseline=gather["torch"],
                   baseline_name="all_gather_into_tensor")


if __name__ == "__main__":
    sys.exit(main())
