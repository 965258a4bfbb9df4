"""``save_state(blocking=False)`` with 2 real processes (one spawn checks everything).

- A DDP training loop with a collective between saves runs twice from the same start: with
  blocking saves and with non-blocking ones. Every non-blocking checkpoint is complete and
  holds the same files, byte for byte, as the blocking one of the same step (same sha256 in
  the manifest; only the creation time differs), and training ends with the same parameters.
- The background thread never issues a collective on the training group (every torch
  collective is watched on both ranks); its exchanges go over the separate gloo group.
- A failure of the background write on rank 1 only is raised, with the cause, by the next
  wait point on both ranks, and leaves no checkpoint.
- Under ``if accelerator.is_main_process:`` a non-blocking save blocks, with one warning.
- Ranks that pass different ``blocking`` follow the main process (a warning on the others).
- FSDP (a second spawn): FULL_STATE_DICT saves without blocking, byte-equal to a blocking
  save of the same state; SHARDED_STATE_DICT (DCP) is refused on every rank, saying what works.

The kill drill (a rank SIGKILLed during the background write, ``accel launch --max_restarts``
resuming from the previous checkpoint): tests/e2e/test_async_checkpoint.py.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from tests.spawn import run_workers

SAVE_EVERY, STEPS = 2, 8
_WATCHED = ("all_gather_object", "broadcast_object_list", "gather_object", "all_reduce",
            "all_gather", "all_gather_into_tensor", "broadcast", "barrier", "reduce_scatter")


def _watch_collectives(calls: list[tuple[str, str, bool]]) -> None:
    """Record (function, thread, on the training group) for every torch collective."""
    import torch.distributed as dist

    for name in _WATCHED:
        original = getattr(dist, name)

        def spy(*args: Any, __fn: Any = original, __name: str = name, **kwargs: Any) -> Any:
            group = kwargs.get("group")
            training = group is None or group is dist.group.WORLD
            calls.append((__name, threading.current_thread().name, training))
            return __fn(*args, **kwargs)

        setattr(dist, name, spy)


def _train(acc: Any, model: Any, opt: Any, rank: int, root: str, mode: str) -> list[str]:
    paths = []
    for step in range(1, STEPS + 1):
        g = torch.Generator().manual_seed(1000 * rank + step)
        x = torch.randn(8, 16, generator=g)
        loss = nn.functional.mse_loss(model(x), x[:, :4].sum(dim=1, keepdim=True))
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        acc.gather(loss.detach())  # a collective on the training group between two saves
        if step % SAVE_EVERY == 0:
            paths.append(acc.save_state(f"{root}/{mode}/step_{step}",
                                        blocking=mode == "blocking"))
    return paths


def _job(rank: int, root: str) -> dict[str, Any]:
    import accel.checkpoint.protocol.save as save_mod
    from accel import Accelerator
    from accel.checkpoint import CheckpointError, CheckpointWriter, is_complete

    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.01))
    acc.save_state(f"{root}/init")
    calls: list[tuple[str, str, bool]] = []
    _watch_collectives(calls)
    out: dict[str, Any] = {}
    for mode in ("blocking", "non_blocking"):
        acc.load_state(f"{root}/init")
        out[mode] = _train(acc, model, opt, rank, root, mode)
        out[f"{mode}_returned_complete"] = all(is_complete(p) for p in out[mode][:-1])
        acc.wait_for_checkpoint()
        out[f"{mode}_params"] = [p.detach().numpy().copy() for p in model.parameters()]
    out["calls"] = calls

    # a background failure on rank 1 only: raised on both ranks at the next wait point
    class FullDisk(CheckpointWriter):
        def wait(self) -> Any:
            super().wait()
            raise OSError(28, "No space left on device (injected on rank 1)")

    if rank == 1:
        save_mod.CheckpointWriter = FullDisk  # type: ignore[misc]
    out["failed_path"] = acc.save_state(f"{root}/failed", blocking=False)
    try:
        acc.wait_for_checkpoint()
        out["failure"] = None
    except CheckpointError as exc:
        out["failure"] = f"{exc} | cause: {exc.__cause__}"
    save_mod.CheckpointWriter = CheckpointWriter  # type: ignore[misc]

    # ranks that disagree follow the main process (a warning on the other), never hang
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mixed = acc.save_state(f"{root}/mixed", blocking=rank == 1)
        out["mixed_in_flight"] = acc._run.saves.pending is not None
        out["mixed_done"] = acc.wait_for_checkpoint() == mixed and is_complete(mixed)
    out["mixed_warnings"] = [str(w.message) for w in caught]

    # the diffusers pattern: the main process alone blocks (one warning), rank 1 goes on
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(2):
            if acc.is_main_process:
                path = acc.save_state(f"{root}/main_only_{i}", blocking=False)
                out[f"main_only_{i}_complete_at_return"] = is_complete(path)
            _train_step(acc, model, opt)
    out["warnings"] = [str(w.message) for w in caught]
    acc.end_training()
    return out


def _train_step(acc: Any, model: Any, opt: Any) -> None:
    acc.backward(model(torch.ones(2, 16)).pow(2).mean())
    opt.step()
    opt.zero_grad()


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("async")
    return {"root": root, "ranks": run_workers(_job, 2, args=(str(root),), timeout=240)}


def test_non_blocking_checkpoints_equal_blocking_ones_byte_for_byte(job: dict[str, Any]) -> None:
    from accel.checkpoint import read_manifest, verify

    zero, one = job["ranks"]
    assert zero["non_blocking"] == one["non_blocking"]  # the same paths on both ranks
    assert len(zero["non_blocking"]) == STEPS // SAVE_EVERY
    for blocking, non_blocking in zip(zero["blocking"], zero["non_blocking"], strict=True):
        verify(non_blocking)
        a, b = read_manifest(Path(blocking)), read_manifest(Path(non_blocking))
        assert {k: (r.size, r.sha256) for k, r in a.files.items()} == \
            {k: (r.size, r.sha256) for k, r in b.files.items()}
        assert (a.step, a.world_size, a.meta) == (b.step, b.world_size, b.meta)
        assert "rank_1/rng.json" in b.files and "model_0.safetensors" in b.files
    for rank in (zero, one):
        assert rank["blocking_returned_complete"]
        for p, q in zip(rank["blocking_params"], rank["non_blocking_params"], strict=True):
            assert np.array_equal(p, q)
    leftovers = [p.name for p in (job["root"] / "non_blocking").iterdir()
                 if p.name.startswith(".")]
    assert leftovers == []


def test_the_background_thread_leaves_the_training_group_alone(job: dict[str, Any]) -> None:
    for rank in job["ranks"]:
        background = [c for c in rank["calls"] if c[1].startswith("accel-save-")]
        assert background, "the spy saw no background exchange: it watched nothing"
        assert [c for c in background if c[2]] == [], background
        assert {c[0] for c in background} == {"all_gather_object"}
        # every non-blocking save exchanged records and outcome on the side group
        assert len(background) >= 2 * (STEPS // SAVE_EVERY)


def test_a_background_failure_on_one_rank_raises_on_every_rank(job: dict[str, Any]) -> None:
    for rank in job["ranks"]:
        assert rank["failure"] is not None
        assert "No space left on device (injected on rank 1)" in rank["failure"]
        assert "rank 1 could not write its part" in rank["failure"]
    failed = Path(job["ranks"][0]["failed_path"])
    assert not failed.exists()
    assert [p for p in failed.parent.iterdir() if p.name.startswith(".tmp-failed")] == []


def test_ranks_that_disagree_follow_the_main_process(job: dict[str, Any]) -> None:
    zero, one = job["ranks"]
    assert zero["mixed_in_flight"] and one["mixed_in_flight"]  # rank 0 asked blocking=False
    assert zero["mixed_done"] and one["mixed_done"]
    assert zero["mixed_warnings"] == []
    assert len(one["mixed_warnings"]) == 1, one["mixed_warnings"]
    assert "rank 1: save_state(blocking=True) differs from the main process's blocking=False" \
        in one["mixed_warnings"][0]


def test_main_process_only_non_blocking_save_blocks_with_one_warning(job: dict[str, Any]
                                                                      ) -> None:
    zero, one = job["ranks"]
    assert zero["main_only_0_complete_at_return"] and zero["main_only_1_complete_at_return"]
    said = [w for w in zero["warnings"] if "blocking=False" in w]
    assert len(said) == 1 and "main process alone" in said[0], zero["warnings"]
    assert one["warnings"] == []


def _fsdp_job(rank: int, root: str) -> dict[str, Any]:
    """FSDP (fully_shard) through the protocol: FULL_STATE_DICT saves without blocking (the
    gathers run in the foreground); SHARDED_STATE_DICT is refused on every rank."""
    from accel.checkpoint import BackgroundSaves, CheckpointError, save_run
    from tests.distributed import _fsdp_ckpt_helpers as h
    from tests.distributed.test_fsdp_checkpoint import _start

    comm, group = _start()
    model, opt = h.build(2)
    h.train(model, opt, range(3), rank, 2)
    background = BackgroundSaves()
    save_run(comm, snap=h.snapshot(model, opt, h.ShardIO(False), 3), output_dir=f"{root}/blocking", total_limit=None, project_dir=None,
             project_total_limit=None)
    path = save_run(comm, snap=h.snapshot(model, opt, h.ShardIO(False), 3), output_dir=f"{root}/non_blocking",
                    total_limit=None, project_dir=None, project_total_limit=None, blocking=False, background=background)
    h.train(model, opt, range(3, 5), rank, 2)  # the parameters change while it is written
    out: dict[str, Any] = {"done": str(background.wait()) == str(path)}
    try:
        save_run(comm, snap=h.snapshot(model, opt, h.ShardIO(True), 5), output_dir=f"{root}/sharded", total_limit=None,
                 project_dir=None, project_total_limit=None, blocking=False, background=background)
        out["refused"] = None
    except CheckpointError as exc:
        out["refused"] = str(exc)
    out["after"] = h.train(model, opt, range(5, 6), rank, 2)  # no rank was left in a collective
    group.close()
    return out


def test_fsdp_full_state_saves_without_blocking_and_sharded_state_is_refused(
        tmp_path: Path) -> None:
    from accel.checkpoint import read_manifest, verify

    ranks = run_workers(_fsdp_job, 2, args=(str(tmp_path),), timeout=240)
    verify(tmp_path / "non_blocking")
    a, b = read_manifest(tmp_path / "blocking"), read_manifest(tmp_path / "non_blocking")
    assert {k: (r.size, r.sha256) for k, r in a.files.items()} == \
        {k: (r.size, r.sha256) for k, r in b.files.items()}
    assert "model_0.safetensors" in b.files and b.meta == a.meta
    for rank in ranks:
        assert rank["done"] and rank["refused"] is not None
        assert "SHARDED_STATE_DICT" in rank["refused"] and "FULL_STATE_DICT" in rank["refused"]
    assert not (tmp_path / "sharded").exists()
    assert [len(rank["after"]) for rank in ranks] == [1, 1]  # both trained on after it
