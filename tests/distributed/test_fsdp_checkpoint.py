"""Sharded checkpoints of FSDP runs, with real processes (gloo, CPU).

A 2-process FSDP run saves a SHARDED and a FULL checkpoint mid-training; runs of 1, 2 and 4
processes (and a plain process without a process group) load them: parameters and optimizer
state come back exactly, and the 2-process run resumes with bit-identical losses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.distributed import _fsdp_ckpt_helpers as h
from tests.spawn import run_workers

SAVE_AT, TOTAL = 3, 6


def _start() -> tuple[Any, Any]:
    from accel.device import select_device
    from accel.distributed import Communicator, build_context, start_process_group
    from accel.env import detect_launch

    info = detect_launch()
    device = select_device(cpu=True)
    ctx = build_context(info, device)
    group = start_process_group(ctx, info, device)
    return Communicator(ctx), group


def _save_and_continue(rank: int, root: str) -> dict[str, Any]:
    """2 processes: train, save SHARDED and FULL checkpoints at SAVE_AT, train on."""
    from accel.checkpoint import save_run

    comm, group = _start()
    world = comm.ctx.world_size
    model, opt = h.build(world)
    losses = h.train(model, opt, range(SAVE_AT), rank, world)
    sharded = save_run(comm, h.snapshot(model, opt, h.ShardIO(True), SAVE_AT),
                       f"{root}/sharded", None, None, None)
    full = save_run(comm, h.snapshot(model, opt, h.ShardIO(False), SAVE_AT), f"{root}/full",
                    None, None, None)
    saved = {"params": h.full_params(model), "opt": h.full_optimizer(model, opt)}
    losses += h.train(model, opt, range(SAVE_AT, TOTAL), rank, world)
    group.close()
    return {"losses": losses, "saved": saved, "paths": [str(sharded), str(full)]}


def _load_and_continue(rank: int, root: str) -> dict[str, Any]:
    """Any world size: load each checkpoint into a fresh sharded run, report what it holds
    (and, at 2 processes, the losses of the steps after it)."""
    from accel.checkpoint import load_run

    comm, group = _start()
    world = comm.ctx.world_size
    out: dict[str, Any] = {}
    for kind in ("sharded", "full", "plain"):  # plain: saved by one process without FSDP
        model, opt = h.build(world)
        io = h.ShardIO(kind != "full")
        loaded = load_run(comm, h.snapshot(model, opt, io), f"{root}/{kind}", None)
        assert loaded is not None and loaded.optimizer_steps == SAVE_AT
        out[kind] = {"params": h.full_params(model), "opt": h.full_optimizer(model, opt),
                     "lr": [g["lr"] for g in opt.param_groups]}
        if world == 2 and kind != "plain":
            out[kind]["losses"] = h.train(model, opt, range(SAVE_AT, TOTAL), rank, world)
    group.close()
    return out


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert np.array_equal(a[key], b[key]), key


def _plain_comm() -> Any:
    import torch

    from accel.distributed import Communicator, ProcessContext
    return Communicator(ProcessContext(0, 0, 1, 1, 0, torch.device("cpu"), "gloo", "none"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The 2-process checkpoints (sharded/, full/) and one of a plain process (plain/)."""
    from accel.checkpoint import save_run

    root = tmp_path_factory.mktemp("fsdp_ckpt")
    results = run_workers(_save_and_continue, 2, args=(str(root),))
    model, opt = h.build(None)
    h.train(model, opt, range(SAVE_AT), 0, 1)
    save_run(_plain_comm(), h.snapshot(model, opt, h.PlainIO(), SAVE_AT), root / "plain", None,
             None, None)
    plain = {"params": h.full_params(model), "opt": h.full_optimizer(model, opt)}
    return {"root": root, "results": results, "plain": plain}


def test_sharded_save_layout_is_pickle_free_and_listed(saved: dict[str, Any]) -> None:
    from accel.checkpoint import read_manifest, verify

    root = saved["root"]
    files = h.listing(root / "sharded")
    assert "manifest.json" in files and not any(".metadata" in f for f in files)
    assert [f for f in files if f.startswith("sharded/")] == [
        "sharded/model_0/shard-00001-model-00001-of-00001.safetensors",
        "sharded/model_0/shard-00002-model-00001-of-00001.safetensors",
        "sharded/optimizer_0/shard-00001-model-00001-of-00001.safetensors",
        "sharded/optimizer_0/shard-00002-model-00001-of-00001.safetensors"]
    assert "model_0.safetensors" not in files and "optimizer_0.json" in files
    manifest = verify(root / "sharded")  # every file listed with its hash, and intact
    assert sorted(manifest.files) == [f for f in files if f != "manifest.json"]
    assert set(manifest.meta["sharded"]["headers"]) == {f for f in files
                                                        if f.startswith("sharded/")}
    assert manifest.meta["optimizer_layout"] == "fqn"
    assert manifest.meta["counts"]["models"] == 1
    full = read_manifest(root / "full")
    assert "model_0.safetensors" in full.files and "sharded" not in full.meta
    assert not any(f.startswith("sharded/") for f in full.files)
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []


def test_resume_at_the_same_world_size_is_exact(saved: dict[str, Any]) -> None:
    results = run_workers(_load_and_continue, 2, args=(str(saved["root"]),))
    for rank, result in enumerate(results):
        reference = saved["results"][rank]
        for kind in ("sharded", "full"):
            assert result[kind]["losses"] == reference["losses"][SAVE_AT:], kind
            _same(result[kind]["params"], reference["saved"]["params"])
            _same(result[kind]["opt"], reference["saved"]["opt"])
        _same(result["plain"]["params"], saved["plain"]["params"])
        _same(result["plain"]["opt"], saved["plain"]["opt"])


@pytest.mark.parametrize("world", [1, 4])
def test_load_at_another_world_size(saved: dict[str, Any], world: int) -> None:
    results = run_workers(_load_and_continue, world, args=(str(saved["root"]),))
    for result in results:
        for kind in ("sharded", "full", "plain"):
            reference = saved["plain"] if kind == "plain" else saved["results"][0]["saved"]
            _same(result[kind]["params"], reference["params"])
            _same(result[kind]["opt"], reference["opt"])
            assert result[kind]["lr"] == [0.01]


def test_plain_process_loads_a_sharded_checkpoint(saved: dict[str, Any]) -> None:
    """No process group, no FSDP: DCP reads the shards whole; the optimizer state goes back
    to torch's numbering."""
    from accel.checkpoint import load_run

    reference = saved["results"][0]["saved"]
    for kind in ("sharded", "full"):
        model, opt = h.build(None)
        with pytest.warns(UserWarning, match="written by 2 process"):
            load_run(_plain_comm(), h.snapshot(model, opt, h.PlainIO()), saved["root"] / kind,
                     None)
        _same(h.full_params(model), reference["params"])
        _same(h.full_optimizer(model, opt), reference["opt"])
        assert sorted(opt.state_dict()["state"]) == list(range(len(list(model.parameters()))))


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("where", "offset"), [("model_0", -3), ("model_0", 20),
                                               ("optimizer_0", -3)])
def test_damaged_shards_are_refused_before_use(saved: dict[str, Any], tmp_path: Path,
                                               where: str, offset: int) -> None:
    """A flipped bit in a shard's data (or its header) fails the hash checks: the load
    raises naming the file, and no damaged value reaches the model."""
    import shutil
    import warnings

    from accel.checkpoint import CheckpointError, load_run

    copy = tmp_path / "copy"
    shutil.copytree(saved["root"] / "sharded", copy)
    shard = copy / "sharded" / where / "shard-00002-model-00001-of-00001.safetensors"
    _flip(shard, offset)
    model, opt = h.build(None)
    before = h.full_params(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CheckpointError, match=f"{where}/shard-00002.*corrupt"):
            load_run(_plain_comm(), h.snapshot(model, opt, h.PlainIO()), copy, None)
    if where == "model_0":
        _same(h.full_params(model), before)
