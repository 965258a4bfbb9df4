"""Checkpoint directories: manifest, hashes, strict verified loading, naming and rotation."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

import accel
from accel.checkpoint import (
    MANIFEST,
    CheckpointError,
    CheckpointReader,
    CheckpointWriter,
    checkpoint_number,
    checkpoints_root,
    complete_checkpoints,
    finalize,
    is_complete,
    latest_complete,
    load_component,
    load_tensors,
    new_token,
    next_checkpoint_name,
    read_manifest,
    read_state,
    rotate,
    temp_dir_for,
    verify,
    write_state,
    write_tensors,
)
from accel.checkpoint.storage._io import PIECE


def _save(target: Path, step: int = 1, world_size: int = 1) -> Path:
    writer = CheckpointWriter(target)
    writer.write_tensors("model.safetensors", {"w": torch.full((4, 4), float(step))})
    writer.write_state("optimizer", {"state": {0: {"step": torch.tensor(step)}},
                                     "param_groups": [{"lr": 0.1, "params": [0]}]})
    writer.write_state("rng/rank_0", {"torch": torch.get_rng_state()})
    writer.write_json("loader/rank_0.json", {"epoch": 0, "batches": step})
    return writer.finalize(step=step, world_size=world_size, meta={"note": "test"})


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path: Path) -> None:
    ckpt = _save(tmp_path / "ckpt", step=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # temp dir renamed away
    doc = json.loads((ckpt / MANIFEST).read_text())
    assert doc["format_version"] == 2 and doc["step"] == 5 and doc["world_size"] == 1
    assert doc["accel_version"] == accel.__version__ and doc["torch_version"] == torch.__version__
    assert doc["meta"] == {"note": "test"} and doc["created"].endswith("+00:00")
    on_disk = sorted(p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*")
                     if p.is_file() and p.name != MANIFEST)
    assert sorted(doc["files"]) == on_disk == [
        "loader/rank_0.json", "model.safetensors", "optimizer.json", "optimizer.safetensors",
        "rng/rank_0.json", "rng/rank_0.safetensors"]
    for rel, rec in doc["files"].items():
        data = (ckpt / rel).read_bytes()
        assert rec == {"size": len(data), "piece_size": PIECE,  # sha256 of the pieces' sha256s
                       "sha256": hashlib.sha256(b"".join(
                           hashlib.sha256(data[i:i + PIECE]).digest()
                           for i in range(0, len(data), PIECE))).hexdigest()}
    manifest = verify(ckpt)
    assert manifest.step == 5 and is_complete(ckpt)
    assert read_state(ckpt, "optimizer")["state"][0]["step"].item() == 5
    assert load_component(ckpt, "loader/rank_0.json") == {"epoch": 0, "batches": 5}


def test_state_without_tensors_writes_only_json(tmp_path: Path) -> None:
    writer = CheckpointWriter(tmp_path / "c")
    writer.write_state("scheduler", {"last_epoch": 2})
    assert list(writer.wait()) == ["scheduler.json"]
    ckpt = writer.finalize(step=2, world_size=1)
    assert read_state(ckpt, "scheduler") == {"last_epoch": 2}


def _flip_byte(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("rel", ["model.safetensors", "optimizer.json", "optimizer.safetensors",
                                 "rng/rank_0.safetensors", "loader/rank_0.json"])
def test_corrupt_byte_raises_naming_the_file(tmp_path: Path, rel: str) -> None:
    ckpt = _save(tmp_path / "ckpt")
    _flip_byte(ckpt / rel, offset=len((ckpt / rel).read_bytes()) // 2)
    assert is_complete(ckpt)  # same size: the cheap check cannot see it, the hash does
    with pytest.raises(CheckpointError, match="corrupt") as info:
        load_component(ckpt, rel)
    assert rel in str(info.value) and info.value.path == ckpt / rel
    with pytest.raises(CheckpointError, match=f"{rel}: corrupt"):
        verify(ckpt)
    if rel.startswith(("optimizer", "rng")):
        with pytest.raises(CheckpointError, match=rel):
            read_state(ckpt, rel.rsplit(".", 1)[0])


@pytest.mark.parametrize("rel", ["model.safetensors", "optimizer.safetensors", "rng/rank_0.json"])
def test_missing_file_raises_naming_it(tmp_path: Path, rel: str) -> None:
    ckpt = _save(tmp_path / "ckpt")
    (ckpt / rel).unlink()
    assert not is_complete(ckpt)
    with pytest.raises(CheckpointError, match="missing") as info:
        load_component(ckpt, rel)
    assert str(ckpt / rel) in str(info.value)
    with pytest.raises(CheckpointError, match=f"{rel}: missing"):
        verify(ckpt)


def test_unlisted_truncated_and_unreadable_files(tmp_path: Path) -> None:
    ckpt = _save(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="not part of checkpoint"):
        load_component(ckpt, "rng/rank_1.safetensors")  # e.g. saved with one rank, loaded by two
    with open(ckpt / "model.safetensors", "r+b") as fh:
        fh.truncate(10)
    assert not is_complete(ckpt)
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt"):
        load_tensors(ckpt, "model.safetensors")
    (ckpt / "optimizer.json").unlink()
    (ckpt / "optimizer.json").mkdir()  # present but unreadable as a file
    with pytest.raises(CheckpointError, match="optimizer.json is unreadable"):
        read_state(ckpt, "optimizer")


def test_directory_without_valid_manifest_is_not_a_checkpoint(tmp_path: Path) -> None:
    ckpt = _save(tmp_path / "ckpt")
    (ckpt / MANIFEST).write_text("{\"format\": \"accel-checkpoint\"")  # truncated JSON
    assert not is_complete(ckpt)
    with pytest.raises(CheckpointError, match="not JSON"):
        read_manifest(ckpt)
    (ckpt / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match="interrupted save"):
        read_manifest(ckpt)
    with pytest.raises(CheckpointError, match="does not exist"):
        read_manifest(tmp_path / "nowhere")


def test_manifest_rejects_paths_outside_the_checkpoint(tmp_path: Path) -> None:
    ckpt = _save(tmp_path / "ckpt")
    doc = json.loads((ckpt / MANIFEST).read_text())
    doc["files"]["../escape.json"] = {"size": 1, "sha256": "0" * 64}
    (ckpt / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="malformed"):
        read_manifest(ckpt)
    assert not is_complete(ckpt)


def test_replacing_an_existing_checkpoint(tmp_path: Path) -> None:
    _save(tmp_path / "ckpt", step=1)
    ckpt = _save(tmp_path / "ckpt", step=2)
    assert read_manifest(ckpt).step == 2
    assert load_tensors(ckpt, "model.safetensors")["w"][0, 0].item() == 2.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # old one and temp dir gone


def test_ranks_write_into_one_temp_dir_and_rank0_finalizes(tmp_path: Path) -> None:
    target = tmp_path / "checkpoint_0"
    token = new_token()  # rank 0 picks it and broadcasts it
    records = {}
    for rank in (1, 0):  # every rank writes its files into the agreed directory
        tmpdir = temp_dir_for(target, token)
        tmpdir.mkdir(parents=True, exist_ok=True)
        records.update(write_state(tmpdir, f"rng/rank_{rank}", {"seed": torch.tensor(rank)}))
        if rank == 0:
            records["model.safetensors"] = write_tensors(tmpdir, relpath="model.safetensors",
                                                         tensors={"w": torch.ones(3)})
    (temp_dir_for(target, token) / "extra.json").write_text("{}")  # unreported: hashed by rank 0
    ckpt = finalize(temp_dir_for(target, token), target=target, step=3, world_size=2, records=records)
    manifest = verify(ckpt)
    assert manifest.world_size == 2 and "extra.json" in manifest.files
    assert read_state(ckpt, "rng/rank_1")["seed"].item() == 1


def test_finalize_rejects_a_reported_file_that_was_modified(tmp_path: Path) -> None:
    writer = CheckpointWriter(tmp_path / "c")
    writer.write_json("a.json", {"x": 1})
    writer.wait()
    (writer.tmpdir / "a.json").write_text('{"x": 100}')
    with pytest.raises(CheckpointError, match="reported"):
        writer.finalize(step=0, world_size=1)
    assert not (tmp_path / "c").exists()
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_invalid_names_and_meta_are_rejected(tmp_path: Path) -> None:
    writer = CheckpointWriter(tmp_path / "c")
    for bad in ("../x.json", "/abs.json", "a/../b.json", ".hidden.json", MANIFEST, ""):
        with pytest.raises(ValueError, match="invalid checkpoint file name"):
            writer.write_json(bad, {})
    with pytest.raises(TypeError, match="meta must be plain JSON"):
        writer.finalize(step=0, world_size=1, meta={"x": float("nan")})
    with pytest.raises(ValueError, match="step"):
        writer.finalize(step=-1, world_size=1)


def test_numbering_latest_complete_and_incomplete_dirs(tmp_path: Path) -> None:
    root = checkpoints_root(tmp_path)
    assert root == tmp_path / "checkpoints" and latest_complete(root) is None
    assert next_checkpoint_name(root) == root / "checkpoint_0"
    first = _save(next_checkpoint_name(root))
    second = _save(next_checkpoint_name(root))
    assert [checkpoint_number(first), checkpoint_number(second)] == [0, 1]
    # an interrupted save (temp dir with a manifest, not renamed) and a dir without manifest
    (root / "checkpoint_2").mkdir()
    (root / "checkpoint_2" / "model.safetensors").write_bytes(b"partial")
    _save(root / "checkpoint_3")
    (root / "checkpoint_3" / "model.safetensors").unlink()
    leftover = temp_dir_for(root / "checkpoint_4", "abc")
    leftover.mkdir()
    (leftover / MANIFEST).write_text((second / MANIFEST).read_text())
    assert latest_complete(root) == second
    assert complete_checkpoints(root) == [first, second]
    assert next_checkpoint_name(root) == root / "checkpoint_4"  # continues after the highest
    (root / "checkpoint_10").mkdir()
    assert next_checkpoint_name(root) == root / "checkpoint_11"  # numeric, not lexicographic


def test_rotation_keeps_newest_and_kept_and_cleans_leftovers(tmp_path: Path) -> None:
    root = checkpoints_root(tmp_path)
    made = [_save(next_checkpoint_name(root), step=i) for i in range(5)]
    stale = temp_dir_for(root / "checkpoint_1", "dead")  # interrupted save, older than newest
    stale.mkdir()
    fresh = temp_dir_for(root / "checkpoint_9", "live")  # maybe a save in progress: kept
    fresh.mkdir()
    same = temp_dir_for(root / "checkpoint_4", "dead")  # killed earlier attempt at the newest
    same.mkdir()
    broken = root / "checkpoint_0_notes"
    broken.mkdir()
    removed = rotate(root, total_limit=2, keep={made[1]})
    assert complete_checkpoints(root) == [made[1], made[4]]
    assert set(removed) == {made[0], made[2], made[3], stale, same}
    assert fresh.exists() and broken.exists()
    assert rotate(root, total_limit=1, keep={made[1]}) == []  # newest and kept survive
    assert rotate(root, total_limit=1) == [made[1]]
    assert complete_checkpoints(root) == [made[4]]
    assert rotate(root, total_limit=1) == []  # never the newest, even at the limit
    with pytest.raises(ValueError, match="total_limit"):
        rotate(root, total_limit=0)
    assert not any(p.name.startswith(".old-") for p in root.iterdir())


def test_rotation_only_counts_complete_checkpoints(tmp_path: Path) -> None:
    root = checkpoints_root(tmp_path)
    made = [_save(next_checkpoint_name(root), step=i) for i in range(3)]
    (made[2] / "model.safetensors").unlink()  # the highest is damaged: newest complete is 1
    assert latest_complete(root) == made[1]
    assert rotate(root, total_limit=1) == [made[0]]
    assert made[2].exists() and made[1].exists()


def test_files_are_fsynced_and_temp_dir_is_same_parent(tmp_path: Path, monkeypatch:
                                                         pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    writer = CheckpointWriter(tmp_path / "c", token="tok1")
    assert writer.tmpdir == tmp_path / ".tmp-c-tok1"
    writer.write_json("a.json", {})
    writer.wait()
    assert len(synced) == 1
    writer.finalize(step=0, world_size=1)
    assert len(synced) >= 4  # file, dirs, manifest, parent


def test_writer_rejects_bad_input_at_the_call_and_reports_worker_failures(tmp_path: Path) -> None:
    writer = CheckpointWriter(tmp_path / "c")
    with pytest.raises(TypeError, match=r"state\['x'\]"):
        writer.write_state("opt", {"x": object()})
    with pytest.raises(TypeError, match="cannot write JSON"):
        writer.write_json("a.json", {"x": float("nan")})
    with pytest.raises(TypeError, match="expected a torch.Tensor"):
        writer.write_tensors("m.safetensors", {"w": [1.0]})
    with pytest.raises(TypeError, match=r"dtype torch\.complex128"):  # a state's tensors too
        writer.write_state("custom_0", {"z": torch.zeros(2, dtype=torch.complex128)})
    writer.write_json("a.json", {})
    with pytest.raises(ValueError, match="already written"):
        writer.write_json("a.json", {})
    (writer.tmpdir / "b.json").write_text("{}")  # the worker's exclusive create will fail
    writer.write_json("b.json", {})
    with pytest.raises(FileExistsError):
        writer.finalize(step=0, world_size=1)
    assert not (tmp_path / "c").exists()
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_reader_prefetch_reads_the_same_and_reports_corruption_on_access(tmp_path: Path) -> None:
    ckpt = _save(tmp_path / "ckpt", step=4)
    reader = CheckpointReader(ckpt, prefetch=["model.safetensors", "optimizer", "rng/rank_0",
                                              "not-there"])
    assert reader.tensors("model.safetensors")["w"].eq(4).all()
    assert reader.state("optimizer")["state"][0]["step"].item() == 4
    assert torch.equal(reader.state("rng/rank_0")["torch"], read_state(ckpt, "rng/rank_0")["torch"])
    with pytest.raises(CheckpointError, match="not part of checkpoint"):
        reader.json("not-there.json")
    _flip_byte(ckpt / "optimizer.safetensors", offset=100)
    reader = CheckpointReader(ckpt, prefetch=["optimizer"])
    with pytest.raises(CheckpointError, match="optimizer.safetensors is corrupt"):
        reader.state("optimizer")


def test_writer_as_context_manager_cleans_up_on_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"), CheckpointWriter(tmp_path / "c") as writer:
        writer.write_tensors("m.safetensors", {"w": torch.ones(1000)})
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with CheckpointWriter(tmp_path / "c", token="t1") as writer:  # a rank other than 0
        writer.write_state("rank_1/rng", {"torch": torch.get_rng_state()})
        records = writer.wait()
    assert sorted(records) == ["rank_1/rng.json", "rank_1/rng.safetensors"]
    assert (tmp_path / ".tmp-c-t1" / "rank_1" / "rng.safetensors").is_file()
