"""Accelerator-level checkpoints in one process: planted pickles, strict loading of the scaler,
registered objects, failed saves, automatic naming, model files, and the data loader's use of
torch's global RNG (which exact resume depends on). Multi-process resume: tests/distributed."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import accel.checkpoint
from accel import Accelerator
from accel.checkpoint import CheckpointError


class _Payload:
    """Unpickling this creates ``marker``: proof that a file was unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


class _Custom:
    """A registered object whose state uses every kind of leaf a checkpoint keeps."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = state


def _trained(acc: Accelerator, steps: int = 2) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    for _ in range(steps):
        acc.backward(model(torch.randn(4, 3)).pow(2).mean())
        opt.step()
        opt.zero_grad()
    return model, opt


def _replace(ckpt: Path, relpath: str, data: bytes, fix_manifest: bool) -> None:
    (ckpt / relpath).write_bytes(data)
    if fix_manifest:  # an attacker who also rewrites the manifest: only the parser stands
        manifest = json.loads((ckpt / "manifest.json").read_text())
        manifest["files"][relpath] = {"size": len(data),
                                      "sha256": hashlib.sha256(data).hexdigest()}
        (ckpt / "manifest.json").write_text(json.dumps(manifest))


def test_planted_pickle_is_never_unpickled(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(_Payload(probe)))
    assert probe.exists(), "the payload must be live, or this test proves nothing"
    marker = tmp_path / "marker"
    raw = pickle.dumps(_Payload(marker))
    zipped = tmp_path / "payload.pt"
    torch.save(_Payload(marker), zipped)
    acc = Accelerator(cpu=True, project_dir=str(tmp_path / "project"))
    _trained(acc)
    ckpt = Path(acc.save_state())
    assert {"model_0.safetensors", "optimizer_0.json", "optimizer_0.safetensors"} <= {
        p.name for p in ckpt.iterdir()}
    for relpath in ("model_0.safetensors", "optimizer_0.json", "optimizer_0.safetensors"):
        for payload in (raw, zipped.read_bytes()):
            for fix_manifest in (False, True):
                bad = tmp_path / "bad"
                shutil.rmtree(bad, ignore_errors=True)
                shutil.copytree(ckpt, bad)
                _replace(bad, relpath, payload, fix_manifest)
                with pytest.raises(CheckpointError) as info:
                    acc.load_state(str(bad))
                message = str(info.value)
                assert relpath in message, message
                expected = ("pickle" if payload is raw else "zip") if fix_manifest else "corrupt"
                assert expected in message, message
                assert not marker.exists(), f"{relpath} was unpickled"
    assert not marker.exists()


def test_scaler_strict_and_lenient(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True, mixed_precision="fp16")
    _trained(acc)
    ckpt = Path(acc.save_state(str(tmp_path / "ckpt")))
    scale = acc.scaler.get_scale()
    assert (ckpt / "scaler.json").is_file()
    missing, corrupt = tmp_path / "missing", tmp_path / "corrupt"
    shutil.copytree(ckpt, missing)
    shutil.copytree(ckpt, corrupt)
    (missing / "scaler.json").unlink()
    data = bytearray((corrupt / "scaler.json").read_bytes())
    data[-2] ^= 0x01
    (corrupt / "scaler.json").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"scaler\.json is missing"):
        acc.load_state(str(missing))
    with pytest.raises(CheckpointError, match=r"scaler\.json is corrupt"):
        acc.load_state(str(corrupt))
    acc.scaler.update(new_scale=2.0)
    with pytest.warns(UserWarning, match=r"rank 0: .*strict=False.*skipped scaler"):
        acc.load_state(str(corrupt), strict=False)
    assert acc.scaler.get_scale() == 2.0  # skipped, everything else loaded
    acc.load_state(str(ckpt))
    assert acc.scaler.get_scale() == scale


def test_registered_objects_round_trip(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    custom = _Custom()
    custom.state = {"step": 7, "ema": torch.arange(4.0), "hist": np.array([[1, 2]], np.int16),
                    "by_id": {3: (1.5, float("inf"))}, "name": "run", "none": None}
    acc.register_for_checkpointing(custom)
    with pytest.raises(TypeError, match="object has no state_dict"):
        acc.register_for_checkpointing(object())
    with pytest.raises(ValueError, match=r"index 1 \(int\).*index 2 \(str\)") as bad:
        acc.register_for_checkpointing(_Custom(), 3, "x")  # every bad item named, none added
    assert "index 0" not in str(bad.value)
    assert acc._run.custom == [custom]
    path = acc.save_state(str(tmp_path / "ckpt"))
    expected = dict(custom.state)
    custom.state = {}
    acc.load_state(path)
    got = custom.state
    assert torch.equal(got["ema"], expected["ema"])
    assert got["hist"].dtype == np.int16 and np.array_equal(got["hist"], expected["hist"])
    assert got["by_id"] == {3: (1.5, float("inf"))}
    assert (got["step"], got["name"], got["none"]) == (7, "run", None)


def test_failed_save_leaves_nothing_and_names_the_value(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True, project_dir=str(tmp_path))
    custom = _Custom()
    acc.register_for_checkpointing(custom)
    assert Path(acc.save_state()).name == "checkpoint_0"
    custom.state = {"callback": print}
    with pytest.raises(CheckpointError, match=r"state\['callback'\].*builtin_function"):
        acc.save_state()
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_0"]  # no temp dir left
    custom.state = {"ok": 1}
    assert Path(acc.save_state()).name == "checkpoint_1"


def test_automatic_naming_skips_incomplete_and_rotates(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True, project_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        acc.load_state()
    with pytest.raises(TypeError, match="unsupported arguments"):
        acc.save_state(max_shard_size="1GB")
    with pytest.raises(ValueError, match="needs Accelerator\\(project_dir"):
        Accelerator(cpu=True).save_state()
    model, _ = _trained(acc)
    root = tmp_path / "checkpoints"
    for _ in range(3):
        acc.save_state(total_limit=2)
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_1", "checkpoint_2"]
    (root / "checkpoint_5").mkdir()  # an interrupted save: no manifest
    weights = {k: v.clone() for k, v in acc.unwrap_model(model).state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert Path(acc.load_state()).name == "checkpoint_2"  # the newest complete one
    assert all(torch.equal(v, acc.unwrap_model(model).state_dict()[k]) for k, v in weights.items())
    assert Path(acc.save_state(total_limit=1)).name == "checkpoint_6"
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_2", "checkpoint_5",
                                                      "checkpoint_6"]  # loaded one kept


def test_save_and_load_model_files(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    model, _ = _trained(acc)
    state = acc.unwrap_model(model).state_dict()
    acc.save(acc.unwrap_model(model), str(tmp_path / "model.pth"), safe_serialization=True)
    assert (tmp_path / "model.pth").read_bytes()[:2] not in (b"PK", b"\x80\x04")  # not pickle
    loaded = accel.checkpoint.load(tmp_path / "model.pth")
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)
    acc.save_model(model, str(tmp_path / "sharded"), max_shard_size=100)
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) >= 2 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    fresh = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.2), nn.Linear(8, 1))
    acc.load_model(fresh, str(tmp_path / "sharded"))
    assert all(torch.equal(fresh.state_dict()[k], state[k]) for k in state)


@pytest.mark.parametrize("shuffle", [False, True])
def test_prepared_loader_leaves_the_global_rng_alone(shuffle: bool) -> None:
    """Exact resume needs this: torch's DataLoader draws a worker base seed from the global torch
    RNG each time a pass starts (``_BaseDataLoaderIter.__init__``) unless the loader has its own
    generator. A run resumed mid-epoch starts a pass where the uninterrupted run did not, so
    every random op after it (dropout) differs. Fix in accel/data: give rebuilt loaders their own
    generator, or restore the global RNG state around ``iter()`` of the inner loader."""
    acc = Accelerator(cpu=True)
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(8)), batch_size=2,
                                    shuffle=shuffle))
    before = torch.get_rng_state()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        it = iter(loader)
        next(it)
    assert torch.equal(before, torch.get_rng_state()), \
        "starting a pass of a prepared loader consumed torch's global RNG"
    it.close()


def test_load_into_different_objects_names_the_mismatch(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    first, second = _Custom(), _Custom()
    first.state, second.state = {"a": 1}, {"b": 2}
    acc.register_for_checkpointing(first, second)
    path = acc.save_state(str(tmp_path / "ckpt"))
    other = Accelerator(cpu=True)
    mine = _Custom()
    other.register_for_checkpointing(mine)
    with pytest.raises(CheckpointError, match="custom: 2 saved, 1 prepared"):
        other.load_state(path)
    with pytest.warns(UserWarning, match="custom: 2 saved, 1 prepared"):
        other.load_state(path, strict=False)
    assert mine.state == {"a": 1}  # matched by position


def test_save_inside_an_accumulation_group_warns(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = acc.prepare(nn.Linear(2, 1))
    with acc.accumulate(model):
        acc.backward(model(torch.ones(1, 2)).sum())
    with pytest.warns(UserWarning, match="micro-step 1 of 2"):
        acc.save_state(str(tmp_path / "mid"))
    with acc.accumulate(model):
        acc.backward(model(torch.ones(1, 2)).sum())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        acc.save_state(str(tmp_path / "boundary"))
    with pytest.warns(UserWarning, match="total_limit=2.* is ignored"):
        acc.save_state(str(tmp_path / "boundary"), total_limit=2)


def test_main_process_only_save_in_one_process_is_a_full_save(tmp_path: Path) -> None:
    """``if accelerator.is_main_process: save_state()`` with one process: nothing is absent."""
    acc = Accelerator(cpu=True)
    model = acc.prepare(nn.Linear(2, 2))
    if acc.is_main_process:
        acc.save_state(str(tmp_path / "ckpt"))
        acc.save_model(model, str(tmp_path / "model"))
    manifest = accel.checkpoint.read_manifest(tmp_path / "ckpt")
    assert "absent_rank_states" not in manifest.meta and "rank_0/rng.json" in manifest.files
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        acc.load_state(str(tmp_path / "ckpt"))
        acc.load_model(model, str(tmp_path / "model"))


def test_one_warning_says_what_ranks_without_saved_states_get() -> None:
    from accel.checkpoint.protocol.load import _rank_state_note

    path = Path("ckpt")
    assert _rank_state_note(path, saved_world=2, world=2, absent=frozenset()) is None
    alone = _rank_state_note(path, saved_world=3, world=3, absent=frozenset({1, 2}))
    assert alone is not None and "main process alone" in alone and "ranks [1, 2]" in alone
    assert "seeded deterministically from the step" in alone and "rank 0's position" in alone
    grown = _rank_state_note(path, saved_world=2, world=3, absent=frozenset({1}))
    assert grown is not None and "written by 2 process(es)" in grown and "ranks [1]" in grown
    shrunk = _rank_state_note(path, saved_world=2, world=1, absent=frozenset({1}))  # rank 1 is not in this job
    assert shrunk is not None and "main process alone" not in shrunk


def _loader_run(stateful: bool, loaders: int = 1, seedable: bool = False
                ) -> tuple[Accelerator, list[Any]]:
    from accel import DataLoaderConfiguration

    torch.manual_seed(3)
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        use_stateful_dataloader=stateful, use_seedable_sampler=seedable))
    return acc, [acc.prepare(DataLoader(range(8), batch_size=2, shuffle=True))
                 for _ in range(loaders)]


def _first_batches(loader: Any, n: int) -> list[list[int]]:
    it = iter(loader)
    out = [next(it).tolist() for _ in range(n)]
    it.close()
    return out


def _epoch1(seedable: bool = False) -> list[list[int]]:
    reference = _loader_run(stateful=False, seedable=seedable)[1][0]
    _first_batches(reference, 4)
    return [b.tolist() for b in reference]


def test_load_state_restores_loader_positions_only_when_stateful(tmp_path: Path) -> None:
    """As Accelerate: load_state leaves loaders as they are unless use_stateful_dataloader
    (scripts written for it skip by hand); with it, the next unseen batch comes next."""
    acc, (loader,) = _loader_run(stateful=False)
    epoch0 = [b.tolist() for b in loader]
    for step, _ in enumerate(loader):  # epoch 1, saved after its second batch
        if step == 1:
            path = acc.save_state(str(tmp_path / "ckpt"))
    saved = accel.checkpoint.read_state(Path(path), "rank_0/loaders")
    assert saved[0]["next_epoch"] == 1 and saved[0]["next_skip"] == 2  # always saved

    plain, (fresh, extra) = _loader_run(stateful=False, loaders=2)  # any number of loaders
    plain.load_state(path)
    # the sampler's generator is not restored (as in Accelerate): the order drawn at prepare
    assert _first_batches(fresh, 4) == epoch0 and len(_first_batches(extra, 1)) == 1

    stateful, (resumed,) = _loader_run(stateful=True)
    stateful.load_state(path)
    assert [b.tolist() for b in resumed] == _epoch1()[2:]

    counted, _ = _loader_run(stateful=True, loaders=2)
    with pytest.raises(CheckpointError, match="loaders: 1 saved, 2 prepared"):
        counted.load_state(path)


def test_a_loader_position_of_the_first_format_still_loads() -> None:
    """Positions written before the shuffle order became Accelerate's (format version 1) load;
    mid-epoch in a shuffled loader, with a warning that the epoch's order changed."""
    _, (loader,) = _loader_run(stateful=True, seedable=True)
    old = {"version": 1, "epoch": 1, "batches_yielded": 3, "iterating": True,
           "next_epoch": 1, "next_skip": 3, "seed": 3, "world_size": 1, "batch_size": 2,
           "split_batches": False}
    with pytest.warns(UserWarning, match="shuffled in another order"):
        loader.load_state_dict(old)
    assert [b.tolist() for b in loader] == _epoch1(seedable=True)[3:]
    assert loader.state_dict()["version"] == 3
    plain = Accelerator(cpu=True).prepare(DataLoader(range(8), batch_size=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not shuffled: the same order as before
        plain.load_state_dict({**old, "seed": 0})
    assert [b.tolist() for b in plain] == [[6, 7]]
