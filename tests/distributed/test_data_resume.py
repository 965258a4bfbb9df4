"""Resume semantics of prepared loaders, and ``join_uneven_inputs(even_batches=...)``, with
2 real processes (one spawn checks everything: process start is slow).

Scripts written for Accelerate resume by hand: ``load_state(path)``, then skip the batches
already trained on, with ``if step < resume_step: continue`` or with
``accelerator.skip_first_batches(loader, resume_step)``. Accelerate's ``load_state`` restores
no loader position, so neither does accel's by default: such a script must train on exactly
the samples of the uninterrupted run, not skip them twice. With
``DataLoaderConfiguration(use_stateful_dataloader=True)`` the loader resumes by itself and a
script without hand skipping trains on them too. Each run records the global sample indices
of every optimizer step (gathered over both ranks); a resumed run must equal the
uninterrupted one from its checkpoint on.

Two checkpoints: step 3 (mid epoch 0; the script never calls ``set_epoch``, as Accelerate's
examples do) and step 9 (mid epoch 1; the script calls ``loader.set_epoch(epoch)``, which a
resumed run needs for epoch 1's shuffle order with ``use_seedable_sampler=True``). With the
default ``use_seedable_sampler=False`` the sampler draws from its own generator, which
Accelerate's ``load_state`` does not restore: a hand-skipping script resumed in epoch 1 gets
epoch 0's order again (as under Accelerate); the stateful loader restores it.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from tests.spawn import run_workers

N = 24  # samples; batch 2 on 2 ranks: 6 steps per epoch
BATCH = 2
STEPS_PER_EPOCH = N // (BATCH * 2)
EPOCHS = 2
CHECKPOINTS = {3: False, 9: True}  # global step: whether the script calls set_epoch(epoch)


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(3))


def _script(root: str, style: str, set_epoch: bool, resume: int | None,
            seedable: bool = True) -> list[list[int]]:
    """One run of a training script; returns the sample indices of each optimizer step.

    ``style``: "continue" / "skip" (Accelerate's hand skipping, default loaders), "stateful"
    (``use_stateful_dataloader=True``, no hand skipping). ``resume``: the checkpoint's step.
    Without ``resume`` the run saves ``<root>/step_<n>`` at each step of CHECKPOINTS.
    """
    from accel import Accelerator, DataLoaderConfiguration
    from accel.utils import set_seed

    set_seed(0)
    config = DataLoaderConfiguration(use_stateful_dataloader=style == "stateful",
                                     use_seedable_sampler=seedable)
    root = f"{root}/seedable_{seedable}"
    acc = Accelerator(cpu=True, dataloader_config=config)
    model = nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.arange(N)), batch_size=BATCH, shuffle=True)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    start_epoch, resume_step, done = 0, 0, 0
    if resume is not None:
        acc.load_state(f"{root}/step_{resume}")
        start_epoch, resume_step = divmod(resume, STEPS_PER_EPOCH)
        done = resume
    seen: list[list[int]] = []
    for epoch in range(start_epoch, EPOCHS):
        if set_epoch:
            loader.set_epoch(epoch)
        first = resume is not None and epoch == start_epoch
        active = loader
        if first and style == "skip":
            active = acc.skip_first_batches(loader, resume_step)
        for step, (idx,) in enumerate(active):
            if first and style == "continue" and step < resume_step:
                continue
            loss = model(idx.float().unsqueeze(1)).pow(2).mean()
            acc.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            seen.append(acc.gather(idx).tolist())
            done += 1
            if resume is None and done in CHECKPOINTS and CHECKPOINTS[done] == set_epoch:
                acc.save_state(f"{root}/step_{done}")
    return seen


def _resume_runs(root: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for set_epoch, seedable in ((False, False), (True, True), (True, False)):
        out["ref", set_epoch, seedable] = _script(root, "continue", set_epoch, None, seedable)
        step = next(s for s, flag in CHECKPOINTS.items() if flag == set_epoch)
        for style in ("continue", "skip", "stateful"):
            out[style, set_epoch, seedable] = _script(root, style, set_epoch, step, seedable)
    return out


def _generator_checks(rank: int) -> dict[str, Any]:
    """use_seedable_sampler=False: ranks agree on rank 0's generator state at every pass,
    even when their global seeds differ or the user reseeds the generator differently."""
    from accel import Accelerator

    torch.manual_seed(100 + rank)  # prepare() seeds the sampler's new generator differently
    acc = Accelerator(cpu=True)
    own = acc.prepare(DataLoader(range(16), batch_size=2, shuffle=True))
    user = torch.Generator().manual_seed(rank)
    given = acc.prepare(DataLoader(range(16), batch_size=2, shuffle=True, generator=user))
    out: dict[str, Any] = {"own": [], "given": []}
    for epoch in range(2):
        out["own"].append([acc.gather(b).tolist() for b in own])
        user.manual_seed(42 + epoch + rank * epoch)  # the same on both ranks in epoch 0 only
        out["given"].append([acc.gather(b).tolist() for b in given])
    return out


def _join_checks(rank: int) -> dict[str, Any]:
    """Accelerate's join_uneven_inputs semantics: 3 samples of batch 1 on 2 ranks."""
    from accel import Accelerator, DataLoaderConfiguration

    out: dict[str, Any] = {}
    uneven = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(even_batches=False))
    model = uneven.prepare(nn.Linear(1, 1))
    dl = uneven.prepare(DataLoader(TensorDataset(torch.arange(3.0)), batch_size=1))
    with uneven.join_uneven_inputs([model]):  # rank 1 runs out first: Join shadows its allreduce
        out["uneven"] = [model(x.unsqueeze(1)).sum().backward() or x.tolist() for (x,) in dl]
    uneven.wait_for_everyone()

    acc = Accelerator(cpu=True)  # even_batches=True
    model = acc.prepare(nn.Linear(1, 1))
    train, valid = (acc.prepare(DataLoader(TensorDataset(torch.arange(3.0)), batch_size=1))
                    for _ in range(2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with acc.join_uneven_inputs([model], even_batches=False):
            out["inside"] = (train.batch_sampler.even_batches, valid.batch_sampler.even_batches,
                             len(train))
            out["overridden"] = [model(x.unsqueeze(1)).sum().backward() or x.tolist()
                                 for (x,) in train]
    out["outside"] = (train.batch_sampler.even_batches, valid.batch_sampler.even_batches,
                      len(train), [x.tolist() for (x,) in train])
    out["map_warnings"] = [str(w.message) for w in caught]
    acc.prepare(DataLoader(Stream(), batch_size=1))  # an iterable loader among map-style ones
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with acc.join_uneven_inputs([model], even_batches=False):
            out["mixed_inside"] = train.batch_sampler.even_batches
    out["mixed_warnings"] = [(str(w.message), w.filename == __file__) for w in caught]
    out["mixed_outside"] = train.batch_sampler.even_batches
    return out


def _worker(rank: int, root: str) -> dict[str, Any]:
    return {"resume": _resume_runs(root), "join": _join_checks(rank),
            "generator": _generator_checks(rank)}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("data_resume")
    return run_workers(_worker, 2, args=(str(root),), timeout=180)


@pytest.mark.parametrize(("set_epoch", "seedable"), [(False, False), (True, True)],
                         ids=["mid_epoch0", "mid_epoch1_set_epoch_seedable"])
@pytest.mark.parametrize("style", ["continue", "skip", "stateful"])
def test_resumed_script_trains_on_the_uninterrupted_samples(
        results: list[dict[str, Any]], style: str, set_epoch: bool, seedable: bool) -> None:
    runs = results[0]["resume"]
    assert runs == results[1]["resume"]  # gathered: both ranks saw the same
    ref = runs["ref", set_epoch, seedable]
    step = next(s for s, flag in CHECKPOINTS.items() if flag == set_epoch)
    assert len(ref) == EPOCHS * STEPS_PER_EPOCH
    assert sorted(i for batch in ref[:STEPS_PER_EPOCH] for i in batch) == list(range(N))
    assert ref[:STEPS_PER_EPOCH] != ref[STEPS_PER_EPOCH:]  # a new shuffle each epoch
    assert runs[style, set_epoch, seedable] == ref[step:], (
        f"{style}: resumed at step {step}, trained on {runs[style, set_epoch, seedable]}, "
        f"the uninterrupted run on {ref[step:]}")


def test_default_sampler_generator_resume_as_accelerate(results: list[dict[str, Any]]) -> None:
    """use_seedable_sampler=False, resumed mid epoch 1: the stateful loader restores the
    generator's state at the start of that epoch; hand skipping (Accelerate's load_state keeps
    the generator prepare() made) trains on the rest of epoch 0's order, as under Accelerate."""
    runs = results[0]["resume"]
    ref = runs["ref", True, False]
    assert ref[:STEPS_PER_EPOCH] != ref[STEPS_PER_EPOCH:]
    assert runs["stateful", True, False] == ref[9:]
    for style in ("continue", "skip"):
        assert runs[style, True, False] == ref[3:STEPS_PER_EPOCH]


def test_ranks_share_rank0s_generator_every_pass(results: list[dict[str, Any]]) -> None:
    first, second = (r["generator"] for r in results)
    assert first == second  # gathered
    for name in ("own", "given"):
        for epoch in first[name]:  # one permutation split between the ranks, never overlapping
            assert sorted(i for batch in epoch for i in batch) == list(range(16))
    # the user's generator as rank 0 has it: each epoch is what plain PyTorch draws from it
    for epoch, seed in enumerate((42, 43)):
        plain = DataLoader(range(16), batch_size=4, shuffle=True,
                           generator=torch.Generator().manual_seed(seed))
        assert first["given"][epoch] == [b.tolist() for b in plain]


def test_join_uneven_inputs_with_even_batches_false(results: list[dict[str, Any]]) -> None:
    first, second = (r["join"] for r in results)
    assert first["uneven"] == [[0.0], [2.0]] and second["uneven"] == [[1.0]]


def test_join_uneven_inputs_overrides_even_batches_inside_only(
        results: list[dict[str, Any]]) -> None:
    first, second = (r["join"] for r in results)
    assert first["inside"] == (False, False, 2) and second["inside"] == (False, False, 1)
    assert first["overridden"] == [[0.0], [2.0]] and second["overridden"] == [[1.0]]
    assert first["outside"] == (True, True, 2, [[0.0], [2.0]])
    assert second["outside"] == (True, True, 2, [[1.0], [0.0]])  # padded with sample 0 again
    for r in (first, second):
        assert r["map_warnings"] == []
        assert (r["mixed_inside"], r["mixed_outside"]) == (False, True)
        assert len(r["mixed_warnings"]) == 1, r["mixed_warnings"]
        message, names_the_with_line = r["mixed_warnings"][0]
        assert "only supported for map-style datasets" in message and names_the_with_line

