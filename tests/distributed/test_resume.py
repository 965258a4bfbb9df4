"""Exact resume with real processes: ``save_state`` in one job, ``load_state()`` in a new one.

Loaders are prepared with ``DataLoaderConfiguration(use_stateful_dataloader=True)``, the switch
that makes ``load_state`` restore their position (the default leaves them as Accelerate does;
see test_data_resume.py).

One training recipe (dropout, Adam, StepLR, shuffled loader, numpy and python noise, per-rank
RNG streams) is run uninterrupted and interrupted, in fp32 and bf16. The resumed runs must
reproduce the uninterrupted run's per-step losses, batches and final parameters bit for bit.
The same spawns check automatic naming, rotation, strict loading across ranks and loading a
2-process checkpoint with 1 process. Few spawns, each checking a lot (process start is slow).
"""

from __future__ import annotations

import random
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.spawn import run_workers

N_SAMPLES = 40
BATCH = 4
STEPS_PER_EPOCH = N_SAMPLES // (BATCH * 2)  # 5 with 2 processes
TOTAL = 17  # epochs 0..3; the last one is cut short
STOP_EARLY = 3  # mid epoch 0
STOP_LATE = 12  # mid epoch 2
STOP_BOUNDARY = 15  # the last step of epoch 2: resume starts epoch 3


class Counter:
    """A user object registered for checkpointing (the global step)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = int(state["step"])


def _dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_SAMPLES, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    return TensorDataset(torch.arange(N_SAMPLES), x, y)


def _build(rank: int, project: str, mixed_precision: str) -> dict[str, Any]:
    from accel import Accelerator, DataLoaderConfiguration

    torch.manual_seed(1234)  # same initial weights everywhere
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.8)
    loader = DataLoader(_dataset(), batch_size=BATCH, shuffle=True)
    # Different RNG streams per rank, so that each rank's own RNG state matters on resume.
    torch.manual_seed(100 + rank)
    np.random.seed(200 + rank)
    random.seed(300 + rank)
    acc = Accelerator(cpu=True, project_dir=project, mixed_precision=mixed_precision,
                      dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    counter = Counter()
    acc.register_for_checkpointing(counter)
    return {"acc": acc, "model": model, "opt": opt, "loader": loader, "sched": sched,
            "counter": counter}


def _train(run: dict[str, Any], stop: int, save_at: tuple[int, ...] = (),
           total_limit: int | None = None) -> dict[str, Any]:
    """Train until the counter reaches ``stop``; save after the steps in ``save_at``."""
    acc, model, opt, loader, sched, counter = (run[k] for k in ("acc", "model", "opt", "loader",
                                                                "sched", "counter"))
    losses, batches, saves, saved = [], [], [], []
    while counter.step < stop:
        for idx, x, y in loader:
            noise = torch.from_numpy(np.random.normal(size=tuple(x.shape)).astype(np.float32))
            x = x + noise * (0.05 * random.random())
            loss = nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            # numpy: torch tensors would travel back to the test through shared memory
            losses.append(acc.gather(loss.detach().float().reshape(1)).numpy())
            batches.append(acc.gather(idx).numpy())
            counter.step += 1
            if counter.step in save_at:
                start = time.perf_counter()
                saved.append(acc.save_state(total_limit=total_limit))
                saves.append(time.perf_counter() - start)
            if counter.step >= stop:
                break
    params = {k: v.detach().numpy().copy()
              for k, v in acc.unwrap_model(model).state_dict().items()}
    return {"losses": losses, "batches": batches, "params": params, "saved": saved,
            "save_s": saves, "lr": sched.get_last_lr(), "epoch": loader.epoch}


def _uninterrupted(rank: int, root: str) -> dict[str, Any]:
    return {mp: _train(_build(rank, f"{root}/ref_{mp}", mp), TOTAL) for mp in ("no", "bf16")}


def _interrupted(rank: int, root: str) -> dict[str, Any]:
    fp32 = _train(_build(rank, f"{root}/fp32", "no"), STOP_EARLY, save_at=(STOP_EARLY,))
    bf16 = _train(_build(rank, f"{root}/bf16", "bf16"), STOP_BOUNDARY, save_at=(STOP_BOUNDARY,))
    return {"no": fp32, "bf16": bf16}


def _resume(rank: int, project: str, mp: str, save_at: tuple[int, ...] = (),
            total_limit: int | None = None) -> dict[str, Any]:
    run = _build(rank, project, mp)
    start = time.perf_counter()
    loaded = run["acc"].load_state()
    load_s = time.perf_counter() - start
    out = _train(run, TOTAL, save_at=save_at, total_limit=total_limit)
    return {**out, "loaded": loaded, "load_s": load_s, "start": TOTAL - len(out["losses"]),
            "acc": run["acc"]}


def _resumed_first(rank: int, root: str) -> dict[str, Any]:
    out = {"no": _resume(rank, f"{root}/fp32", "no", save_at=(STOP_LATE,), total_limit=2),
           "bf16": _resume(rank, f"{root}/bf16", "bf16")}
    for value in out.values():
        del value["acc"]
    out["listing"] = sorted(p.name for p in Path(root, "fp32", "checkpoints").iterdir())
    return out


def _corrupt(directory: Path, relpath: str) -> None:
    path = directory / relpath
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _bad_copies(acc: Any, root: str, source: str) -> dict[str, Path]:
    """Damaged copies of ``source`` (made by rank 0): one per component."""
    bad = {"rng": Path(root, "bad_rng"), "opt": Path(root, "bad_opt")}
    if acc.is_main_process:
        for where in bad.values():
            shutil.copytree(source, where)
        (bad["rng"] / "rank_1" / "rng.json").unlink()
        _corrupt(bad["opt"], "optimizer_0.safetensors")
    acc.wait_for_everyone()
    return bad


def _try_load(acc: Any, directory: Path, strict: bool) -> tuple[str, list[str]]:
    from accel.checkpoint import CheckpointError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            acc.load_state(str(directory), strict=strict)
            outcome = "ok"
        except CheckpointError as exc:
            outcome = f"CheckpointError: {exc}"
    return outcome, [str(w.message) for w in caught if "load_state" in str(w.message)]


def _resumed_late(rank: int, root: str) -> dict[str, Any]:
    """Resume from the step-12 checkpoint, save at an epoch boundary with total_limit=1, then
    load damaged copies: strict raises on every rank, strict=False warns where affected."""
    out = _resume(rank, f"{root}/fp32", "no", save_at=(STOP_BOUNDARY,), total_limit=1)
    run_acc = out.pop("acc")
    listing = sorted(p.name for p in Path(root, "fp32", "checkpoints").iterdir())
    bad = _bad_copies(run_acc, root, out["saved"][0])
    out["strict"] = {name: _try_load(run_acc, path, True) for name, path in bad.items()}
    out["lenient"] = {name: _try_load(run_acc, path, False) for name, path in bad.items()}
    out["diverged"] = _diverged_load(run_acc, rank, out["saved"][0])
    return {**out, "listing": listing}


def _diverged_load(acc: Any, rank: int, path: str) -> str:
    """Rank 1 sees another checkpoint under the same name (no shared filesystem)."""
    import dataclasses

    from accel.checkpoint.protocol import load

    original = load.read_manifest
    if rank == 1:
        load.read_manifest = lambda p: dataclasses.replace(  # type: ignore[assignment]
            original(p), created="1970-01-01T00:00:00+00:00")
    try:
        return _try_load(acc, Path(path), True)[0]
    finally:
        load.read_manifest = original


def _first_batches(loader: Any, n: int) -> list[np.ndarray]:
    it = iter(loader)
    batches = [next(it)[0].numpy() for _ in range(n)]
    it.close()
    return batches


def _one_process(rank: int, root: str) -> dict[str, Any]:
    """A 2-process checkpoint loaded by 1 process: tensors equal, one warning, data position
    converted (2 batches of 4 per round become 1 batch of 4 twice)."""
    from accel.checkpoint import load_tensors, read_state

    run = _build(rank, f"{root}/fp32", "no")
    acc, loader = run["acc"], run["loader"]
    ckpts = Path(root, "fp32", "checkpoints")
    acc.load_state(str(ckpts / "checkpoint_1"))  # mid epoch 2
    mid = _first_batches(loader, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = Path(acc.load_state())  # the newest: checkpoint_2, end of epoch 2
    model = acc.unwrap_model(run["model"]).state_dict()
    saved = load_tensors(loaded, "model_0.safetensors")
    opt_saved, opt_now = read_state(loaded, "optimizer_0"), run["opt"].state_dict()
    same = (saved.keys() == model.keys() and all(torch.equal(saved[k], model[k]) for k in saved)
            and opt_saved["param_groups"] == opt_now["param_groups"]
            and all(torch.equal(opt_saved["state"][p][k], opt_now["state"][p][k])
                    for p in opt_now["state"] for k in opt_now["state"][p]))
    boundary = _first_batches(loader, 2)
    new = acc.save_state(total_limit=1)
    return {"loaded": loaded.name, "same": same, "counter": run["counter"].step,
            "warnings": [str(w.message) for w in caught], "mid": mid, "boundary": boundary,
            "saved": Path(new).name, "listing": sorted(p.name for p in ckpts.iterdir())}


def _bits(array: np.ndarray) -> bytes:
    """Bit-exact identity (also tells -0.0 from 0.0 and compares NaNs)."""
    return array.dtype.str.encode() + str(array.shape).encode() + array.tobytes()


def _same_run(ref: dict[str, Any], got: dict[str, Any], start: int) -> None:
    assert len(got["losses"]) == TOTAL - start
    for i, (a, b) in enumerate(zip(ref["batches"][start:], got["batches"])):
        assert np.array_equal(a, b), f"step {start + i}: batch {b.tolist()} != {a.tolist()}"
    for i, (a, b) in enumerate(zip(ref["losses"][start:], got["losses"])):
        assert _bits(a) == _bits(b), (
            f"step {start + i} (resumed at {start}): losses {b.tolist()} != {a.tolist()}; if the "
            "batches match, a random op differs: see test_prepared_loader_leaves_the_global_rng_"
            "alone in tests/unit/accelerator/test_state_checkpoint.py")
    assert ref["params"].keys() == got["params"].keys()
    for k in ref["params"]:
        assert _bits(ref["params"][k]) == _bits(got["params"][k]), f"parameter {k} differs"
    assert ref["lr"] == got["lr"] and ref["epoch"] == got["epoch"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The whole chain of jobs; each test below checks one aspect of it."""
    root = str(tmp_path_factory.mktemp("resume"))
    out: dict[str, Any] = {"ref": run_workers(_uninterrupted, 2, args=(root,))[0]}
    out["first"] = run_workers(_interrupted, 2, args=(root,))[0]
    out["resumed"] = run_workers(_resumed_first, 2, args=(root,))[0]
    out["late"] = run_workers(_resumed_late, 2, args=(root,))
    out["one"] = run_workers(_one_process, 1, args=(root,))[0]
    return out


def test_exact_resume_mid_epoch_and_later_epochs(runs: dict[str, Any]) -> None:
    ref, first, resumed, late = runs["ref"], runs["first"], runs["resumed"], runs["late"][0]
    for mp in ("no", "bf16"):  # a run that saves matches the uninterrupted one up to its stop
        stop = len(first[mp]["losses"])
        assert all(_bits(a) == _bits(b) for a, b in zip(ref[mp]["losses"], first[mp]["losses"]))
        assert stop in (STOP_EARLY, STOP_BOUNDARY)
    assert (resumed["no"]["start"], resumed["bf16"]["start"]) == (STOP_EARLY, STOP_BOUNDARY)
    assert late["start"] == STOP_LATE
    _same_run(ref["no"], resumed["no"], STOP_EARLY)  # mid epoch 0, also saves at step 12
    _same_run(ref["no"], late, STOP_LATE)  # mid epoch 2
    _same_run(ref["bf16"], resumed["bf16"], STOP_BOUNDARY)  # bf16, at an epoch boundary


def test_automatic_naming_and_rotation(runs: dict[str, Any]) -> None:
    first, resumed, late, one = runs["first"], runs["resumed"], runs["late"][0], runs["one"]
    assert Path(first["no"]["saved"][0]).name == "checkpoint_0"
    assert Path(resumed["no"]["loaded"]).name == "checkpoint_0"
    assert [Path(p).name for p in resumed["no"]["saved"]] == ["checkpoint_1"]  # numbering goes on
    assert resumed["listing"] == ["checkpoint_0", "checkpoint_1"]  # total_limit=2
    assert Path(late["loaded"]).name == "checkpoint_1"  # load_state(): the newest complete
    # total_limit=1 deleted checkpoint_0, kept checkpoint_1 (just loaded) and checkpoint_2 (new)
    assert [Path(p).name for p in late["saved"]] == ["checkpoint_2"]
    assert late["listing"] == ["checkpoint_1", "checkpoint_2"]
    assert one["saved"] == "checkpoint_3"
    assert one["listing"] == ["checkpoint_2", "checkpoint_3"]


def test_strict_loading_fails_on_every_rank(runs: dict[str, Any]) -> None:
    """A missing rank_1 RNG file or a corrupt optimizer file raises on both ranks (rank 0 is not
    left waiting for rank 1); strict=False warns only on the ranks that were affected. Ranks
    that read different checkpoints under one name raise instead of training on."""
    for rank, result in enumerate(runs["late"]):
        rng_outcome, _ = result["strict"]["rng"]
        assert rng_outcome.startswith("CheckpointError") and "rank_1/rng.json" in rng_outcome
        opt_outcome, _ = result["strict"]["opt"]
        assert "optimizer_0.safetensors" in opt_outcome and "corrupt" in opt_outcome
        assert result["lenient"]["rng"][0] == "ok" and result["lenient"]["opt"][0] == "ok"
        rng_warned = result["lenient"]["rng"][1]
        assert len(rng_warned) == rank and all("rank_1/rng" in w for w in rng_warned)
        opt_warned = result["lenient"]["opt"][1]
        assert len(opt_warned) == 1 and "optimizer_0.safetensors" in opt_warned[0]
        assert "ranks loaded different checkpoints" in result["diverged"], result["diverged"]


def test_two_process_checkpoint_loads_in_one_process(runs: dict[str, Any]) -> None:
    one, ref = runs["one"], runs["ref"]["no"]
    assert one["loaded"] == "checkpoint_2" and one["counter"] == STOP_BOUNDARY
    assert one["same"], "model/optimizer tensors differ from the saved ones"
    assert len(one["warnings"]) == 1 and "written by 2 process(es)" in one["warnings"][0]
    # the data position carries over: one rank now yields what both ranks would have
    assert np.array_equal(np.concatenate(one["mid"]), ref["batches"][STOP_LATE])
    assert np.array_equal(np.concatenate(one["boundary"]), ref["batches"][STOP_BOUNDARY])
