"""accel.data_loader against Accelerate 1.15 itself: every rank gets the same shards and
shuffle orders, epoch after epoch (Accelerate runs in a child process so that its state objects
stay out of this one; moved out of tests/unit/compat/test_data_loader.py, which starts no
processes)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.unit.compat.test_data_loader import _shards

#: (samples, batch size, shuffle, split_batches, even_batches) on 2 processes
CASES = [(n, bs, shuffle, split, even) for n in (1, 5, 7, 13, 16) for bs in (2, 4)
         for shuffle in (False, True) for split in (False, True) for even in (False, True)]


_ACCELERATE_SIDE = textwrap.dedent("""
    import json, sys
    from torch.utils.data import DataLoader
    from accelerate.data_loader import prepare_data_loader
    out = []
    for n, bs, shuffle, split, even in json.loads(sys.argv[1]):
        ranks = []
        for rank in range(2):
            dl = prepare_data_loader(DataLoader(range(n), batch_size=bs, shuffle=shuffle),
                                     num_processes=2, process_index=rank, split_batches=split,
                                     even_batches=even, use_seedable_sampler=True, data_seed=7)
            ranks.append([b.tolist() for _ in range(2) for b in dl])
        out.append(ranks)
    print(json.dumps(out))
""")


def test_same_shards_and_orders_as_accelerate() -> None:
    """Accelerate 1.15 (the ``accelerate`` test dependency) and accel give every rank the same
    batches, epoch after epoch, for ``use_seedable_sampler=True`` and the same seed: accel
    always shuffles that way (Accelerate's default draws its seed from the global RNG)."""
    pytest.importorskip("accelerate", minversion="1.15", reason="pip install '.[test]'")
    done = subprocess.run([sys.executable, "-c", _ACCELERATE_SIDE, json.dumps(CASES)],
                          capture_output=True, text=True, timeout=120, check=True)
    theirs = json.loads(done.stdout.splitlines()[-1])
    for case, expected in zip(CASES, theirs, strict=True):
        assert _shards(*case) == expected, f"(samples, batch, shuffle, split, even) = {case}"


DEFAULT_CASES = [(n, bs, split, even, gen) for n in (7, 13) for bs in (2, 4)
                 for split in (False, True) for even in (False, True)
                 for gen in (None, "user", "reseed")]

_DEFAULT_SIDE = textwrap.dedent("""
    import json, sys
    import torch
    from torch.utils.data import DataLoader
    from {module} import prepare_data_loader
    out = []
    for n, bs, split, even, gen in json.loads(sys.argv[1]):
        ranks = []
        for rank in range(2):
            torch.manual_seed(11)
            g = None if gen is None else torch.Generator().manual_seed(5)
            dl = prepare_data_loader(DataLoader(range(n), batch_size=bs, shuffle=True,
                                                generator=g),
                                     num_processes=2, process_index=rank, split_batches=split,
                                     even_batches=even)
            after = torch.rand(3).tolist()  # the global RNG right after prepare()
            batches = []
            for _ in range(2):
                if gen == "reseed":
                    g.manual_seed(42)
                batches += [b.tolist() for b in dl]
            ranks.append([after, batches])
        out.append(ranks)
    print(json.dumps(out))
""")


def test_default_mode_orders_and_global_rng_as_accelerate() -> None:
    """With use_seedable_sampler=False (the default) the sampler draws each epoch's order
    from its own generator (the user's, or one seeded from one global-RNG draw in prepare()),
    as in Accelerate 1.15: same batches on both ranks for 2 epochs, same global RNG after
    prepare()."""
    pytest.importorskip("accelerate", minversion="1.15", reason="pip install '.[test]'")
    cases = json.dumps(DEFAULT_CASES)
    results = []
    for module in ("accelerate.data_loader", "accel.data_loader"):
        done = subprocess.run([sys.executable, "-c", _DEFAULT_SIDE.format(module=module), cases],
                              capture_output=True, text=True, timeout=120, check=True)
        results.append(json.loads(done.stdout.splitlines()[-1]))
    theirs, ours = results
    for case, expected, got in zip(DEFAULT_CASES, theirs, ours, strict=True):
        assert got == expected, f"(samples, batch, split, even, generator) = {case}"
    # not a trivial agreement: epoch 1 is a new order, except where reseeded before each epoch
    for case, ((_, batches), _) in zip(DEFAULT_CASES, ours, strict=True):
        half = len(batches) // 2
        assert (batches[:half] == batches[half:]) == (case[4] == "reseed"), case
