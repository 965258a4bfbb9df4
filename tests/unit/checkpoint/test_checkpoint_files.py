"""Single safetensors files, sharded model directories, and no unpickling of planted payloads."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from accel.checkpoint import (
    MANIFEST,
    CheckpointError,
    CheckpointWriter,
    load,
    load_component,
    load_model,
    load_model_state,
    parse_size,
    read_manifest,
    read_state,
    save,
    save_model,
    verify,
)
from accel.checkpoint.storage._io import hash_file


class _Payload:
    """Unpickling this creates ``marker``: proof that a loader ran code from the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.norm = torch.nn.LayerNorm(4)


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def test_save_module_as_pth_writes_safetensors_and_loads_back(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    path = tmp_path / "model.pth"
    save(model, path)
    _equal(load(path), model.state_dict())
    _equal(load_file(str(path)), model.state_dict())  # plain safetensors tooling reads it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pth"]  # no temp file left
    save({"x": torch.zeros(1)}, path)  # overwrite atomically
    assert list(load(path)) == ["x"]


def test_tied_weights_are_stored_once_and_restored(tmp_path: Path) -> None:
    model = _Tied()
    save(model, tmp_path / "m.safetensors")
    raw = load_file(str(tmp_path / "m.safetensors"))
    assert "head.weight" not in raw and "embed.weight" in raw  # one copy on disk
    loaded = load(tmp_path / "m.safetensors")
    _equal(loaded, model.state_dict())
    assert loaded["head.weight"] is loaded["embed.weight"]
    fresh = _Tied()
    fresh.load_state_dict(loaded)
    assert fresh.head.weight is fresh.embed.weight and torch.equal(fresh.head.weight,
                                                                   model.head.weight)


def test_dtypes_views_and_empty_tensors(tmp_path: Path) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {"t": base.t(), "slice": base[1:3], "same": base, "half": torch.ones(3).half(),
             "bf16": torch.ones(5, dtype=torch.bfloat16), "b": torch.tensor([True, False]),
             "u8": torch.arange(3, dtype=torch.uint8), "i64": torch.tensor(2**40),
             "empty": torch.zeros(0, 5), "c": torch.tensor([1 + 2j], dtype=torch.complex64)}
    save(state, tmp_path / "s.bin")
    _equal(load(tmp_path / "s.bin"), state)
    _equal(load_file(str(tmp_path / "s.bin")), state)


def test_unsupported_tensors_and_values_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="'x' is a int"):
        save({"x": 3}, tmp_path / "a")
    with pytest.raises(TypeError, match="dense"):
        save({"s": torch.eye(2).to_sparse()}, tmp_path / "a")
    with pytest.raises(TypeError, match="nn.Module or a dict"):
        save([torch.ones(1)], tmp_path / "a")
    assert list(tmp_path.iterdir()) == []


def test_load_refuses_torch_save_and_pickle_files_without_running_them(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    pickle.loads(pickle.dumps(_Payload(marker)))  # the payload works when unpickled ...
    assert marker.exists()
    marker.unlink()
    torch.save({"w": _Payload(marker)}, tmp_path / "model.pth")
    (tmp_path / "legacy.bin").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(CheckpointError, match="zip archive, the format of torch.save"):
        load(tmp_path / "model.pth")
    with pytest.raises(CheckpointError, match="pickle"):
        load(tmp_path / "legacy.bin")
    (tmp_path / "d").mkdir()
    shutil.copy(tmp_path / "model.pth", tmp_path / "d" / "model.safetensors")
    with pytest.raises(CheckpointError, match="not a valid safetensors"):
        load_model_state(tmp_path / "d")
    assert not marker.exists()  # ... and was never unpickled


@pytest.mark.parametrize("protocol_byte", range(6))
def test_safetensors_whose_header_length_looks_like_a_pickle_prefix_loads(
        tmp_path: Path, protocol_byte: int) -> None:
    """A header of 128 + 256 * k bytes (k <= 5) starts with b"\\x80" + bytes([k]): how a
    pickle starts, too. Such files are valid safetensors and must load (they were refused)."""
    from safetensors.torch import save_file

    for width in range(1, 1500):  # a metadata string that pads the header to the length
        path = tmp_path / "w.safetensors"
        save_file({"w": torch.arange(4.0)}, str(path), metadata={"pad": "x" * width})
        if path.read_bytes()[:2] == bytes([0x80, protocol_byte]):
            break
    else:
        pytest.fail(f"no header of {128 + 256 * protocol_byte} bytes was produced")
    assert torch.equal(load(path)["w"], torch.arange(4.0))


def _good_checkpoint(target: Path) -> Path:
    writer = CheckpointWriter(target)
    writer.write_tensors("model.safetensors", {"w": torch.ones(3)})
    writer.write_state("optimizer", {"state": {0: {"m": torch.zeros(3)}}, "param_groups": []})
    writer.write_state("scheduler", {"last_epoch": 1})
    writer.write_json("loader/rank_0.json", {"epoch": 0})
    return writer.finalize(step=1, world_size=1)


def _load_everything(ckpt: Path) -> None:
    verify(ckpt)
    manifest = read_manifest(ckpt)
    for rel in manifest.files:
        load_component(ckpt, rel, manifest)
    read_state(ckpt, "optimizer")
    read_state(ckpt, "scheduler")


@pytest.mark.parametrize("forge_manifest", [False, True])
def test_planted_pickle_in_any_checkpoint_file_is_never_unpickled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forge_manifest: bool) -> None:
    good = _good_checkpoint(tmp_path / "good")
    marker = tmp_path / "pwned"
    payloads = {"pickle": pickle.dumps(_Payload(marker), protocol=2)}
    torch.save(_Payload(marker), tmp_path / "p.pt")
    payloads["torch.save"] = (tmp_path / "p.pt").read_bytes()

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("a checkpoint loader called an unpickler")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    targets = [*read_manifest(good).files, MANIFEST]
    for kind, payload in payloads.items():
        for rel in targets:
            ckpt = tmp_path / f"bad-{kind}-{rel.replace('/', '_')}"
            shutil.copytree(good, ckpt)
            (ckpt / rel).write_bytes(payload)
            if forge_manifest and rel != MANIFEST:  # an attacker who also fixes the hashes
                doc = json.loads((ckpt / MANIFEST).read_text())
                doc["files"][rel] = hash_file(ckpt / rel).to_json()
                (ckpt / MANIFEST).write_text(json.dumps(doc))
            with pytest.raises(CheckpointError) as info:
                _load_everything(ckpt)
            message = str(info.value)
            assert rel in message, message
            assert ("corrupt" in message) != forge_manifest or rel == MANIFEST, message
            assert not marker.exists(), f"payload in {rel} ran"


def test_save_model_single_file_and_sharded(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(5)])
    single = save_model(model, save_directory=tmp_path / "single")
    assert single == tmp_path / "single" / "model.safetensors"
    _equal(load_model_state(tmp_path / "single"), model.state_dict())

    out = save_model(model, save_directory=tmp_path / "sharded", max_shard_size="5KB")  # 4224 B per layer
    names = sorted(p.name for p in (tmp_path / "sharded").iterdir())
    assert out.name == "model.safetensors.index.json"
    assert names == ["model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors",
                     "model-00003-of-00005.safetensors", "model-00004-of-00005.safetensors",
                     "model-00005-of-00005.safetensors", "model.safetensors.index.json"]
    index = json.loads(out.read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in model.state_dict().values())
    assert index["weight_map"]["0.weight"] == "model-00001-of-00005.safetensors"
    assert set(index["weight_map"]) == set(model.state_dict())
    for shard in set(index["weight_map"].values()):
        load_file(str(tmp_path / "sharded" / shard))  # each shard is plain safetensors
    _equal(load_model_state(tmp_path / "sharded"), model.state_dict())
    _equal(load_model_state(out), model.state_dict())
    fresh = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(5)])
    load_model(fresh, directory=tmp_path / "sharded")
    _equal(fresh.state_dict(), model.state_dict())

    save_model(model, save_directory=tmp_path / "sharded")  # re-save unsharded: stale shards and index removed
    assert sorted(p.name for p in (tmp_path / "sharded").iterdir()) == ["model.safetensors"]


def test_save_model_tied_weights_sharded(tmp_path: Path) -> None:
    model = _Tied()
    out = save_model(model, save_directory=tmp_path, max_shard_size=100)
    index = json.loads(out.read_text())
    assert "head.weight" not in index["weight_map"]  # like transformers: stored once
    loaded = load_model_state(tmp_path)
    _equal(loaded, model.state_dict())
    with pytest.warns(UserWarning, match=r"safe_serialization=False\) is ignored"):
        save_model(model, save_directory=tmp_path / "x", safe_serialization=False)
    assert (tmp_path / "x" / "model.safetensors").exists()


def test_load_model_state_explains_missing_weights(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(1)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin is a pickle file"):
        load_model_state(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load(tmp_path / "nope.safetensors")


@pytest.mark.parametrize(("text", "expected"), [
    ("10GB", 10 * 10**9), ("200MB", 200 * 10**6), ("5GiB", 5 * 2**30), ("1.5kb", 1500),
    (" 3 MiB ", 3 * 2**20), (12345, 12345), ("100", 100)])
def test_parse_size(text: Any, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["10 parsecs", "GB", "-1MB", 0, True, 1.5])
def test_parse_size_rejects(bad: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        parse_size(bad)
