"""``save_state`` / ``save_model`` / ``save`` under ``if accelerator.is_main_process:``.

The diffusers scripts save on the main process only; Accelerate's save is not collective for
DDP, so that works there. Here rank 0 finds out through the store that rank 1 went on (it took
its next batch, or entered ``wait_for_everyone``) and saves alone; the checkpoint loads in a
new 2-process job with one warning, and rank 1 trains on from rank 0's loader position. A
save that every rank calls, rank 1 arriving seconds late, stays a full collective save.

Two spawns (a save job, then a load job), each checking many things.
"""

from __future__ import annotations

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

LATE_SECONDS = 3.0  # rank 1 arrives this late at a save that every rank calls
SECOND_LATE_SECONDS = 1.0  # ... and this late at the second Accelerator's save


def _setup(rank: int) -> tuple[Any, ...]:
    from accel import Accelerator, DataLoaderConfiguration

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    data = TensorDataset(torch.arange(64), x, x.sum(dim=1, keepdim=True))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    # exact resume (loader positions restored), so that rank 1's loader can be checked
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        use_stateful_dataloader=True))
    torch.manual_seed(100 + rank)  # each rank its own RNG stream
    model, opt, loader, sched = acc.prepare(model, opt, DataLoader(data, 4, shuffle=True), sched)
    return acc, model, opt, iter(loader), sched


def _steps(acc: Any, model: Any, opt: Any, it: Any, sched: Any, n: int) -> list[list[int]]:
    seen = []
    for _ in range(n):
        idx, x, y = next(it)
        acc.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
        sched.step()
        opt.zero_grad()
        seen.append(idx.tolist())
    return seen


def _state(acc: Any, model: Any, opt: Any, sched: Any) -> dict[str, Any]:
    """What must come back exactly (numpy: tensors would travel through shared memory)."""
    params = {k: v.detach().numpy().copy() for k, v in acc.unwrap_model(model).state_dict().items()}
    moments = [s["exp_avg"].numpy().copy() for s in opt.state_dict()["state"].values()]
    return {"params": params, "moments": moments, "lr": sched.get_last_lr()}


def _recorded(fn: Any) -> tuple[Any, list[str], float]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        value = fn()
        took = time.perf_counter() - start
    return value, [str(w.message) for w in caught], took


def _save_job(rank: int, root: str) -> dict[str, Any]:
    acc, model, opt, it, sched = _setup(rank)
    out: dict[str, Any] = {"warnings": []}
    _steps(acc, model, opt, it, sched, 2)
    # 1. every rank calls save_state, rank 1 seconds late: still one collective save
    if rank == 1:
        time.sleep(LATE_SECONDS)
    rng_at_late = torch.get_rng_state().numpy().copy()
    _, said, _ = _recorded(lambda: acc.save_state(f"{root}/late"))
    out["warnings"] += said
    out["late_rng"] = rng_at_late
    _steps(acc, model, opt, it, sched, 1)
    # 2. the diffusers pattern: rank 1 goes on to its next batch while rank 0 saves
    if acc.is_main_process:
        out["main_only_state"] = _state(acc, model, opt, sched)
        path, said, out["main_only_s"] = _recorded(lambda: acc.save_state(f"{root}/main_only"))
        out["warnings"] += said
        out["main_only_path"] = path
    out["after_main_only"] = _steps(acc, model, opt, it, sched, 2)
    # 3. save_model, save and save_state on the main process, rank 1 in wait_for_everyone
    if acc.is_main_process:
        out["model_state"] = _state(acc, model, opt, sched)["params"]
        acc.save_model(model, f"{root}/model")
        acc.save({"step": torch.tensor(5)}, f"{root}/extra.pt")
        _, said, out["barrier_s"] = _recorded(lambda: acc.save_state(f"{root}/main_barrier"))
        out["warnings"] += said
    acc.wait_for_everyone()
    out["trained_on"] = _steps(acc, model, opt, it, sched, 1)
    acc.end_training()
    # 4. a second Accelerator in the same process (a notebook cell run again): what the first
    # one's monitor published (its end above) must not speak for the second; rank 1 comes late,
    # so rank 0 reads rank 1's progress before rank 1 arrives
    acc, model, opt, it, sched = _setup(rank)
    _steps(acc, model, opt, it, sched, 1)
    if rank == 1:
        time.sleep(SECOND_LATE_SECONDS)
    _, said, _ = _recorded(lambda: acc.save_state(f"{root}/second_accelerator"))
    out["warnings"] += said
    acc.end_training()
    return out


def _load_job(rank: int, root: str) -> dict[str, Any]:
    from accel.checkpoint import read_manifest
    from accel.run import rng

    acc, model, opt, it, sched = _setup(rank)
    _, said, _ = _recorded(lambda: acc.load_state(f"{root}/main_only"))
    out: dict[str, Any] = {"warnings": said, "state": _state(acc, model, opt, sched)}
    step = read_manifest(Path(root, "main_only")).step
    out["seeded_from_step"] = torch.initial_seed() == rng.rank_seed(step, rank)
    out["next_batches"] = _steps(acc, model, opt, it, sched, 2)  # rank 1 trains on
    out["same_params"] = [float(p.detach().abs().sum()) for p in model.parameters()]
    _, out["late_warnings"], _ = _recorded(lambda: acc.load_state(f"{root}/late"))
    out["late_rng"] = torch.get_rng_state().numpy().copy()
    acc.load_model(model, f"{root}/model")
    out["model_state"] = _state(acc, model, opt, sched)["params"]
    acc.end_training()
    return out


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = str(tmp_path_factory.mktemp("main_only"))
    saved = run_workers(_save_job, 2, args=(root,), timeout=240)
    loaded = run_workers(_load_job, 2, args=(root,), timeout=240)
    return {"root": Path(root), "saved": saved, "loaded": loaded}


def test_main_only_save_state_completes_and_records_what_is_absent(jobs: dict[str, Any]) -> None:
    from accel.checkpoint import read_manifest, verify

    zero, one = jobs["saved"]
    # decided because rank 1 was seen going on (a decision by the clock would have warned)
    assert zero["warnings"] == [] and one["warnings"] == []
    assert zero["main_only_path"] == str(jobs["root"] / "main_only")
    for name in ("main_only", "main_barrier"):
        manifest = read_manifest(jobs["root"] / name)
        verify(jobs["root"] / name)
        assert manifest.world_size == 2 and manifest.meta["absent_rank_states"] == [1]
        assert "rank_0/rng.json" in manifest.files
        assert not [f for f in manifest.files if f.startswith("rank_1/")]
    print(f"main-only save_state: {zero['main_only_s']:.3f} s (rank 1 took its next batch), "
          f"{zero['barrier_s']:.3f} s (rank 1 in wait_for_everyone)")


def test_late_rank_still_makes_a_full_collective_save(jobs: dict[str, Any]) -> None:
    from accel.checkpoint import read_manifest

    manifest = read_manifest(jobs["root"] / "late")
    assert "absent_rank_states" not in manifest.meta
    assert {"rank_0/rng.json", "rank_1/rng.json", "rank_1/loaders.json"} <= set(manifest.files)
    for saved, loaded in zip(jobs["saved"], jobs["loaded"], strict=True):
        np.testing.assert_array_equal(loaded["late_rng"], saved["late_rng"])  # each rank's own
        assert loaded["late_warnings"] == []


def test_a_second_accelerator_in_the_process_still_saves_with_every_rank(
        jobs: dict[str, Any]) -> None:
    from accel.checkpoint import read_manifest

    # without a namespace per Accelerator, rank 0 read the first Accelerator's "ended" as rank
    # 1's progress, saved alone, and rank 1 came late (with a warning)
    manifest = read_manifest(jobs["root"] / "second_accelerator")
    assert "absent_rank_states" not in manifest.meta
    assert {"rank_0/rng.json", "rank_1/rng.json"} <= set(manifest.files)
    assert all(saved["warnings"] == [] for saved in jobs["saved"])


def test_main_only_checkpoint_loads_with_one_warning_and_rank_1_trains_on(
        jobs: dict[str, Any]) -> None:
    zero, one = jobs["saved"]
    expected = zero["main_only_state"]
    for loaded in jobs["loaded"]:  # model, optimizer and scheduler exact on every rank
        for k, v in expected["params"].items():
            np.testing.assert_array_equal(loaded["state"]["params"][k], v)
        for got, want in zip(loaded["state"]["moments"], expected["moments"], strict=True):
            np.testing.assert_array_equal(got, want)
        assert loaded["state"]["lr"] == expected["lr"]
    said = [w for loaded in jobs["loaded"] for w in loaded["warnings"]]
    assert len(said) == 1 and "saved by the main process alone" in said[0], said
    assert "ranks [1]" in said[0] and jobs["loaded"][0]["warnings"] == said
    # rank 0 restored its own RNG; rank 1, which saved none, is seeded from the step
    assert not jobs["loaded"][0]["seeded_from_step"] and jobs["loaded"][1]["seeded_from_step"]
    # both ranks continue with the batches they took after the save in the first job
    assert [r["next_batches"] for r in jobs["loaded"]] == \
        [zero["after_main_only"], one["after_main_only"]]
    assert jobs["loaded"][0]["same_params"] == jobs["loaded"][1]["same_params"]


def test_main_only_save_model_and_save_load(jobs: dict[str, Any]) -> None:
    for loaded in jobs["loaded"]:
        for k, v in jobs["saved"][0]["model_state"].items():
            np.testing.assert_array_equal(loaded["model_state"][k], v)
    extra = torch.load(jobs["root"] / "extra.pt", weights_only=True)
    assert int(extra["step"]) == 5
