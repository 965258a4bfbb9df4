"""Files hashed in pieces (manifest format 2): digests, parallel read/write, verification of
every byte before use, per-tensor memory, and format-1 checkpoints (whole-file sha256)."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from pathlib import Path

import pytest
import torch

from accel.checkpoint import (
    MANIFEST,
    CheckpointError,
    CheckpointReader,
    CheckpointWriter,
    FileRecord,
    finalize,
    is_complete,
    load_component,
    load_json,
    load_tensors,
    read_manifest,
    read_state,
    temp_dir_for,
    verify,
)
from accel.checkpoint.storage import _fill, _io, _st, reader

DATA = Path(__file__).parent / "data" / "checkpoint_format1" / "checkpoint_0"


def _reference(data: bytes, piece: int) -> str:
    return hashlib.sha256(b"".join(hashlib.sha256(data[i:i + piece]).digest()
                                   for i in range(0, len(data), piece))).hexdigest()


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> int:
    """Pieces of 1000 bytes: small files span many pieces, and pieces span tensors."""
    monkeypatch.setattr(_io, "PIECE", 1000)
    return 1000


def _tensors() -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    weight = torch.randn(37, 29)
    return {"weight": weight, "tied": weight, "bias": torch.randn(29).double(),
            "half": torch.randn(301).half(), "flags": torch.rand(17) > 0.5,
            "empty": torch.zeros(0, 3), "step": torch.tensor(7)}


def _save(target: Path) -> Path:
    writer = CheckpointWriter(target)
    writer.write_tensors("model.safetensors", _tensors())
    writer.write_state("optimizer", {"state": {0: {"exp_avg": torch.ones(600)}},
                                     "param_groups": [{"lr": 0.1, "params": [0]}]})
    return writer.finalize(step=1, world_size=1)


def test_digests_of_pieces_agree_everywhere(tmp_path: Path, small_pieces: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.bin"
    data = bytes(range(256)) * 30  # 7680 bytes: 8 pieces, the last one short
    with _io.HashingWriter(path) as out:
        for start in (0, 5, 1500, 1501, 4000):  # writes that straddle pieces
            out.write(data[start:{0: 5, 5: 1500, 1500: 1501, 1501: 4000, 4000: None}[start]])
        record = out.close()
    assert path.read_bytes() == data
    assert record == FileRecord(size=len(data), sha256=_reference(data, 1000), piece_size=1000)
    assert _io.digest_bytes(data, 1000) == record.sha256
    assert _io.hash_file(path, 1000) == record  # pieces hashed by the pool, a ring of buffers
    monkeypatch.setattr(_io, "_RING_PIECE_MAX", 10)
    assert _io.hash_file(path, 1000) == record  # one thread, constant memory
    buf, digest = _io.read_hashed(path, piece_size=1000)
    assert bytes(buf) == data and digest == record.sha256
    whole = hashlib.sha256(data).hexdigest()  # format 1: the sha256 of the whole file
    assert _io.read_hashed(path, piece_size=0)[1] == whole == _io.hash_file(path, 0).sha256
    empty = tmp_path / "empty"
    with _io.HashingWriter(empty) as out:
        nothing = FileRecord(size=0, sha256=hashlib.sha256(b"").hexdigest(), piece_size=1000)
        assert out.close() == nothing
    assert _io.hash_file(empty, 1000) == nothing
    assert _io.read_hashed(empty)[1] == hashlib.sha256(b"").hexdigest()


def test_records_round_trip_and_bad_piece_sizes_are_refused() -> None:
    record = FileRecord(size=10, sha256="ab" * 32, piece_size=4096)
    assert FileRecord.from_json(record.to_json()) == record
    assert FileRecord.from_json({"size": 3, "sha256": "x"}) == FileRecord(size=3, sha256="x",
                                                                          piece_size=0)
    assert "piece_size" not in FileRecord(size=3, sha256="x").to_json()
    for bad in (True, -1, "4096", None):
        with pytest.raises(ValueError, match="piece_size"):
            FileRecord.from_json({"size": 3, "sha256": "x", "piece_size": bad})
    with pytest.raises(ValueError, match="positive"):
        _io.HashingWriter("/nonexistent/never", piece_size=0)


def test_manifest_records_pieces_and_loads_the_same_tensors(
        tmp_path: Path, small_pieces: int, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = _save(tmp_path / "ckpt")
    doc = json.loads((ckpt / MANIFEST).read_text())
    assert doc["format_version"] == 2
    for rel, rec in doc["files"].items():
        assert rec == {"size": rec["size"], "piece_size": 1000,
                       "sha256": _reference((ckpt / rel).read_bytes(), 1000)}, rel
    assert doc["files"]["model.safetensors"]["size"] > 5 * 1000  # many pieces
    verify(ckpt)
    with monkeypatch.context() as patch:  # read straight into the tensors, not whole
        patch.setattr(reader, "_read_verified", lambda *a: pytest.fail("read whole"))
        loaded = load_tensors(ckpt, "model.safetensors")
    expected = _tensors()
    assert list(loaded) == [n for n in expected if n != "tied"] + ["tied"]  # aliases last
    for name, tensor in expected.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    assert loaded["tied"] is loaded["weight"]  # tied weights come back tied
    # each tensor has its own memory: nothing keeps a whole-file buffer alive
    for name in ("weight", "bias", "half", "flags"):
        assert loaded[name].untyped_storage().nbytes() == loaded[name].nbytes, name
    assert torch.equal(read_state(ckpt, "optimizer")["state"][0]["exp_avg"], torch.ones(600))
    prefetched = CheckpointReader(ckpt, prefetch=["model.safetensors", "optimizer"])
    assert torch.equal(prefetched.tensors("model.safetensors")["half"], expected["half"])
    assert prefetched.state("optimizer")["param_groups"][0]["lr"] == 0.1


def test_a_changed_byte_anywhere_in_any_file_is_refused(tmp_path: Path,
                                                         small_pieces: int) -> None:
    ckpt = _save(tmp_path / "ckpt")
    for rel in sorted(read_manifest(ckpt).files):
        original = (ckpt / rel).read_bytes()
        header_end = 8 + int.from_bytes(original[:8], "little")
        offsets = {0, 7, 8, 12, 999, 1000, 1001, len(original) // 2, len(original) - 1}
        if rel.endswith(".safetensors"):
            offsets |= {header_end - 1, header_end, header_end + 1}
        for offset in sorted(o for o in offsets if o < len(original)):
            damaged = bytearray(original)
            damaged[offset] ^= 0x10
            (ckpt / rel).write_bytes(bytes(damaged))
            with pytest.raises(CheckpointError, match="corrupt") as info:
                load_component(ckpt, rel)
            assert info.value.path == ckpt / rel, (rel, offset)
            with pytest.raises(CheckpointError, match=f"{rel}: corrupt"):
                verify(ckpt)
        for damaged_bytes in (original[:-1], original + b"\0", original[:len(original) // 2]):
            (ckpt / rel).write_bytes(damaged_bytes)
            with pytest.raises(CheckpointError, match="corrupt"):
                load_component(ckpt, rel)
        (ckpt / rel).write_bytes(original)
    verify(ckpt)


def _write_gapped(path: Path) -> None:
    """A valid safetensors file whose tensors leave a gap (accel never writes one)."""
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "b": {"dtype": "I64", "shape": [1], "data_offsets": [16, 24]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    data = torch.tensor([1.5, 2.5]).numpy().tobytes() + b"\xff" * 8 + \
        torch.tensor([9]).numpy().tobytes()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


def test_files_the_direct_path_skips_still_load_verified(tmp_path: Path,
                                                          small_pieces: int) -> None:
    target = tmp_path / "ckpt"
    tmp = temp_dir_for(target, "tok")
    tmp.mkdir()
    _write_gapped(tmp / "gapped.safetensors")  # unreported: finalize hashes it
    ckpt = finalize(tmp, target=target, step=0, world_size=1)
    record = read_manifest(ckpt).files["gapped.safetensors"]
    assert record.piece_size == 1000
    assert _fill.read_tensors(ckpt / "gapped.safetensors", record) is None  # read whole
    loaded = load_tensors(ckpt, "gapped.safetensors")
    assert loaded["a"].tolist() == [1.5, 2.5] and loaded["b"].tolist() == [9]
    damaged = bytearray((ckpt / "gapped.safetensors").read_bytes())
    damaged[-12] ^= 1  # in the gap: no tensor holds it, the digest still covers it
    (ckpt / "gapped.safetensors").write_bytes(bytes(damaged))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_tensors(ckpt, "gapped.safetensors")


def test_format_1_checkpoints_still_load(tmp_path: Path) -> None:
    """Written by accel before files were hashed in pieces (tests/unit/checkpoint/data)."""
    ckpt = tmp_path / "checkpoint_0"
    shutil.copytree(DATA, ckpt)
    manifest = verify(ckpt)
    assert manifest.format_version == 1 and is_complete(ckpt)
    assert all(rec.piece_size == 0 for rec in manifest.files.values())
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 3)
    model = load_tensors(ckpt, "model_0.safetensors")
    assert torch.equal(model["weight"], linear.weight) and model["tied"] is model["weight"]
    assert torch.equal(model["bias"], linear.bias)
    assert model["half"].tolist() == [0, 1, 2, 3, 4] and model["half"].dtype == torch.float16
    state = CheckpointReader(ckpt, prefetch=["optimizer_0"]).state("optimizer_0")
    assert state["state"][0]["step"].item() == 3 and state["param_groups"][0]["lr"] == 0.5
    assert torch.equal(state["state"][0]["exp_avg"], torch.ones(3, 4))
    assert load_json(ckpt, "extra.json") == {"note": "written by accel before pieces"}
    data = bytearray((ckpt / "model_0.safetensors").read_bytes())
    data[-1] ^= 1
    (ckpt / "model_0.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model_0.safetensors is corrupt"):
        load_tensors(ckpt, "model_0.safetensors")
    with pytest.raises(CheckpointError, match="model_0.safetensors: corrupt"):
        verify(ckpt)


def test_a_newer_format_is_refused_with_how_to_fix(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoint_0"
    shutil.copytree(DATA, ckpt)
    doc = json.loads((ckpt / MANIFEST).read_text())
    doc["format_version"] = 3
    (ckpt / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="newer than this accel reads.*upgrade accel"):
        read_manifest(ckpt)


def _io_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("accel-ckpt-io")]


def test_no_piece_thread_outlives_a_save_verify_or_load(tmp_path: Path,
                                                        small_pieces: int) -> None:
    # no module-level pool (DESIGN.md §3.2): each call's threads are joined before it returns
    ckpt = _save(tmp_path / "ckpt")
    verify(ckpt)
    loaded = load_tensors(ckpt, "model.safetensors")
    assert torch.equal(loaded["weight"], _tensors()["weight"])
    assert _io.read_hashed(ckpt / "model.safetensors")[1]  # the whole-file path too
    assert _io_threads() == []


def test_header_parsing_helpers_validate_entries() -> None:
    with pytest.raises(CheckpointError, match="does not match"):
        _st.entry_of({"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}, name="w", data_size=8, source="f")
    assert _st.entry_of({"dtype": "F16", "shape": [2, 2], "data_offsets": [8, 16]}, name="w", data_size=16,
                        source="f") == (torch.float16, [2, 2], 8, 16)


def test_a_hashing_failure_fails_the_write_and_removes_the_file(
        tmp_path: Path, small_pieces: int, monkeypatch: pytest.MonkeyPatch) -> None:
    real = _io._Hasher._consume

    def failing(self: _io._Hasher, view: memoryview) -> None:
        if len(self._digests) == 13:
            raise MemoryError("simulated")
        real(self, view)

    monkeypatch.setattr(_io, "_THREAD_MIN", 100)  # the helper thread hashes
    data = bytes(range(256)) * 100  # 26 pieces
    with _io.HashingWriter(tmp_path / "a") as out:
        for start in range(0, len(data), 700):
            out.write(data[start:start + 700])
        assert out.close() == FileRecord(size=len(data), sha256=_reference(data, 1000),
                                         piece_size=1000)
    monkeypatch.setattr(_io._Hasher, "_consume", failing)
    with pytest.raises(RuntimeError, match="hashing failed.*simulated"):
        with _io.HashingWriter(tmp_path / "b") as out:
            for start in range(0, len(data), 700):
                out.write(data[start:start + 700])
            out.close()
    assert not (tmp_path / "b").exists()  # the partial file is removed
