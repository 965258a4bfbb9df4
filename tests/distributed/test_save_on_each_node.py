"""``ProjectConfiguration(save_on_each_node=True)`` on two machines without a shared filesystem.

One job of 4 processes on 2 simulated machines (torchrun's variables: ``GROUP_RANK`` = machine,
``LOCAL_RANK`` 0 and 1 on each). Each machine's processes work in their own directory and use
relative paths, so the same path names a different directory on each machine, as on machines
with local disks. The job checks, in order:

1. with the flag: every machine holds a complete copy of each checkpoint (automatic names,
   ``total_limit`` rotation on each, a ``blocking=False`` save among them), ``save_model`` and
   ``save`` write on both machines, and ``load_state`` on each machine restores the run
   exactly (the resumed steps repeat the uninterrupted ones bit for bit);
2. with the flag on a directory that both machines share: one checkpoint, written once;
3. without the flag: only the main process's machine gets the checkpoint (complete: the other
   machine's ranks hand over their states), one warning names the flag, and ``load_state``
   raises on every rank, naming it.

A second job (2 machines of one process each) checks state sharded with FSDP: a copy per
machine cannot be complete, so those saves raise on every rank (no hang, nothing left behind),
while a directory both machines share, and a FULL_STATE_DICT save by the main machine alone,
still work, and ``save_model``'s weights (gathered a tensor at a time) land on both machines.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.distributed import _fsdp_ckpt_helpers as h
from tests.spawn import cpu_group, run_workers

WORLD, PER_MACHINE = 4, 2


def _two_machines(rank: int, world: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % PER_MACHINE),
            "LOCAL_WORLD_SIZE": str(PER_MACHINE), "GROUP_RANK": str(rank // PER_MACHINE),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def _setup(rank: int, project: str, each_node: bool) -> dict[str, Any]:
    from accel import Accelerator, DataLoaderConfiguration, ProjectConfiguration

    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 4, generator=g)
    data = TensorDataset(torch.arange(96), x, x.sum(dim=1, keepdim=True))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=project, total_limit=2, save_on_each_node=each_node),
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    torch.manual_seed(100 + rank)  # each rank its own RNG stream (dropout)
    model, opt, loader, sched = acc.prepare(model, opt, DataLoader(data, 4, shuffle=True), sched)
    return {"acc": acc, "model": model, "opt": opt, "loader": loader, "sched": sched,
            "it": iter(loader)}


def _steps(run: dict[str, Any], n: int) -> list[Any]:
    """n steps; what each saw and computed (the batch's indices and the loss's bits)."""
    acc, model, opt, sched = run["acc"], run["model"], run["opt"], run["sched"]
    seen = []
    for _ in range(n):
        idx, x, y = next(run["it"])
        loss = nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        seen.append((idx.tolist(), loss.detach().numpy().tobytes()))
    return seen


def _params(run: dict[str, Any]) -> dict[str, bytes]:
    return {k: v.detach().numpy().tobytes()
            for k, v in run["acc"].unwrap_model(run["model"]).state_dict().items()}


def _caught(fn: Any) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        value = fn()
    return value, [str(w.message) for w in said]


def _each_node_phase(run: dict[str, Any]) -> dict[str, Any]:
    acc = run["acc"]
    out: dict[str, Any] = {}
    _steps(run, 2)
    saved, said = _caught(lambda: [acc.save_state(), acc.save_state(blocking=False)])
    _steps(run, 1)
    saved.append(acc.save_state())  # waits for the background save first; rotation keeps 2
    out["saved"], out["save_warnings"] = saved, said
    out["after"], out["params_after"] = _steps(run, 3), _params(run)
    acc.save_model(run["model"], "model")
    acc.save({"w": torch.ones(2)}, "extra.safetensors")
    loaded, out["load_warnings"] = _caught(acc.load_state)
    run["it"] = iter(run["loader"])  # the loader resumes where the checkpoint left it
    out["loaded"], out["again"], out["params_again"] = loaded, _steps(run, 3), _params(run)
    return out


def _job(rank: int, root: str) -> dict[str, Any]:
    machine = Path(root, f"machine{rank // PER_MACHINE}")
    machine.mkdir(exist_ok=True)
    os.chdir(machine)  # this machine's disk: relative paths land here
    run = _setup(rank, "proj", each_node=True)
    out = _each_node_phase(run)
    os.chdir(Path(root, "shared"))  # a directory both machines see
    acc = run["acc"]
    out["shared"], out["shared_warnings"] = _caught(lambda: acc.save_state("ckpt"))
    out["shared_loaded"] = acc.load_state("ckpt")
    acc.end_training()
    os.chdir(machine)
    plain = _setup(rank, "plain", each_node=False)
    acc = plain["acc"]
    _steps(plain, 1)
    out["plain"], out["plain_warnings"] = _caught(acc.save_state)
    acc.save_model(plain["model"], "model_plain")
    acc.save({"w": torch.ones(2)}, "extra_plain.safetensors")
    try:
        acc.load_state()
        out["plain_load"] = "loaded"
    except Exception as exc:  # noqa: BLE001 - the error is what is checked
        out["plain_load"] = f"{type(exc).__name__}: {exc}"
    acc.end_training()
    return out


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("each_node")
    (root / "shared").mkdir()
    results = run_workers(_job, WORLD, args=(str(root),), env=_two_machines, timeout=300)
    return {"root": root, "ranks": results}


def _machines(job: dict[str, Any]) -> list[Path]:
    return [job["root"] / f"machine{m}" for m in range(WORLD // PER_MACHINE)]


def test_every_machine_holds_complete_rotated_copies(job: dict[str, Any]) -> None:
    from accel.checkpoint import read_manifest, verify

    for out in job["ranks"]:
        assert [Path(p).as_posix() for p in out["saved"]] == \
            [f"proj/checkpoints/checkpoint_{n}" for n in range(3)]
        assert out["save_warnings"] == [] and out["load_warnings"] == []
    ids, models = set(), set()
    for machine in _machines(job):
        root = machine / "proj" / "checkpoints"
        assert sorted(p.name for p in root.iterdir()) == ["checkpoint_1", "checkpoint_2"]
        for name in ("checkpoint_1", "checkpoint_2"):
            manifest = verify(root / name)  # every byte as listed
            assert manifest.world_size == WORLD and "absent_rank_states" not in manifest.meta
            assert {f"rank_{r}/{f}.json" for r in range(WORLD) for f in ("rng", "loaders")} \
                <= set(manifest.files)
        newest = read_manifest(root / "checkpoint_2")
        ids.add(newest.meta["save_id"])
        models.add(newest.files["model_0.safetensors"].sha256)
        assert (machine / "model" / "model.safetensors").is_file()
        assert (machine / "extra.safetensors").is_file()
    assert len(ids) == 1 and len(models) == 1  # copies of one save; DDP: the same weights


def test_load_state_on_each_machine_resumes_exactly(job: dict[str, Any]) -> None:
    for out in job["ranks"]:
        assert Path(out["loaded"]).as_posix() == "proj/checkpoints/checkpoint_2"
        assert out["again"] == out["after"]  # the same batches and the same losses, bitwise
        assert out["params_again"] == out["params_after"]
    first = job["ranks"][0]["after"]
    assert all(out["after"] != first for out in job["ranks"][1:])  # each rank its own data


def test_a_directory_both_machines_share_gets_one_checkpoint(job: dict[str, Any]) -> None:
    from accel.checkpoint import verify

    shared = job["root"] / "shared"
    assert sorted(p.name for p in shared.iterdir()) == ["ckpt"]  # no second copy, no leftover
    manifest = verify(shared / "ckpt")
    assert {f"rank_{r}/rng.json" for r in range(WORLD)} <= set(manifest.files)
    for out in job["ranks"]:
        assert out["shared"] == "ckpt" and out["shared_warnings"] == []
        assert out["shared_loaded"] == "ckpt"


def test_without_the_flag_only_the_main_machine_writes(job: dict[str, Any]) -> None:
    from accel.checkpoint import verify

    main, other = _machines(job)
    manifest = verify(main / "plain" / "checkpoints" / "checkpoint_0")
    assert {f"rank_{r}/rng.json" for r in range(WORLD)} <= set(manifest.files)
    assert not (other / "plain").exists()
    assert (main / "model_plain" / "model.safetensors").is_file()
    assert (main / "extra_plain.safetensors").is_file()
    assert not (other / "model_plain").exists() and not (other / "extra_plain.safetensors").exists()
    said = [w for out in job["ranks"] for w in out["plain_warnings"]]
    assert len(said) == 1 and "ranks [2, 3] do not see" in said[0], said
    assert "save_on_each_node=True" in job["ranks"][0]["plain_warnings"][0]
    for out in job["ranks"]:
        assert out["plain_load"].startswith("CheckpointError") and \
            "save_on_each_node=True" in out["plain_load"], out["plain_load"]


def _fsdp_job(rank: int, root: str) -> dict[str, Any]:
    from accel.checkpoint import CheckpointError, save_run

    machine = Path(root, f"fsdp{rank}")  # machines of one process each: rank = machine
    machine.mkdir()
    os.chdir(machine)
    _ctx, comm, group = cpu_group()
    model, opt = h.build(comm.ctx.world_size)
    h.train(model, opt, range(2), rank, comm.ctx.world_size)
    out: dict[str, Any] = {}
    for sharded in (True, False):
        for each_node in (True, False):
            name = f"{'sharded' if sharded else 'full'}_{'each' if each_node else 'plain'}"
            try:
                save_run(comm, snap=h.snapshot(model, opt, h.ShardIO(sharded), 2), output_dir=name, total_limit=None, project_dir=None,
                         project_total_limit=None, save_on_each_node=each_node)
                out[name] = "saved"
            except CheckpointError as exc:
                out[name] = str(exc)
    out["listing"] = sorted(os.listdir(machine))
    # what save_model does with the flag: every machine's local main process writes the weights
    from accel.checkpoint.sharded.consolidate import save_model_streamed

    save_model_streamed(model, directory="weights", write=comm.ctx.is_local_main_process)
    os.chdir(Path(root, "shared"))
    out["shared"] = str(save_run(comm, snap=h.snapshot(model, opt, h.ShardIO(True), 2), output_dir="fsdp_ckpt",
                                 total_limit=None, project_dir=None, project_total_limit=None, save_on_each_node=True))
    group.close()
    return out


@pytest.fixture(scope="module")
def fsdp_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("each_node_fsdp")
    (root / "shared").mkdir()

    def machines(rank: int, world: int, port: int) -> dict[str, str]:
        return {**_two_machines(rank, world, port), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                "GROUP_RANK": str(rank)}

    results = run_workers(_fsdp_job, 2, args=(str(root),), env=machines, timeout=240)
    return {"root": root, "ranks": results}


def test_fsdp_state_cannot_be_copied_to_each_machine(fsdp_job: dict[str, Any]) -> None:
    from accel.checkpoint import load, verify

    for out in fsdp_job["ranks"]:
        for name in ("sharded_each", "full_each"):
            assert "each machine writes its own copy (2 copies" in out[name], out[name]
            assert "FSDP" in out[name] and "save_model" in out[name]
        assert "ranks [1] do not see sharded_plain" in out["sharded_plain"], out["sharded_plain"]
        assert out["full_plain"] == "saved"  # the main process holds the full state
        assert out["shared"] == "fsdp_ckpt"
    zero, one = fsdp_job["ranks"]
    assert zero["listing"] == ["full_plain"] and one["listing"] == []  # nothing left behind
    weights = [load(fsdp_job["root"] / f"fsdp{r}" / "weights" / "model.safetensors")
               for r in range(2)]
    assert weights[0].keys() == weights[1].keys() and \
        all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    manifest = verify(fsdp_job["root"] / "fsdp0" / "full_plain")
    assert {"rank_0/rng.json", "rank_1/rng.json"} <= set(manifest.files)
    shared = fsdp_job["root"] / "shared"
    assert sorted(p.name for p in shared.iterdir()) == ["fsdp_ckpt"]
    assert any(f.startswith("sharded/model_0/") for f in verify(shared / "fsdp_ckpt").files)
