"""Horovod's PyTorch synthetic benchmark, in its shape, run by accel (only the import differs).

Measures training throughput (images/s) of a small CNN on random data with
``hvd.DistributedOptimizer``, as Horovod's ``pytorch_synthetic_benchmark.py`` does:

    accel launch --cpu -np 2 examples/horovod_synthetic_benchmark.py --num-iters 3
    mpirun -np 2 python examples/horovod_synthetic_benchmark.py    # where Open MPI is installed
"""

from __future__ import annotations

import argparse
import timeit

import torch
import torch.nn.functional as F
from torch import nn

import accel.horovod as hvd  # was: import horovod.torch as hvd


def build_model(width: int) -> nn.Module:
    """A ResNet-shaped stack of conv blocks (torchvision is not a dependency here)."""
    return nn.Sequential(
        nn.Conv2d(3, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.Conv2d(2 * width, 4 * width, 3, stride=2, padding=1), nn.BatchNorm2d(4 * width),
        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, 1000))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="PyTorch synthetic benchmark (Horovod's shape)")
    parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression")
    parser.add_argument("--batch-size", type=int, default=16, help="per process")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--num-warmup-batches", type=int, default=2)
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-iters", type=int, default=5)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.manual_seed(0)
    device = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() \
        else torch.device("cpu")
    model = build_model(args.width).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    target = torch.randint(0, 1000, (args.batch_size,), device=device)

    def benchmark_step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    def log(text: str) -> None:
        if hvd.rank() == 0:
            print(text, flush=True)

    log(f"Model: {args.width}-wide CNN, batch size {args.batch_size}, {hvd.size()} process(es)")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    rates = []
    for iteration in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{iteration}: {rate:.1f} img/sec per process")
        rates.append(rate)
    mean = sum(rates) / len(rates)
    spread = 1.96 * (sum((r - mean) ** 2 for r in rates) / len(rates)) ** 0.5
    log(f"Img/sec per process: {mean:.1f} +-{spread:.1f}")
    log(f"Total img/sec on {hvd.size()} process(es): {hvd.size() * mean:.1f} "
        f"+-{hvd.size() * spread:.1f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
