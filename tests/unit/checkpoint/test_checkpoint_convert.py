"""accel.checkpoint.convert: Accelerate save_state directories read safely, reported, loaded.

The directories here are written file by file the way Accelerate writes them (``torch.save`` of
state dicts, a dict of RNG states per rank); tests/e2e/test_convert_checkpoint.py converts
checkpoints written by Accelerate itself and resumes from them.
"""

from __future__ import annotations

import json
import pickle
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader

from accel import Accelerator, DataLoaderConfiguration
from accel.checkpoint import (
    CheckpointError,
    CheckpointWriter,
    ConversionRefused,
    convert_accelerate_checkpoint,
    load_tensors,
    read_manifest,
    read_state,
)
from accel.device.xla import seed_from_tensor
from accel.launch.cli import main


class _Payload:
    """Unpickling this runs code (it creates ``marker``): proof that a file was unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({self.marker!r}, 'w').close()",))


class _Config:
    """A plain class in a registered object's state: only a full unpickler could rebuild it."""

    def __init__(self) -> None:
        self.depth = 3


class _Holder:
    def __init__(self) -> None:
        self.state: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = state


def _rng_file(path: Path, seed: int, **extra: Any) -> dict[str, Any]:
    """What Accelerate's save_accelerator_state writes for one rank (after seeding)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    states = {"step": 4, "random_state": random.getstate(),
              "numpy_random_seed": np.random.get_state(),
              "torch_manual_seed": torch.get_rng_state(), **extra}
    torch.save(states, path)
    return states


def _results(report: Any) -> dict[str, tuple[str, str | None, str]]:
    return {f.file: (f.status, f.written_as, f.detail) for f in report.files}


def test_malicious_pickles_are_reported_by_name_and_never_run(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(_Payload(probe)))
    assert probe.exists(), "the payload must be live, or this test proves nothing"
    marker, acc = tmp_path / "marker", tmp_path / "acc"
    acc.mkdir()
    _rng_file(acc / "random_states_0.pkl", 0)
    torch.save({"state": _Payload(marker)}, acc / "custom_checkpoint_0.pkl")  # torch.save zip
    (acc / "optimizer.bin").write_bytes(pickle.dumps(  # a plain pickle (protocol 2)
        {"state": {}, "param_groups": _Payload(marker)}, protocol=2))
    torch.save({"last_epoch": _Payload(marker)}, acc / "scheduler.bin",  # torch.save legacy
               _use_new_zipfile_serialization=False)
    (acc / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _Payload(marker)}, protocol=5))
    torch.save(_Payload(marker), acc / "sampler.bin")  # never read at all
    torch.save({"_num_yielded": _Payload(marker)}, acc / "dl_state_dict.bin")

    report = convert_accelerate_checkpoint(acc, output=tmp_path / "out")
    assert not marker.exists(), "a payload ran"
    got = _results(report)
    assert [f.file for f in report.converted] == ["random_states_0.pkl"]
    assert "builtins.exec, which torch.load(weights_only=True) refuses" in \
        got["custom_checkpoint_0.pkl"][2]
    for name in ("optimizer.bin", "scheduler.bin", "dl_state_dict.bin"):
        assert got[name][:2] == ("skipped", None) and "needs a full unpickler" in got[name][2]
    assert "cannot read it (Unsupported operand" in got["pytorch_model.bin"][2]
    assert "not read" in got["sampler.bin"][2]
    assert "weights_only=False" not in report.table()  # never advise the unsafe load
    manifest = read_manifest(tmp_path / "out")  # what was readable is a complete checkpoint
    assert set(manifest.files) == {"rank_0/rng.json", "rank_0/rng.safetensors"}
    assert manifest.meta["counts"] == {"custom": 1, "optimizers": 1, "models": 1,
                                       "schedulers": 1}
    # load_state names the missing component instead of starting from fresh weights
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    accelerator.prepare(model, opt, torch.optim.lr_scheduler.StepLR(opt, 1))
    accelerator.register_for_checkpointing(_Holder())
    with pytest.raises(CheckpointError, match="model_0.safetensors"):
        accelerator.load_state(str(tmp_path / "out"))

    with pytest.raises(ConversionRefused, match="6 file.*custom_checkpoint_0.pkl") as info:
        convert_accelerate_checkpoint(acc, output=tmp_path / "strict", strict=True)
    assert info.value.report.output is None and len(info.value.report.skipped) == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["acc", "out", "probe"]  # no temp dir
    assert not marker.exists()


def test_ranks_devices_and_the_compile_prefix(tmp_path: Path) -> None:
    acc = tmp_path / "acc"
    acc.mkdir()
    cuda = [torch.full((16,), 7, dtype=torch.uint8), torch.full((16,), 9, dtype=torch.uint8)]
    saved = [_rng_file(acc / f"random_states_{rank}.pkl", rank, torch_cuda_manual_seed=cuda,
                       xm_seed=2**64 - 5, torch_xpu_manual_seed=[torch.zeros(2)])
             for rank in (0, 1)]
    # a model compiled before prepare(); "module." is the user's own submodule (Accelerate
    # saves the model it was given, never its DDP wrapper)
    weights = {"_orig_mod.module.weight": torch.ones(2, 2),
               "_orig_mod.module.bias": torch.zeros(2)}
    torch.save(weights, acc / "pytorch_model.bin")
    report = convert_accelerate_checkpoint(acc, output=tmp_path / "out")
    assert report.world_size == read_manifest(tmp_path / "out").world_size == 2
    got = _results(report)
    assert "removed torch.compile's prefix _orig_mod." in got["pytorch_model.bin"][2]
    assert set(load_tensors(tmp_path / "out", "model_0.safetensors")) == {"module.weight",
                                                                          "module.bias"}
    for rank in (0, 1):
        state = read_state(tmp_path / "out", f"rank_{rank}/rng")
        assert torch.equal(state["torch"], saved[rank]["torch_manual_seed"])
        assert state["python"] == saved[rank]["random_state"]
        assert np.array_equal(state["numpy"][1], saved[rank]["numpy_random_seed"][1])
        assert torch.equal(state["device"]["cuda"], cuda[rank])  # its own GPU's generator
        assert seed_from_tensor(state["device"]["xla_seed"]) == 2**64 - 5
        assert f"cuda (GPU {rank} of 2), xla; dropped torch_xpu_manual_seed" in \
            got[f"random_states_{rank}.pkl"][2]
    # one process resumes it as from accel's own 2-process checkpoints: rank 0's RNG
    accelerator = Accelerator(cpu=True)
    wrapper = nn.Module()
    wrapper.module = nn.Linear(2, 2)
    accelerator.prepare(wrapper)
    torch.manual_seed(123)
    with pytest.warns(UserWarning, match=r"written by 2 process\(es\), this job has 1"):
        accelerator.load_state(str(tmp_path / "out"))
    assert torch.equal(torch.get_rng_state(), saved[0]["torch_manual_seed"])
    assert torch.equal(wrapper.module.weight.detach(), torch.ones(2, 2))


def test_loaders_unknown_files_and_missing_ranks_are_reported(tmp_path: Path) -> None:
    acc = tmp_path / "acc"
    (acc / "unet").mkdir(parents=True)
    (acc / "pytorch_model_fsdp_0").mkdir()
    (acc / "notes.txt").write_text("hello")
    _rng_file(acc / "random_states_0.pkl", 0)
    _rng_file(acc / "random_states_2.pkl", 2)
    torch.save({"_num_yielded": 7, "_sampler_iter_state": None}, acc / "dl_state_dict.bin")
    torch.save(nn.Linear(2, 2).state_dict(), acc / "pytorch_model.bin")
    # both weight files for model 0: the safetensors one is converted
    save_file({"weight": torch.ones(2, 2), "bias": torch.ones(2)}, str(acc / "model.safetensors"))
    report = convert_accelerate_checkpoint(acc, output=tmp_path / "out")
    got = _results(report)
    assert report.world_size == 3
    assert got["model.safetensors"] == ("converted", "model_0.safetensors", "2 tensors")
    assert "a second file for model 0" in got["pytorch_model.bin"][2]
    assert "skip_first_batches(loader, 7)" in got["dl_state_dict.bin"][2]
    assert "merge-weights" in got["pytorch_model_fsdp_0"][2]
    assert "a directory" in got["unet"][2] and "not a file" in got["notes.txt"][2]
    assert got["random_states_1.pkl"][0] == "skipped" and "missing" in \
        got["random_states_1.pkl"][2]
    lines = report.table().splitlines()
    assert lines[0].split() == ["FILE", "RESULT", "ACCEL", "FILE", "DETAIL"]
    assert len(lines) == 1 + len(report.files) == 1 + 9
    doc = report.to_json()
    assert json.loads(json.dumps(doc)) == doc and doc["ok"] is True
    assert doc["converted"] == ["model.safetensors", "random_states_0.pkl", "random_states_2.pkl"]
    # accel resumes it, leaving the prepared loader where it is (as Accelerate's load_state);
    # a loader that asks for exact resume is told that the checkpoint has no position for it
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        use_stateful_dataloader=True))
    model, loader = accelerator.prepare(nn.Linear(2, 2), DataLoader(list(range(10)),
                                                                    batch_size=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator.load_state(str(tmp_path / "out"))
    messages = " ".join(str(w.message) for w in caught)
    assert "holds no data loader positions" in messages and "skip_first_batches" in messages
    assert "written by 3 process(es), this job has 1" in messages
    assert len(list(loader)) == 5
    assert torch.equal(model.weight.detach(), torch.ones(2, 2))


def test_registered_state_is_carried_when_it_is_plain_and_named_when_not(tmp_path: Path) -> None:
    acc = tmp_path / "acc"
    acc.mkdir()
    _rng_file(acc / "random_states_0.pkl", 0)
    plain = {"count": 3, "best": np.float32(0.5), "ids": np.arange(4, dtype=np.int16),
             "history": torch.arange(3.0), "name": "ema", "flags": (True, None)}
    torch.save(plain, acc / "custom_checkpoint_0.pkl")
    torch.save({"cfg": _Config()}, acc / "custom_checkpoint_1.pkl")
    torch.save({"z": torch.zeros(2, dtype=torch.complex128)}, acc / "custom_checkpoint_2.pkl")
    report = convert_accelerate_checkpoint(acc, output=tmp_path / "out")
    got = _results(report)
    assert got["custom_checkpoint_0.pkl"][:2] == ("converted", "custom_0")
    assert f"{__name__}._Config" in got["custom_checkpoint_1.pkl"][2]
    assert "dtype torch.complex128" in got["custom_checkpoint_2.pkl"][2]
    holders = [_Holder(), _Holder(), _Holder()]
    accelerator = Accelerator(cpu=True)
    accelerator.register_for_checkpointing(*holders)
    with pytest.raises(CheckpointError, match="custom_1"):  # strict: names what is missing
        accelerator.load_state(str(tmp_path / "out"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator.load_state(str(tmp_path / "out"), strict=False)
    assert [str(w.message).split(": ")[2][:16] for w in caught] == ["skipped custom_1",
                                                                   "skipped custom_2"]
    state = holders[0].state
    assert (state["count"], state["name"], state["flags"]) == (3, "ema", (True, None))
    assert state["best"] == np.float32(0.5) and state["best"].dtype == np.float32
    assert state["ids"].dtype == np.int16 and state["ids"].tolist() == [0, 1, 2, 3]
    assert torch.equal(state["history"], torch.arange(3.0))


def test_command_exit_codes_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    acc, out = tmp_path / "acc", tmp_path / "out"
    acc.mkdir()

    def run(*args: str) -> tuple[int, str, str]:
        code = main(["convert-checkpoint", *args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    code, _, err = run(str(tmp_path / "nope"), str(out))
    assert code == 2 and "is not a directory" in err
    code, _, err = run(str(acc), str(out))
    assert code == 2 and "holds no file of Accelerate's save_state" in err
    _rng_file(acc / "random_states_0.pkl", 0)
    code, stdout, _ = run(str(acc), str(out))
    assert code == 0 and "converted 1 file(s), skipped 0" in stdout
    assert f"accelerator.load_state('{out}')" in stdout
    code, _, err = run(str(acc), str(out))
    assert code == 2 and "already exists" in err and "--overwrite" in err
    assert run(str(acc), str(out), "--overwrite")[0] == 0
    code, _, err = run(str(acc), str(acc / "inside"))
    assert code == 2 and "must be outside" in err
    (tmp_path / "file").write_text("")
    code, _, err = run(str(acc), str(tmp_path / "file"), "--overwrite")
    assert code == 2 and "is not a directory" in err

    def full_disk(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(CheckpointWriter, "finalize", full_disk)
        code, _, err = run(str(acc), str(tmp_path / "full"))
    assert code == 1 and "No space left on device" in err and "nothing was written" in err
    assert not (tmp_path / "full").exists() and not list(tmp_path.glob(".tmp-*"))
    torch.save({"state": {0: {"step": torch.ones(2)}}, "param_groups": []}, acc / "optimizer.bin")
    code, stdout, _ = run(str(acc), str(tmp_path / "odd"))  # loads, but is not Accelerate's
    assert code == 0 and "optimizer.bin skipped - cannot be converted: ValueError" in \
        " ".join(stdout.split()), stdout
    assert not any(name.startswith("optimizer") for name in read_manifest(tmp_path / "odd").files)
    (acc / "optimizer.bin").unlink()
    (acc / "sampler.bin").write_bytes(b"")
    code, stdout, err = run(str(acc), str(tmp_path / "strict"), "--strict", "--json")
    doc = json.loads(stdout)
    assert code == 1 and doc["ok"] is False and doc["skipped"] == ["sampler.bin"]
    assert "refused to convert" in err and not (tmp_path / "strict").exists()
