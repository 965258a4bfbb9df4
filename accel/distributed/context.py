"""The frozen description of this process's place in the job.

Example:
    >>> import torch
    >>> ctx = ProcessContext(0, 0, 1, 1, 0, torch.device("cpu"), "gloo", "none")
    >>> ctx.is_main_process, ctx.is_distributed
    (True, False)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ProcessContext"]


@dataclass(frozen=True)
class ProcessContext:
    """Rank, local rank, world size, node rank, device and backend of this process."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    device: torch.device
    backend: str
    launcher: str

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_rank == 0

    @property
    def is_last_process(self) -> bool:
        return self.rank == self.world_size - 1

    @property
    def num_nodes(self) -> int:
        return max(1, -(-self.world_size // max(1, self.local_world_size)))
