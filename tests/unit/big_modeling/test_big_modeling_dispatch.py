"""Hooks, offload folders, dispatch_model, cpu_offload/disk_offload and checkpoint loading."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from accel import Accelerator
from accel.big_modeling import (
    AlignDevicesHook,
    ModelHook,
    OffloadedWeightsLoader,
    SequentialHook,
    add_hook_to_module,
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    init_empty_weights,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
    remove_hook_from_module,
)
from accel.big_modeling import offload as offload_mod
from accel.checkpoint import save
from accel.checkpoint.storage import CheckpointError

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


class Probe(nn.Linear):
    """A Linear that records where its weight's data was during each forward."""

    def __init__(self, *args: int, **kwargs: bool) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(self.weight.data_ptr())
        return super().forward(x)


class TinyLM(nn.Module):
    """Embedding tied to the output layer, blocks, a BatchNorm (with an int64 buffer)."""

    def __init__(self, vocab: int = 40, width: int = 16, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.Tanh())
                                    for _ in range(depth))
        self.norm = nn.BatchNorm1d(width)
        self.head = Probe(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _model(seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    model = TinyLM().eval()
    with torch.no_grad():  # non-trivial statistics, so a lost buffer shows in the output
        model.norm.running_mean.uniform_(-1, 1)
        model.norm.running_var.uniform_(0.5, 2)
    return model


IDS = torch.tensor([1, 5, 7, 39])
SPLIT = {"embed": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "disk",
         "norm": "cpu", "head": "disk"}


# ------------------------------------------------------------------------ hooks


class Counting(ModelHook):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pre_forward(self, module, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append("pre")
        return (args[0] * 2,), kwargs

    def post_forward(self, module, output):  # type: ignore[no-untyped-def]
        self.calls.append("post")
        return output + 1

    def detach_hook(self, module):  # type: ignore[no-untyped-def]
        self.calls.append("detach")
        return module


def test_hooks_wrap_forward_chain_with_append_and_come_off_exactly() -> None:
    layer = nn.Linear(2, 2)
    weight, x = layer.weight, torch.ones(1, 2)
    plain = layer(x)
    first, second = Counting(), Counting()
    add_hook_to_module(layer, first)
    assert torch.equal(layer(x), layer._old_forward(x * 2) + 1)
    add_hook_to_module(layer, second, append=True)
    assert isinstance(layer._hf_hook, SequentialHook)
    assert torch.equal(layer(x), layer._old_forward(x * 4) + 2)
    remove_hook_from_module(layer)
    assert first.calls[-1] == second.calls[-1] == "detach"
    assert {"forward", "_old_forward", "_hf_hook"}.isdisjoint(layer.__dict__)  # class forward
    assert layer.weight is weight and torch.equal(layer(x), plain)

    own = nn.Linear(2, 2)
    custom = own.forward
    own.forward = custom  # an instance-level forward of the user's is given back, not dropped
    add_hook_to_module(own, Counting())
    remove_hook_from_module(own)
    assert own.__dict__["forward"] is custom


def test_align_devices_hook_moves_inputs_and_offloads_weights() -> None:
    layer = nn.Linear(3, 3)
    expected = layer(torch.ones(2, 3))
    hook = AlignDevicesHook(execution_device="cpu", offload=True)
    add_hook_to_module(layer, hook)
    assert layer.weight.is_meta and layer.bias.is_meta and "AlignDevicesHook(" in repr(hook)
    assert torch.equal(layer(torch.ones(2, 3)), expected)
    assert layer.weight.is_meta  # dropped again after the forward


# ------------------------------------------------------------------------ offload


def test_cpu_offload_runs_without_copies_and_restores_the_same_parameters() -> None:
    model = _model()
    expected = model(IDS)
    originals = dict(model.named_parameters())
    pointer = model.embed.weight.data_ptr()
    cpu_offload(model)
    assert all(p.is_meta for p in model.parameters())
    assert model.head.weight is model.embed.weight  # tied: one object, two names
    model.head.seen.clear()
    assert torch.equal(model(IDS), expected)
    assert model.head.seen == [pointer]  # the CPU weight itself was used: no copy at all
    remove_hook_from_module(model, recurse=True)
    assert dict(model.named_parameters()) == originals  # the same Parameter objects
    assert model.head.weight is model.embed.weight
    assert not any("_hf_hook" in m.__dict__ or "forward" in m.__dict__ for m in model.modules())


def test_disk_offload_writes_raw_files_and_round_trips(tmp_path: Path) -> None:
    model = _model()
    expected = model(IDS)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    disk_offload(model, tmp_path / "off")
    files = sorted(os.listdir(tmp_path / "off"))
    assert "index.json" in files and all(f.endswith((".dat", ".json")) for f in files)
    index = json.loads((tmp_path / "off" / "index.json").read_text())
    assert "embed.weight.dat" in files and "head.weight.dat" not in files  # tied: stored once
    assert index["head.weight"]["file"] == "embed.weight.dat"
    assert "file" not in index["embed.weight"]
    raw = (tmp_path / "off" / "embed.weight.dat").read_bytes()
    assert raw == state["embed.weight"].numpy().tobytes()  # Accelerate's raw layout
    assert all(p.is_meta for p in model.parameters())
    assert model.head.weight is model.embed.weight
    assert torch.equal(model(IDS), expected)
    assert all(p.is_meta for p in model.parameters())  # weights live on disk between forwards
    remove_hook_from_module(model, recurse=True)
    assert model.head.weight is model.embed.weight and not model.embed.weight.is_meta
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert isinstance(model.embed.weight, nn.Parameter) and model.embed.weight.requires_grad
    assert torch.equal(model(IDS), expected)


def test_offloaded_weights_are_read_once_per_forward(tmp_path: Path) -> None:
    model = _model()
    expected = model(IDS)
    dispatch_model(model, SPLIT, offload_dir=tmp_path)
    hook = model.head._hf_hook
    loader = hook.weights_map.dataset
    assert isinstance(loader, OffloadedWeightsLoader)
    # blocks.1 and blocks.2 come from disk; head.weight is tied to the CPU embedding: no read
    stored = {"blocks.1.0.weight", "blocks.1.0.bias", "blocks.2.0.weight", "blocks.2.0.bias"}
    assert model.head.weight is model.embed.weight and not model.head.weight.is_meta
    for _ in range(3):
        before = loader.loads
        model.head.seen.clear()
        assert torch.equal(model(IDS), expected)
        assert loader.loads - before == len(stored)  # each offloaded tensor read once
        assert model.head.seen == [model.embed.weight.data_ptr()]

    read: list[str] = []
    original = offload_mod.load_offloaded_weight

    def counting(path: str | Path, info: dict[str, object]) -> torch.Tensor:
        read.append(Path(path).name)
        return original(path, info)

    offload_mod.load_offloaded_weight = counting  # type: ignore[assignment]
    try:
        model(IDS)
    finally:
        offload_mod.load_offloaded_weight = original  # type: ignore[assignment]
    assert len(read) == len(set(read)) == len(stored)


def test_tied_disk_weight_is_shared_by_both_users_in_one_forward(tmp_path: Path) -> None:
    model = _model()
    expected = model(IDS)
    dispatch_model(model, {"embed": "disk", "blocks": "cpu", "norm": "cpu", "head": "disk"},
                   offload_dir=tmp_path)
    model.head.seen.clear()
    seen_by_embed: list[int] = []
    original = model.embed._old_forward

    def embed_forward(ids: torch.Tensor) -> torch.Tensor:
        seen_by_embed.append(model.embed.weight.data_ptr())
        return original(ids)

    model.embed._old_forward = embed_forward
    loader = model.head._hf_hook.weights_map.dataset
    before = loader.loads
    assert torch.equal(model(IDS), expected)
    assert loader.loads - before == 1  # embed.weight and head.weight: one file, read once
    assert not model.head._hf_hook.tied_params_map.live  # dropped when the forward ended
    assert model.head.seen == seen_by_embed  # the very same materialised tensor


# ------------------------------------------------------------------------ dispatch


def test_dispatch_with_cpu_and_disk_parts(tmp_path: Path) -> None:
    model = _model()
    expected = model(IDS)
    dispatch_model(model, SPLIT, offload_dir=tmp_path / "off")
    assert model.hf_device_map == SPLIT
    assert not model.blocks[0][0].weight.is_meta and model.blocks[1][0].weight.is_meta
    assert model.norm.running_mean.device.type == "cpu"  # buffers are not offloaded by default
    assert model.head.weight is model.embed.weight
    assert torch.equal(model(IDS), expected)
    assert not list((tmp_path / "off").glob("*.npy"))
    remove_hook_from_module(model, recurse=True)
    assert torch.equal(model(IDS), expected)


def test_dispatch_on_one_device_keeps_ties_and_adds_no_hooks() -> None:
    model = _model()
    dispatch_model(model, {"": "cpu"})
    assert model.head.weight is model.embed.weight
    assert "_hf_hook" not in model.__dict__


def _map_under_cap(model: nn.Module, cap: int) -> dict[str, str]:
    """Top-level modules on the CPU while they fit ``cap`` bytes, the rest on disk (until the
    placement module's infer_auto_device_map is merged; then the test below also uses it)."""
    used, out = 0, {}
    for name, child in model.named_children():
        size = sum(p.numel() * p.element_size() for p in child.parameters())
        place = "cpu" if used + size <= cap else "disk"
        used += size if place == "cpu" else 0
        out[name] = place
    return out


class Deep(nn.Module):
    def __init__(self, n: int = 6, width: int = 64) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(nn.Linear(width, width) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def test_model_over_a_cpu_cap_runs_through_disk_offload(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Deep().eval()
    x = torch.randn(3, 64)
    expected = model(x)
    save(model, tmp_path / "model.safetensors")
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    cap = total // 3
    with init_empty_weights():
        empty = Deep().eval()
    device_map = _map_under_cap(empty.layers, cap)
    device_map = {f"layers.{k}": v for k, v in device_map.items()}
    assert "disk" in device_map.values() and "cpu" in device_map.values()
    load_checkpoint_and_dispatch(empty, tmp_path / "model.safetensors", device_map=device_map,
                                 offload_folder=tmp_path / "off")
    resident = sum(p.numel() * p.element_size() for p in empty.parameters() if not p.is_meta)
    assert resident <= cap
    assert torch.equal(empty(x), expected)


@pytest.mark.parametrize("device_map", ["auto", "balanced", "balanced_low_0", "sequential"])
def test_inferred_device_maps_spill_to_disk_and_give_the_same_outputs(tmp_path: Path,
                                                                      device_map: str) -> None:
    torch.manual_seed(0)
    model = Deep().eval()
    x = torch.randn(3, 64)
    expected = model(x)
    save(model, tmp_path / "model.safetensors")
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    with init_empty_weights():
        empty = Deep().eval()
    load_checkpoint_and_dispatch(empty, tmp_path / "model.safetensors", device_map=device_map,
                                 max_memory={"cpu": total // 3}, offload_folder=tmp_path / "o")
    assert "disk" in empty.hf_device_map.values() and "cpu" in empty.hf_device_map.values()
    assert torch.equal(empty(x), expected)


def test_dispatch_errors_name_the_problem(tmp_path: Path) -> None:
    model = _model()
    with pytest.raises(ValueError, match=r"unplaced: \['norm.weight'"):
        dispatch_model(model, {"embed": "cpu", "blocks": "cpu", "head": "cpu"})
    with pytest.raises(ValueError, match="'nope'"):
        dispatch_model(model, {"": "cpu", "nope": "cpu"})
    with pytest.raises(ValueError, match="offload_dir"):
        dispatch_model(model, {"embed": "cpu", "blocks": "disk", "norm": "cpu", "head": "cpu"})
    with init_empty_weights():
        empty = TinyLM()
    with pytest.raises(ValueError, match="meta device.*load_checkpoint_in_model"):
        dispatch_model(empty, {"embed": "cpu", "blocks": "cpu", "norm": "cpu", "head": "disk"},
                       offload_dir=tmp_path, force_hooks=True)
    with pytest.raises(ValueError, match="'best'"):
        load_checkpoint_and_dispatch(_model(), tmp_path, device_map="best")


# ------------------------------------------------------------------------ loading


def _checkpoints(tmp_path: Path, model: nn.Module) -> dict[str, Path]:
    single = tmp_path / "single" / "model.safetensors"
    save(model, single)
    accelerator = Accelerator(cpu=True)
    prepared = accelerator.prepare(model)
    accelerator.save_model(prepared, str(tmp_path / "sharded"), max_shard_size="2KB")
    state = Path(accelerator.save_state(str(tmp_path / "state")))
    return {"single": single, "sharded": tmp_path / "sharded", "state": state}


def test_load_checkpoint_and_dispatch_reads_every_format(tmp_path: Path) -> None:
    source = _model(seed=1)
    expected = source(IDS)
    paths = _checkpoints(tmp_path, source)
    assert len(list(paths["sharded"].glob("model-*.safetensors"))) > 1
    assert (paths["sharded"] / "model.safetensors.index.json").is_file()
    for kind, path in paths.items():
        with init_empty_weights():
            model = TinyLM().eval()
        load_checkpoint_and_dispatch(model, path, device_map=SPLIT,
                                     offload_folder=tmp_path / f"off-{kind}", strict=True)
        assert torch.equal(model(IDS), expected), kind
        assert model.head.weight is model.embed.weight, kind
    index = paths["sharded"] / "model.safetensors.index.json"
    model = _model()
    load_checkpoint_in_model(model, index, strict=True)
    assert torch.equal(model(IDS), expected)


def test_load_converts_floats_only_and_keeps_fp32_modules(tmp_path: Path) -> None:
    save(_model(), tmp_path / "m.safetensors")
    model = _model(seed=3)
    load_checkpoint_in_model(model, tmp_path / "m.safetensors", dtype="float16",
                             keep_in_fp32_modules=["norm"])
    assert model.embed.weight.dtype == torch.float16 and model.head.weight is model.embed.weight
    assert model.norm.weight.dtype == torch.float32
    assert model.norm.num_batches_tracked.dtype == torch.int64  # int buffers never converted
    assert torch.equal(model.embed.weight, _model().embed.weight.half())


def test_load_names_missing_and_unexpected_keys(tmp_path: Path) -> None:
    state = _model().state_dict()
    state.pop("blocks.1.0.bias")
    state["extra.weight"] = torch.zeros(2)
    save(state, tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match=r"missing keys.*blocks\.1\.0\.bias.*unexpected.*extra"):
        load_checkpoint_in_model(_model(), tmp_path / "m.safetensors", strict=True)
    model = _model(seed=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_checkpoint_in_model(model, tmp_path / "m.safetensors")
    text = " ".join(str(w.message) for w in caught)
    assert "blocks.1.0.bias" in text and "extra.weight" in text
    assert torch.equal(model.blocks[0][0].weight, _model().blocks[0][0].weight)
    bad = _model().state_dict()
    bad["embed.weight"] = torch.zeros(3, 3)
    save(bad, tmp_path / "bad.safetensors")
    with pytest.raises(ValueError, match=r"'embed.weight' has shape \(3, 3\)"):
        load_checkpoint_in_model(_model(), tmp_path / "bad.safetensors")
    (tmp_path / "w.bin").write_bytes(b"\x80\x02")
    with pytest.raises(CheckpointError, match="w.bin is not a tensors-only torch.save file"):
        load_checkpoint_in_model(_model(), tmp_path / "w.bin")
    with pytest.raises(CheckpointError, match="no safetensors checkpoint"):
        load_checkpoint_in_model(_model(), tmp_path / "nothing")


class _Payload:
    """Unpickling this would run code (it creates a file): weights_only must refuse it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (str(self.marker),))


def test_torch_save_files_load_as_tensors_only(tmp_path: Path) -> None:
    """pytorch_model.bin / .pt files (whole, sharded with an index, bare index map, or a folder
    with one index) load as transformers and Accelerate load them; anything that is not a
    state dict of tensors is refused, and no code in the file runs."""
    source = _model(seed=3)
    torch.save(source.state_dict(), tmp_path / "whole.pt")
    model = _model()
    load_checkpoint_in_model(model, tmp_path / "whole.pt", dtype=torch.float16)
    assert torch.equal(model.embed.weight, source.embed.weight.half())
    shards = tmp_path / "shards"
    shards.mkdir()
    weight_map = {}
    for name, tensor in source.state_dict().items():
        part = f"part_{name.split('.')[0]}.bin"
        weight_map[name] = part
        existing = torch.load(shards / part) if (shards / part).exists() else {}
        torch.save({**existing, name: tensor}, shards / part)
    (shards / "weights.index.json").write_text(json.dumps(weight_map))  # bare map
    for where in (shards / "weights.index.json", shards):
        model = _model()
        load_checkpoint_in_model(model, where, strict=True)
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                     source.state_dict().values()))
    (shards / "more.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match="pass the one to load"):
        load_checkpoint_in_model(_model(), shards)  # which of two indexes: not guessed
    folder = tmp_path / "hf"
    folder.mkdir()
    torch.save(source.state_dict(), folder / "pytorch_model.bin")
    model = _model()
    load_checkpoint_in_model(model, folder)
    assert torch.equal(model.embed.weight, source.embed.weight)
    marker = tmp_path / "code_ran"
    torch.save({"embed.weight": _Payload(marker)}, tmp_path / "evil.bin")
    with pytest.raises(CheckpointError, match="objects other than tensors and plain containers "
                       "are refused"):
        load_checkpoint_in_model(_model(), tmp_path / "evil.bin")
    assert not marker.exists()
    torch.save([source.embed.weight], tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match="holds a list, not a state dict of tensors"):
        load_checkpoint_in_model(_model(), tmp_path / "list.pt")


def test_disk_parts_go_straight_to_the_offload_folder(tmp_path: Path) -> None:
    save(_model(), tmp_path / "m.safetensors")
    with init_empty_weights():
        model = TinyLM().eval()
    load_checkpoint_in_model(model, tmp_path / "m.safetensors", device_map=SPLIT,
                             offload_folder=tmp_path / "off")
    index = json.loads((tmp_path / "off" / "index.json").read_text())
    assert set(index) == {"blocks.1.0.weight", "blocks.1.0.bias", "blocks.2.0.weight",
                          "blocks.2.0.bias", "head.weight", "embed.weight"}  # tied: one file
    assert index["head.weight"] == {**index["embed.weight"], "file": "embed.weight.dat"}
    assert not (tmp_path / "off" / "head.weight.dat").exists()
    assert model.blocks[1][0].weight.is_meta and not model.blocks[0][0].weight.is_meta
    assert not model.embed.weight.is_meta  # tied to the disk head, but embed is on the CPU


# ------------------------------------------------------------------------ GPU paths


@needs_gpu
def test_gpu_cpu_disk_map_runs_and_returns_outputs_on_the_input_device(tmp_path: Path) -> None:
    model = _model()
    reference = _model().to("cuda")
    expected = reference(IDS.to("cuda"))
    device_map = {"embed": 0, "blocks.0": 0, "blocks.1": "cpu", "blocks.2": "disk",
                  "norm": 0, "head": 0}
    dispatch_model(model, device_map, offload_dir=tmp_path)
    assert model.blocks[0][0].weight.device == torch.device("cuda", 0)
    assert model.blocks[1][0].weight.is_meta and model.blocks[2][0].weight.is_meta
    out = model(IDS)  # CPU input: the output comes back on the CPU
    assert out.device.type == "cpu"
    assert torch.allclose(out, expected.cpu(), atol=1e-5)
    assert model.head.weight is model.embed.weight


@needs_gpu
def test_gpu_cpu_offload_copies_each_weight_once(tmp_path: Path) -> None:
    model = _model()
    expected = _model().to("cuda")(IDS.to("cuda"))
    cpu_offload(model, execution_device=0)
    model.head.seen.clear()
    out = model(IDS.to("cuda"))
    assert out.device.type == "cuda" and torch.allclose(out, expected, atol=1e-5)
    assert len(model.head.seen) == 1 and model.embed.weight.is_meta
    disk = _model()
    disk_offload(disk, tmp_path, execution_device="cuda:0")
    assert torch.allclose(disk(IDS.to("cuda")), expected, atol=1e-5)


class Scaled(nn.Module):
    """A model with a parameter of its own (not in a child), named directly in device maps."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(2.0))
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)) * self.scale


def test_device_map_may_name_a_tensor(tmp_path: Path) -> None:
    model = Scaled()
    expected = model(torch.ones(1, 3))
    dispatch_model(model, {"scale": "cpu", "a": "cpu", "b": "disk"}, offload_dir=tmp_path)
    assert not model.scale.is_meta and model.b.weight.is_meta and not model.a.weight.is_meta
    assert torch.equal(model(torch.ones(1, 3)), expected)


def test_offload_of_a_model_with_its_own_parameter_round_trips(tmp_path: Path) -> None:
    model = Scaled()
    x = torch.ones(1, 3)
    expected = model(x)
    scale = model.scale
    cpu_offload(model)
    assert model.scale.is_meta and isinstance(model._hf_hook, SequentialHook)
    assert torch.equal(model(x), expected)
    remove_hook_from_module(model, recurse=True)
    assert model.scale is scale and "forward" not in model.__dict__
    disk_offload(model, tmp_path)
    assert torch.equal(model(x), expected) and model.scale.is_meta


def test_cpu_offload_with_hook_moves_whole_models_in_turn() -> None:
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    x = torch.ones(1, 2)
    expected = second(first(x))
    first, hook = cpu_offload_with_hook(first, "cpu")
    offloaded: list[str] = []
    hook_offload = hook.offload
    hook.offload = lambda: (offloaded.append("first"), hook_offload())[1]  # type: ignore[method-assign]
    second, second_hook = cpu_offload_with_hook(second, "cpu", prev_module_hook=hook)
    assert torch.equal(second(first(x)), expected)
    assert offloaded == ["first"]  # running the second model put the first one back
    second_hook.remove()
    assert "_hf_hook" not in second.__dict__


def test_offloaded_containers_hook_their_parts(tmp_path: Path) -> None:
    # a ModuleList is never called: its layers must load their own weights when they run
    model = _model()
    expected = model(IDS)
    dispatch_model(model, {"embed": "cpu", "blocks": "disk", "norm": "cpu", "head": "cpu"},
                   offload_dir=tmp_path)
    assert "_hf_hook" in model.blocks[0][0].__dict__
    assert torch.equal(model(IDS), expected)


class UsesChildWeight(nn.Module):
    """Reads its child's weight without calling the child (needs preload_module_classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.proj.weight)


def test_preload_module_classes_load_a_whole_module(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.ones(2, 4)
    model = nn.Sequential(UsesChildWeight(), nn.Linear(4, 4))
    expected = model(x)
    dispatch_model(model, {"0": "disk", "1": "cpu"}, offload_dir=tmp_path / "a")
    assert "_hf_hook" in model[0].proj.__dict__  # by default: per module with own weights
    remove_hook_from_module(model, recurse=True)
    dispatch_model(model, {"0": "disk", "1": "cpu"}, offload_dir=tmp_path / "b",
                   preload_module_classes=["UsesChildWeight"])
    assert "_hf_hook" not in model[0].proj.__dict__ and "_hf_hook" in model[0].__dict__
    assert torch.equal(model(x), expected)
    remove_hook_from_module(model, recurse=True)
    disk_offload(model, tmp_path / "c", preload_module_classes=["UsesChildWeight"])
    assert torch.equal(model(x), expected)


def test_a_meta_input_is_refused_with_the_fix() -> None:
    layer = add_hook_to_module(nn.Linear(2, 2), AlignDevicesHook(execution_device="cpu"))
    with pytest.raises(RuntimeError, match="preload_module_classes"):
        layer(torch.empty(1, 2, device="meta"))
