"""e2e worker: ranks all-reduce tensors of different shapes (rank r sends r + 2 values).

Under ``accel launch --debug`` (ACCEL_DEBUG=1) this must raise CollectiveMismatchError naming
each rank's shape instead of hanging or returning garbage.
"""

from __future__ import annotations

import torch

from accel import Accelerator


def main() -> None:
    accelerator = Accelerator(cpu=True)
    accelerator.reduce(torch.ones(3))  # matching shapes pass the check
    accelerator.reduce(torch.ones(accelerator.process_index + 2))
    print("UNREACHABLE", flush=True)


if __name__ == "__main__":
    main()
