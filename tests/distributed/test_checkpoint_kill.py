"""Checkpoint drills with real processes.

- SIGKILL at random moments of a save loop (many trials): every visible ``checkpoint_<n>`` is
  always complete and verifies, ``latest_complete`` always points at a loadable checkpoint whose
  contents match its manifest's step, and leftovers of killed saves are cleaned up later.
- Two ranks write one checkpoint into the same temporary directory; rank 0 finalizes it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import torch

from accel.checkpoint import (
    CheckpointWriter,
    FileRecord,
    checkpoint_number,
    latest_complete,
    load_component,
    next_checkpoint_name,
    read_manifest,
    read_state,
    rotate,
    verify,
)
from tests.spawn import run_workers

_NUMEL = 2_500_000  # 10 MB per tensor file: one save takes ~0.1 s on a 2-core machine


def _save_loop(root: str, ready: Any, saved: Any) -> None:
    """Child: write checkpoints forever (resuming the step count), rotating to two."""
    root_path = Path(root)
    latest = latest_complete(root_path)
    step = read_manifest(latest).step if latest else 0
    ready.set()
    while True:
        step += 1
        writer = CheckpointWriter(next_checkpoint_name(root_path))
        writer.write_tensors("model.safetensors", {"w": torch.full((_NUMEL,), float(step)),
                                                   "step": torch.tensor(step)})
        writer.write_state("optimizer", {"state": {0: {"exp_avg": torch.full((_NUMEL,), -step)}},
                                         "param_groups": [{"lr": 0.1, "params": [0]}]})
        writer.write_state("rng/rank_0", {"python": random.getstate(), "step": step})
        writer.write_json("loader/rank_0.json", {"step": step})
        writer.finalize(step=step, world_size=1, meta={"step": step})
        with saved.get_lock():
            saved.value += 1
        rotate(root_path, total_limit=2)


def _check_latest(root: Path, verified: set[tuple[str, int]]) -> int:
    visible = [p for p in root.iterdir() if not p.name.startswith(".")]
    for path in visible:  # no visible name is ever an incomplete checkpoint
        key = (path.name, read_manifest(path).step)
        if key not in verified:  # checkpoints are immutable: hash each one once
            verify(path)
            verified.add(key)
    latest = latest_complete(root)
    if latest is None:
        assert visible == [], visible
        return 0
    manifest = read_manifest(latest)
    step = manifest.step
    model = load_component(latest, "model.safetensors", manifest)
    assert model["step"].item() == step and bool((model["w"] == step).all())
    optimizer = read_state(latest, "optimizer", manifest)
    assert bool((optimizer["state"][0]["exp_avg"] == -step).all())
    assert read_state(latest, "rng/rank_0", manifest)["step"] == step
    assert load_component(latest, "loader/rank_0.json", manifest) == {"step": step}
    assert manifest.meta == {"step": step}
    return step


def test_sigkill_at_random_moments_never_leaves_a_bad_latest(tmp_path: Path) -> None:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "accel"])
    root = tmp_path / "checkpoints"
    root.mkdir()
    rng = random.Random(20261122)
    killed_mid_save = 0
    previous = 0
    saved = ctx.Value("i", 0)
    verified: set[tuple[str, int]] = set()
    for trial in range(30):
        ready = ctx.Event()
        proc = ctx.Process(target=_save_loop, args=(str(root), ready, saved), daemon=True)
        proc.start()
        assert ready.wait(60), "the save loop did not start"
        if trial == 0:  # one save completes before the first kill, however slow the machine
            deadline = time.monotonic() + 60
            while saved.value == 0 and time.monotonic() < deadline and proc.is_alive():
                time.sleep(0.01)
            assert saved.value > 0, "the first save did not complete within 60 s"
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        assert proc.exitcode == -signal.SIGKILL
        killed_mid_save += any(p.name.startswith((".tmp-", ".old-")) for p in root.iterdir())
        step = _check_latest(root, verified)
        assert step >= previous, f"latest went back from step {previous} to {step}"
        previous = step
    assert previous > 0, "no save ever completed: the drill tested nothing"
    # the drill is meaningful only if kills landed inside saves (temp dirs were left behind)
    assert killed_mid_save > 0, "no kill interrupted a save"
    rotate(root, total_limit=2)
    newest = checkpoint_number(latest_complete(root) or "")
    assert newest is not None
    stale = [p.name for p in root.iterdir() if p.name.startswith(".")
             and int(p.name.split("_")[1].split("-")[0]) <= newest]
    assert stale == [], f"leftovers of killed saves were not cleaned: {stale}"


def _two_rank_worker(rank: int, target: str) -> dict[str, Any]:
    import torch.distributed as dist

    from accel.checkpoint import finalize, new_token, temp_dir_for, write_state, write_tensors
    from accel.device import select_device
    from accel.distributed import Communicator, build_context, start_process_group
    from accel.env import detect_launch

    info = detect_launch()
    device = select_device(cpu=True)
    ctx = build_context(info, device)
    group = start_process_group(ctx, info=info, device=device)
    comm = Communicator(ctx)
    token = comm.broadcast_object_list([new_token() if rank == 0 else None])[0]
    tmpdir = temp_dir_for(target, token)
    tmpdir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(100 + rank)
    rng = torch.get_rng_state()
    records = write_state(tmpdir, f"rng/rank_{rank}", {"torch": rng, "rank": rank})
    if rank == 0:
        records["model.safetensors"] = write_tensors(tmpdir, relpath="model.safetensors",
                                                     tensors={"w": torch.arange(4.0)})
    comm.barrier()
    gathered = comm.gather_object({rel: rec.to_json() for rel, rec in records.items()})
    if rank == 0:
        merged = {rel: FileRecord.from_json(rec) for part in gathered for rel, rec in part.items()}
        finalize(tmpdir, target=target, step=7, world_size=ctx.world_size, records=merged)
    comm.barrier()
    manifest = read_manifest(target)
    mine = read_state(target, f"rng/rank_{rank}", manifest)
    out = {"files": sorted(manifest.files), "world": manifest.world_size,
           "rank_ok": mine["rank"] == rank and torch.equal(mine["torch"], rng),
           "verified": verify(target).step}
    dist.barrier()
    group.close()
    return out


def test_two_ranks_write_one_checkpoint(tmp_path: Path) -> None:
    target = str(tmp_path / "checkpoint_0")
    results = run_workers(_two_rank_worker, 2, args=(target,))
    for result in results:
        assert result["files"] == ["model.safetensors", "rng/rank_0.json",
                                   "rng/rank_0.safetensors", "rng/rank_1.json",
                                   "rng/rank_1.safetensors"]
        assert result["world"] == 2 and result["rank_ok"] and result["verified"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_0"]


_SHARDED_DIM = 512  # 2 x 512 x 512 floats, 2 MB per model state; a 2-rank save takes ~50 ms


def _sharded_save_loop(rank: int, env: dict[str, str], root: str, ready: Any, saved: Any
                       ) -> None:
    """Rank of a 2-process FSDP job: save sharded checkpoints forever, each holding its step
    in every parameter (``step``) and momentum buffer (``-step``), rotating to two."""
    os.environ.update(env)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from accel.checkpoint import save_run
    from tests.distributed import _fsdp_ckpt_helpers as h
    from tests.distributed.test_fsdp_checkpoint import _start

    comm, _group = _start()
    model = torch.nn.Sequential(*(torch.nn.Linear(_SHARDED_DIM, _SHARDED_DIM) for _ in range(2)))
    fully_shard(model, mesh=init_device_mesh("cpu", (comm.ctx.world_size,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    latest = latest_complete(Path(root) / "checkpoints")
    step = read_manifest(latest).step if latest else 0
    comm.barrier()
    if rank == 0:
        ready.set()
    while True:
        step += 1
        with torch.no_grad():
            for param in model.parameters():
                param.fill_(float(step))
                opt.state[param]["momentum_buffer"] = torch.full_like(param, -float(step))
        save_run(comm, snap=h.snapshot(model, opt, h.ShardIO(True), step), output_dir=None, total_limit=None, project_dir=root, project_total_limit=2)
        if rank == 0:
            with saved.get_lock():
                saved.value += 1


def _load_latest_sharded(root: Path) -> int:
    """What load_state() would pick: it loads (no process group) and holds its own step."""
    import warnings

    from accel.checkpoint import load_run
    from accel.distributed import Communicator, ProcessContext
    from tests.distributed import _fsdp_ckpt_helpers as h

    visible = [p for p in (root / "checkpoints").iterdir() if not p.name.startswith(".")]
    latest = latest_complete(root / "checkpoints")
    if latest is None:
        assert visible == [], visible
        return 0
    for path in visible:
        verify(path)
    model = torch.nn.Sequential(*(torch.nn.Linear(_SHARDED_DIM, _SHARDED_DIM) for _ in range(2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    comm = Communicator(ProcessContext.single())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "written by 2 process(es)": expected here
        loaded = load_run(comm, snap=h.snapshot(model, opt, h.PlainIO()), input_dir=None, project_dir=root)
    assert loaded is not None and loaded.path == latest
    step = read_manifest(latest).step
    for param in model.parameters():
        assert bool((param == step).all())
        assert bool((opt.state[param]["momentum_buffer"] == -step).all())
    return step


def test_sigkill_during_sharded_saves_never_leaves_a_bad_latest(tmp_path: Path) -> None:
    """Both ranks of a sharded (DCP) save loop are killed at random moments; load_state()'s
    pick is always complete and loads, and leftovers are cleaned by the next rotation."""
    from tests.spawn import free_port, torchrun_env

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "accel"])
    rng = random.Random(20261123)
    saved = ctx.Value("i", 0)
    killed_mid_save, previous = 0, 0
    for trial in range(10):
        ready, port = ctx.Event(), free_port()
        procs = [ctx.Process(target=_sharded_save_loop, daemon=True,
                             args=(rank, torchrun_env(rank, 2, port), str(tmp_path), ready,
                                   saved))
                 for rank in range(2)]
        for proc in procs:
            proc.start()
        assert ready.wait(90), "the sharded save loop did not start"
        if trial == 0:  # one save completes before the first kill, however slow the machine
            deadline = time.monotonic() + 60
            while saved.value == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert saved.value > 0, "the first sharded save did not complete within 60 s"
        time.sleep(rng.uniform(0.0, 0.4))
        for proc in procs:
            os.kill(proc.pid, signal.SIGKILL)
        for proc in procs:
            proc.join(10)
        killed_mid_save += any(p.name.startswith(".tmp-")
                               for p in (tmp_path / "checkpoints").iterdir())
        step = _load_latest_sharded(tmp_path)
        assert step >= previous, f"latest went back from step {previous} to {step}"
        previous = step
    assert previous > 0 and killed_mid_save > 0, (previous, killed_mid_save)
