"""A Horovod PyTorch MNIST-style script, run by accel: only the import line differs.

The shape of Horovod's own ``pytorch_mnist.py`` (``DistributedSampler`` over ``hvd.size()``,
``broadcast_parameters``, ``broadcast_optimizer_state``, ``DistributedOptimizer``, metric
averaging with ``hvd.allreduce``), on 28x28 "digit" images made in the script (each class is a
noisy stroke pattern), so nothing is downloaded:

    accel launch --cpu -np 2 examples/horovod_mnist.py
    mpirun -np 2 python examples/horovod_mnist.py       # where Open MPI is installed
    python examples/horovod_mnist.py                     # one process

With Horovod installed, ``import horovod.torch as hvd`` runs the same file.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import accel.horovod as hvd  # was: import horovod.torch as hvd


def make_dataset(size: int, seed: int) -> TensorDataset:
    """Images of 10 classes: class k lights row band k and column band 9 - k, plus noise."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (size,), generator=gen)
    images = 0.3 * torch.randn(size, 1, 28, 28, generator=gen)
    for k in range(10):
        rows = slice(2 + 2 * k, 4 + 2 * k)
        cols = slice(2 + 2 * (9 - k), 4 + 2 * (9 - k))
        images[labels == k, 0, rows, :] += 1.0
        images[labels == k, 0, :, cols] += 1.0
    return TensorDataset(images, labels)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Horovod-style MNIST on synthetic digits")
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--test-batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.025, help="before scaling by hvd.size()")
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--train-size", type=int, default=2048)
    parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression")
    parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
    return parser.parse_args()


def metric_average(value: torch.Tensor, name: str) -> float:
    return float(hvd.allreduce(value, name=name))  # the average over the processes


def train(epoch: int, model: nn.Module, loader: DataLoader, sampler: DistributedSampler,
          optimizer: torch.optim.Optimizer) -> None:
    model.train()
    sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every process
    for data, target in loader:
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
    if hvd.rank() == 0:
        print(f"epoch {epoch}: last batch loss {loss.item():.4f}")


def test(model: nn.Module, loader: DataLoader, sampler: DistributedSampler) -> float:
    model.eval()
    loss = torch.tensor(0.0)
    correct = torch.tensor(0.0)
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            loss += F.nll_loss(output, target, reduction="sum")
            correct += (output.argmax(1) == target).sum()
    count = len(sampler)  # samples of this process (the sampler pads to equal counts)
    accuracy = metric_average(correct / count, "avg_accuracy")
    average_loss = metric_average(loss / count, "avg_loss")
    if hvd.rank() == 0:
        print(f"test: average loss {average_loss:.4f}, accuracy {100 * accuracy:.1f}%")
    return accuracy


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    train_set = make_dataset(args.train_size, seed=0)
    test_set = make_dataset(512, seed=1)
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
    test_sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                      shuffle=False)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=args.test_batch_size, sampler=test_sampler)

    model = Net()
    # Horovod's convention: scale the learning rate by the number of processes.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                                momentum=args.momentum)
    # every process starts from rank 0's weights and optimizer state
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression,
        op=hvd.Average, gradient_predivide_factor=args.gradient_predivide_factor)

    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        train(epoch, model, train_loader, train_sampler, optimizer)
        accuracy = test(model, test_loader, test_sampler)
    if hvd.rank() == 0:
        print(f"final accuracy {100 * accuracy:.1f}% on {hvd.size()} process(es)")
    hvd.shutdown()


if __name__ == "__main__":
    main()
