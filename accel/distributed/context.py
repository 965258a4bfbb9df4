"""The frozen description of this process's place in the job.

Example:
    >>> import torch
    >>> ctx = ProcessContext(rank=1, local_rank=1, world_size=2, local_world_size=2, node_rank=0,
    ...                      device=torch.device("cpu"), backend="gloo", launcher="torchrun")
    >>> ctx.is_main_process, ctx.is_distributed
    (False, True)
    >>> ProcessContext.single().is_main_process
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ProcessContext"]


@dataclass(frozen=True, kw_only=True, slots=True)
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

    @classmethod
    def single(cls, device: torch.device | str = "cpu") -> ProcessContext:
        """The context of a lone process: rank 0 of 1 on ``device``, gloo, no launcher.

        What a script run as ``python train.py`` gets, and what tests and examples of the
        single-process paths build.

        Example:
            >>> ctx = ProcessContext.single()
            >>> ctx.rank, ctx.world_size, str(ctx.device), ctx.backend, ctx.launcher
            (0, 1, 'cpu', 'gloo', 'none')
        """
        return cls(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                   device=torch.device(device), backend="gloo", launcher="none")

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
