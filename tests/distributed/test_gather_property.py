"""Property: ``Communicator.gather`` (reused send/receive buffers, one collective in the steady
state, a second round on overflow) equals a plain ``torch.distributed.all_gather`` + ``cat``.

One 2-process spawn runs ``CALLS`` seeded random gathers: 1 to 3 leaves per call, 0-d to 3-d,
12 dtypes, zero-size dimensions, first dimensions that differ across ranks, non-contiguous
inputs, and calls that repeat the previous call's shapes (the kept buffers are reused), change
them on one rank only, or grow past the agreed capacity and shrink back (the buffers are
rebuilt). Results kept from earlier calls are checked again at the end: reusing a buffer must
never change a result already returned. Every rank draws the same case list from ``SEED`` (only
the values and per-rank first dimensions differ by rank), so a failure names the seed and the
call to replay.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from tests.spawn import run_workers

SEED = 27_2026
CALLS = 400

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.bool, torch.int8,
          torch.uint8, torch.int16, torch.int32, torch.int64, torch.complex64, torch.complex128)
#: gloo's all_gather has no int16: the reference gathers it widened (exact) and narrows back
_WIDEN = {torch.int16: torch.int32}

#: one leaf of one call: dtype, number of dims, trailing dims, first dim per rank, transposed
Leaf = tuple[torch.dtype, int, tuple[int, ...], tuple[int, int], bool]


def _first_dims(rng: random.Random, big: bool) -> tuple[int, int]:
    top = 40_000 if big else 9  # 40k rows of a few columns overflow the 1 MiB kept buffers
    first = rng.choice((0, 1, rng.randint(0, top)))
    if rng.random() < 0.5:
        return first, first
    return first, rng.choice((0, 1, rng.randint(0, top)))


def _new_leaf(rng: random.Random, big: bool) -> Leaf:
    ndim = rng.choice((0, 1, 1, 2, 2, 3))
    trailing = tuple(rng.choice((0, 1, 2, 3, 5)) if rng.random() < 0.15 else rng.randint(1, 4)
                     for _ in range(max(ndim - 1, 0)))
    firsts = (1, 1) if ndim == 0 else _first_dims(rng, big)
    return rng.choice(DTYPES), ndim, trailing, firsts, ndim == 2 and rng.random() < 0.3


def _cases(seed: int, calls: int) -> list[list[Leaf]]:
    """The calls, identical on every rank: fresh signatures, repeats of the previous call (the
    steady state), and the previous call with new first dims on one rank or all."""
    rng = random.Random(seed)
    cases: list[list[Leaf]] = []
    for _ in range(calls):
        roll = rng.random()
        if cases and roll < 0.35:
            cases.append(list(cases[-1]))  # same shapes: the kept buffers are reused
        elif cases and roll < 0.6:
            big = rng.random() < 0.1
            cases.append([(d, n, t, (1, 1) if n == 0 else _first_dims(rng, big), tr)
                          for d, n, t, _, tr in cases[-1]])  # same signature, new first dims
        else:
            big = rng.random() < 0.1
            cases.append([_new_leaf(rng, big) for _ in range(rng.randint(1, 3))])
    return cases


def _make(leaf: Leaf, rank: int, seed: int) -> torch.Tensor:
    dtype, ndim, trailing, firsts, transposed = leaf
    shape = () if ndim == 0 else (firsts[rank],) + trailing
    g = torch.Generator().manual_seed(seed)
    if transposed:  # build the transpose, then view it back: same shape, not contiguous
        shape = shape[::-1]
    if dtype == torch.bool:
        value = torch.rand(shape, generator=g) > 0.5
    elif dtype.is_complex or dtype.is_floating_point:
        value = torch.randn(shape, generator=g, dtype=torch.complex128 if dtype.is_complex
                            else torch.float64).to(dtype)
    else:
        low = 0 if dtype in (torch.uint8, torch.bool) else -100
        value = torch.randint(low, 100, shape, generator=g).to(dtype)
    return value.t() if transposed else value


def _reference(tensor: torch.Tensor, world: int) -> torch.Tensor:
    """``all_gather`` of the first dims, then of the tensor padded to the longest, then ``cat``
    of each rank's rows: what a user writes by hand for uneven first dims."""
    import torch.distributed as dist

    value = tensor.reshape(1) if tensor.dim() == 0 else tensor
    value = value.to(_WIDEN.get(value.dtype, value.dtype)).contiguous()
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([value.shape[0]]))
    rows = [int(s.item()) for s in sizes]
    padded = value.new_zeros((max(rows),) + tuple(value.shape[1:]))
    padded[: value.shape[0]] = value
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([p[:n] for p, n in zip(parts, rows, strict=True)]).to(tensor.dtype)


def _same(got: Any, want: torch.Tensor) -> bool:
    return isinstance(got, torch.Tensor) and got.dtype == want.dtype and \
        got.shape == want.shape and bool(torch.equal(got, want))


def _worker(rank: int, seed: int, calls: int) -> list[str]:
    from tests.spawn import cpu_group

    ctx, comm, group = cpu_group()
    failures: list[str] = []
    kept: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (call, result, its copy)
    for call, leaves in enumerate(_cases(seed, calls)):
        inputs = [_make(leaf, rank, seed * 1000 + call * 10 + i + rank * 7919)
                  for i, leaf in enumerate(leaves)]
        try:
            got = comm.gather(inputs)
        except RuntimeError as exc:  # every rank takes the same path: none is left waiting
            failures.append(f"seed {seed} call {call} {leaves}: {exc}")
            continue
        for i, (tensor, result) in enumerate(zip(inputs, got, strict=True)):
            want = _reference(tensor, ctx.world_size)
            if not _same(result, want):
                what = "the values differ" if (result.shape, result.dtype) == \
                    (want.shape, want.dtype) else f"got {tuple(result.shape)} {result.dtype}"
                failures.append(f"seed {seed} call {call} leaf {i} {leaves[i]}: {what}, "
                                f"expected {tuple(want.shape)} {want.dtype}")
            if call % 7 == 0:
                kept.append((call, result, result.clone()))
    for call, result, copy in kept:
        if not torch.equal(result, copy):
            failures.append(f"seed {seed} call {call}: a later gather changed this result")
    group.close()
    return failures


def test_gather_equals_all_gather_on_random_shapes() -> None:
    for rank, failures in enumerate(run_workers(_worker, 2, args=(SEED, CALLS), timeout=240)):
        assert failures == [], f"rank {rank} ({len(failures)} failures): {failures[:10]}"


def test_cases_cover_the_properties() -> None:
    """The seeded case list reaches what the property is about (checked without processes)."""
    cases = _cases(SEED, CALLS)
    leaves = [leaf for case in cases for leaf in case]
    assert {leaf[0] for leaf in leaves} == set(DTYPES)
    assert any(leaf[3][0] != leaf[3][1] for leaf in leaves)  # uneven first dims
    assert any(0 in leaf[3] for leaf in leaves if leaf[1] > 0)  # a rank sends no rows
    assert any(0 in leaf[2] for leaf in leaves)  # a zero-size trailing dim
    assert any(leaf[1] == 0 for leaf in leaves) and any(leaf[4] for leaf in leaves)
    repeats = sum(a == b for a, b in zip(cases, cases[1:], strict=False))
    assert repeats >= 20  # the same shapes again: the kept buffers are reused
    assert any(max(leaf[3]) > 20_000 for leaf in leaves)  # past the kept buffers' size
