"""Which server holds which row of a table, and the table's deterministic initial values.

Two partitions: ``"hash"`` (row ``i`` on server ``i % S``, local slot ``i // S``, as Paddle's
default) spreads hot low ids over every server; ``"range"`` (contiguous blocks of
``ceil(N / S)`` rows) keeps neighbouring ids together.

The initial values of a row depend only on the table's seed and the row id (rows are drawn in
fixed blocks of ``INIT_BLOCK`` from a generator seeded per block), never on the number of
servers: a table re-partitioned over another server count, or built whole in one process
(:func:`initial_weight`), has the same rows.

Example:
    >>> import torch
    >>> part = Partition(num_embeddings=10, servers=3, kind="hash")
    >>> part.owner(torch.tensor([0, 4, 8])).tolist(), part.rows(1)
    ([0, 1, 2], 3)
    >>> full = initial_weight(10, 2, seed=1, scale=0.1)
    >>> mine = shard_initial(part, server=1, dim=2, seed=1, scale=0.1)
    >>> bool(torch.equal(full[part.global_ids(1)], mine))
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["INIT_BLOCK", "PARTITIONS", "Partition", "initial_weight", "shard_initial"]

PARTITIONS = ("hash", "range")
#: Rows drawn per generator seed (a fixed block size keeps the values independent of S).
INIT_BLOCK = 1 << 16


@dataclass(frozen=True, kw_only=True, slots=True)
class Partition:
    """``num_embeddings`` rows over ``servers`` servers."""

    num_embeddings: int
    servers: int
    kind: str = "hash"

    def __post_init__(self) -> None:
        if self.kind not in PARTITIONS:
            raise ValueError(f"partition={self.kind!r}; use 'hash' or 'range'")

    @property
    def block(self) -> int:
        return -(-self.num_embeddings // self.servers)

    def owner(self, ids: torch.Tensor) -> torch.Tensor:
        """The server of each id."""
        return ids % self.servers if self.kind == "hash" else ids // self.block

    def local(self, ids: torch.Tensor) -> torch.Tensor:
        """Each id's slot in its server's shard."""
        return ids // self.servers if self.kind == "hash" else ids % self.block

    def rows(self, server: int) -> int:
        """How many rows ``server`` holds."""
        if self.kind == "hash":
            return max(0, -(-(self.num_embeddings - server) // self.servers))
        return max(0, min(self.num_embeddings, (server + 1) * self.block) - server * self.block)

    def global_ids(self, server: int) -> torch.Tensor:
        """The ids ``server`` holds, in slot order."""
        if self.kind == "hash":
            return torch.arange(server, self.num_embeddings, self.servers)
        start = server * self.block
        return torch.arange(start, start + self.rows(server))


def _block(index: int, *, rows: int, dim: int, seed: int, scale: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
    return torch.empty(rows, dim).uniform_(-scale, scale, generator=generator)


def initial_weight(num_embeddings: int, dim: int, seed: int, scale: float) -> torch.Tensor:
    """The whole table as the servers initialise it (for a single-process reference)."""
    blocks = [_block(i, rows=min(INIT_BLOCK, num_embeddings - start), dim=dim, seed=seed,
                     scale=scale)
              for i, start in enumerate(range(0, num_embeddings, INIT_BLOCK))]
    return torch.cat(blocks) if blocks else torch.empty(0, dim)


def shard_initial(part: Partition, *, server: int, dim: int, seed: int,
                  scale: float) -> torch.Tensor:
    """The initial rows of ``server``'s shard, drawing only the blocks that hold them."""
    ids = part.global_ids(server)
    out = torch.empty(len(ids), dim)
    if len(ids) == 0:
        return out
    first, last = int(ids[0]) // INIT_BLOCK, int(ids[-1]) // INIT_BLOCK
    for index in range(first, last + 1):
        start = index * INIT_BLOCK
        rows = min(INIT_BLOCK, part.num_embeddings - start)
        mask = (ids >= start) & (ids < start + rows)
        if bool(mask.any()):
            out[mask] = _block(index, rows=rows, dim=dim, seed=seed, scale=scale)[ids[mask] - start]
    return out
