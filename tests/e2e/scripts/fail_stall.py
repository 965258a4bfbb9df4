"""e2e worker: rank 0 calls wait_for_everyone() under `if is_main_process` (a classic hang).

Rank 1 goes on to a gather instead, so both ranks wait in different collectives until the
(small) collective timeout ends the job. ACCEL_TIMEOUT and ACCEL_STALL_SECONDS come from the
test. Each rank prints ``SITE <rank> <line>`` for the collective it is stuck in.
"""

from __future__ import annotations

import os
import sys

import torch

from accel import Accelerator


def main() -> None:
    accelerator = Accelerator(cpu=True)
    accelerator.gather(torch.ones(2))  # a healthy collective first: #1
    if accelerator.is_main_process:
        os.write(1, f"SITE 0 {sys._getframe().f_lineno + 1}\n".encode())
        accelerator.wait_for_everyone()  # only rank 0 gets here
    else:
        os.write(1, f"SITE 1 {sys._getframe().f_lineno + 1}\n".encode())
        accelerator.gather(torch.zeros(3))  # rank 1 is already at the next collective
    accelerator.end_training()


if __name__ == "__main__":
    main()
