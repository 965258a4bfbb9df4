"""Elastic Horovod training (the shape of Horovod's pytorch_mnist_elastic.py) on accel.

The only Horovod line changed is the import. Run it with restarts allowed:

    accel launch --cpu -n 2 --max_restarts 3 examples/horovod_elastic.py

When a worker is lost, torchrun's agent restarts the workers and ``@hvd.elastic.run`` resumes
them from the last ``state.commit()`` (written under ``ACCEL_ELASTIC_DIR``). Try it with
``--fail_at_step 7``: on the first attempt rank 1 dies abruptly at step 7.

The data are made here: 8x8 "digits", each class a fixed random pattern plus noise.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

import accel.horovod as hvd  # was: import horovod.torch as hvd

parser = argparse.ArgumentParser(description="Elastic Horovod-style training on accel")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size per worker")
parser.add_argument("--epochs", type=int, default=3, help="number of epochs to train")
parser.add_argument("--lr", type=float, default=0.05, help="learning rate (scaled by size)")
parser.add_argument("--momentum", type=float, default=0.5, help="SGD momentum")
parser.add_argument("--seed", type=int, default=42, help="random seed")
parser.add_argument("--batches-per-commit", type=int, default=4,
                    help="commit the state every this many batches")
parser.add_argument("--log-interval", type=int, default=5, help="batches between log lines")
parser.add_argument("--fail_at_step", type=int, default=-1,
                    help="drill: on the first attempt rank 1 dies at this global step")
args = parser.parse_args()

# Horovod: initialize library.
hvd.init()
torch.manual_seed(args.seed)
torch.set_num_threads(1)


def make_digits(count: int, seed: int) -> TensorDataset:
    patterns = torch.randn(10, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (count,), generator=gen)
    images = patterns[labels] + 0.8 * torch.randn(count, 1, 8, 8, generator=gen)
    return TensorDataset(images, labels)


train_dataset, test_dataset = make_digits(1024, 1), make_digits(256, 2)
# Horovod: ElasticSampler partitions the data, and after a reset only what is left this epoch.
train_sampler = hvd.elastic.ElasticSampler(train_dataset, shuffle=True, seed=args.seed)
train_loader = DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)
test_sampler = hvd.elastic.ElasticSampler(test_dataset, shuffle=False)
test_loader = DataLoader(test_dataset, batch_size=256, sampler=test_sampler)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=3)
        self.fc1 = nn.Linear(8 * 3 * 3, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


model = Net()
# Horovod: scale learning rate by the number of workers.
optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)


def metric_average(val: float, name: str) -> float:
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> None:
    # post synchronization event (worker added, worker removed) init ...
    for state.epoch in range(state.epoch, args.epochs + 1):  # noqa: B020 (Horovod's idiom)
        state.model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            state.optimizer.zero_grad()
            loss = F.nll_loss(state.model(data), target)
            loss.backward()
            state.optimizer.step()
            state.train_sampler.record_batch(batch_idx, args.batch_size)
            state.step += 1
            if state.step % args.log_interval == 0 and hvd.rank() == 0:
                print(f"Train Epoch: {state.epoch} step {state.step}\tLoss: {loss.item():.6f}")
            if (args.fail_at_step == state.step and hvd.rank() == 1
                    and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0):
                os._exit(1)  # a lost worker: no clean-up, no exception
            if state.step % args.batches_per_commit == 0:
                state.commit()
        # Horovod: call set_epoch at the end of the epoch (it clears the processed samples).
        state.train_sampler.set_epoch(state.epoch + 1)


def test() -> None:
    model.eval()
    test_loss = test_accuracy = 0.0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            test_accuracy += output.argmax(1).eq(target).float().sum().item()
    # Horovod: average metric values across workers.
    test_loss = metric_average(test_loss / len(test_sampler), "avg_loss")
    test_accuracy = metric_average(test_accuracy / len(test_sampler), "avg_accuracy")
    if hvd.rank() == 0:
        print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {100.0 * test_accuracy:.2f}%")


# Horovod: wrap optimizer with DistributedOptimizer (gradients averaged during backward).
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


# adjust learning rate on reset
def on_state_reset() -> None:
    for param_group in optimizer.param_groups:
        param_group["lr"] = args.lr * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, train_sampler=train_sampler, epoch=1, step=0)
state.register_reset_callbacks([on_state_reset])
train(state)
test()
hvd.shutdown()
