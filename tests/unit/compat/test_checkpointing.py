"""``accel.checkpointing``: Accelerate's ``save_accelerator_state``/``load_accelerator_state``
over accel's pickle-free checkpoint protocol, round-tripped."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from accel import Accelerator, DataLoaderConfiguration
from accel.checkpoint import CheckpointError
from accel.checkpointing import (
    CheckpointingMixin,
    load_accelerator_state,
    save_accelerator_state,
)


def _run(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def test_signatures_are_accelerates() -> None:
    assert list(inspect.signature(save_accelerator_state).parameters) == [
        "output_dir", "model_states", "optimizers", "schedulers", "dataloaders",
        "process_index", "step", "scaler", "save_on_each_node", "safe_serialization"]
    assert list(inspect.signature(load_accelerator_state).parameters) == [
        "input_dir", "models", "optimizers", "schedulers", "dataloaders", "process_index",
        "scaler", "map_location", "load_kwargs", "load_model_func_kwargs"]
    assert CheckpointingMixin.__name__ == "CheckpointingMixin"  # still importable there


def test_round_trip_restores_every_object_and_the_step(tmp_path: Path) -> None:
    model, optimizer, scheduler = _run(0)
    scaler = torch.amp.GradScaler("cpu", init_scale=512.0)
    path = save_accelerator_state(tmp_path / "ckpt", [model.state_dict()], [optimizer],
                                  [scheduler], [], process_index=0, step=11, scaler=scaler)
    assert path == tmp_path / "ckpt" and (path / "manifest.json").is_file()
    assert not [p for p in path.rglob("*") if p.suffix in (".bin", ".pkl", ".pt")]  # no pickle

    other, other_opt, other_sched = _run(1)
    other_scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    got = load_accelerator_state(path, [other], [other_opt], [other_sched], [],
                                 process_index=0, scaler=other_scaler, map_location="cpu")
    assert got == {"step": 11}
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert other_opt.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]
    assert torch.equal(other_opt.state_dict()["state"][0]["exp_avg"],
                       optimizer.state_dict()["state"][0]["exp_avg"])
    assert other_sched.state_dict() == scheduler.state_dict()  # type: ignore[attr-defined]
    assert other_scaler.get_scale() == 512.0


def test_prepared_loaders_resume_and_accelerator_reads_the_same_checkpoint(
        tmp_path: Path) -> None:
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        use_stateful_dataloader=True))
    model, loader = acc.prepare(torch.nn.Linear(1, 1), DataLoader(list(range(8)), batch_size=2))
    it = iter(loader)
    next(it), next(it)
    path = save_accelerator_state(tmp_path / "c", [model.state_dict()], [], [], [loader],
                                  process_index=0, step=3)
    rest = [b.tolist() for b in it]
    fresh = acc.prepare(DataLoader(list(range(8)), batch_size=2))
    assert load_accelerator_state(path, [model], [], [], [fresh], process_index=0) == {"step": 3}
    assert [b.tolist() for b in fresh] == rest  # continues with the next unseen batch
    # the Accelerator's own load_state reads it (one format, one protocol)
    other = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        use_stateful_dataloader=True))
    twin, twin_loader = other.prepare(torch.nn.Linear(1, 1),
                                      DataLoader(list(range(8)), batch_size=2))
    other.load_state(str(path))
    assert torch.equal(twin.weight, model.weight)
    assert [b.tolist() for b in twin_loader] == rest


def test_wrong_arguments_say_what_to_do(tmp_path: Path) -> None:
    model = torch.nn.Linear(1, 1)
    with pytest.raises(ValueError, match="process_index=1 but this process is rank 0"):
        save_accelerator_state(tmp_path / "a", [model.state_dict()], [], [], [], 1, 0)
    with pytest.warns(UserWarning, match="safe_serialization=False. is ignored"):
        path = save_accelerator_state(tmp_path / "a", [model.state_dict()], [], [], [], 0, 0,
                                      safe_serialization=False)
    with pytest.warns(UserWarning, match="torch.load is never called"):
        load_accelerator_state(path, [model], [], [], [], 0, load_kwargs={"mmap": True})
    with pytest.raises(TypeError, match="takes only strict="):
        load_accelerator_state(path, [model], [], [], [], 0, assign=True)
    with pytest.raises(ValueError, match="map_location='cuda:3'"):
        load_accelerator_state(path, [model], [], [], [], 0, map_location="cuda:3")
    bigger = torch.nn.Linear(1, 2)
    with pytest.raises(CheckpointError):
        load_accelerator_state(path, [bigger], [], [], [], 0)  # shapes differ
    load_accelerator_state(path, [torch.nn.Sequential()], [], [], [], 0, strict=False)
