"""Accelerate's remaining big-model utils in accel.utils behave as Accelerate's own do (compared
with the installed Accelerate on small models), plus what accel does beyond them."""

from __future__ import annotations

import importlib
import json
import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import accel.utils as ours
from accel.big_modeling import AlignDevicesHook, add_hook_to_module, offload_state_dict
from accel.checkpoint.storage import CheckpointError

acc = pytest.importorskip("accelerate.utils", reason="compares with Accelerate: install the test "
                          "extra (pip install -e '.[test]')")


class Flagged(nn.Parameter):
    """A Parameter subclass (as quantisation libraries and peft use): the class must survive."""


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 4)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        self.head = nn.Linear(4, 5, bias=False)
        self.register_buffer("scale", torch.ones(1), persistent=False)


def _meta_net() -> Net:
    with torch.device("meta"):
        return Net()


def _describe(model: nn.Module) -> list[tuple[Any, ...]]:
    """What a caller can see of every tensor: class, device, dtype, grad flag, values, ties."""
    first: dict[int, str] = {}
    out = []
    for name, t in [*model.named_parameters(remove_duplicate=False),
                    *model.named_buffers(remove_duplicate=False)]:
        values = None if t.is_meta else t.detach().double().flatten().tolist()
        out.append((name, type(t).__name__, t.device.type, t.dtype, t.requires_grad, values,
                    first.setdefault(id(t), name), getattr(t, "_is_hf_initialized", None)))
    return out


def _same(build: Callable[[], nn.Module], steps: Callable[[Callable[..., Any], nn.Module], Any]
          ) -> list[tuple[Any, ...]]:
    """Run ``steps`` with Accelerate's and accel's function on fresh models; same outcome."""
    results = []
    for impl in (acc.set_module_tensor_to_device, ours.set_module_tensor_to_device):
        model = build()
        steps(impl, model)
        results.append(_describe(model))
    assert results[0] == results[1]
    return results[1]


def test_meta_to_cpu_casts_to_the_module_dtype_or_to_dtype_and_keeps_parameters() -> None:
    def steps(put: Callable[..., Any], m: nn.Module) -> None:
        put(m, "emb.weight", "cpu", value=torch.arange(20.0, dtype=torch.half).view(5, 4))
        put(m, "body.0.weight", "cpu", value=torch.ones(4, 4, dtype=torch.float64),
            dtype=torch.bfloat16)
        put(m, "body.0.bias", "cpu", value=torch.arange(4.0, dtype=torch.float64))
        put(m, "body.1.num_batches_tracked", "cpu", value=torch.tensor(3), dtype=torch.half)
        put(m, "body.1.running_mean", "cpu", value=torch.ones(4, dtype=torch.int32))  # to fp32
        put(m, "scale", torch.device("cpu"), value=torch.full((1,), 2.0))
    got = {row[0]: row for row in _same(_meta_net, steps)}
    assert got["emb.weight"][1:4] == ("Parameter", "cpu", torch.float32)
    assert got["body.0.weight"][3] == torch.bfloat16
    assert got["body.0.bias"][3] == torch.float32
    assert got["body.1.num_batches_tracked"][1:4] == ("Tensor", "cpu", torch.int64)
    assert got["body.1.running_mean"][3] == torch.float32
    assert got["scale"][5] == [2.0]


def test_parameter_class_requires_grad_and_hf_flag_survive() -> None:
    def build() -> nn.Module:
        model = _meta_net()
        frozen = Flagged(model.head.weight.data, requires_grad=False)
        frozen._is_hf_initialized = True  # type: ignore[attr-defined]
        model.head.weight = frozen
        return model

    def steps(put: Callable[..., Any], m: nn.Module) -> None:
        put(m, "head.weight", "cpu", value=torch.ones(5, 4))
        put(m, "body.0.weight", "meta", dtype="float16" if put is ours.set_module_tensor_to_device
            else torch.float16)  # accel also takes dtype names
    got = {row[0]: row for row in _same(build, steps)}
    assert got["head.weight"][1:5] == ("Flagged", "cpu", torch.float32, False)
    assert got["head.weight"][7] is True
    assert got["body.0.weight"][1:5] == ("Parameter", "meta", torch.float16, True)


def test_moves_without_value_keep_the_object_when_nothing_changes() -> None:
    model = nn.Linear(2, 2)
    weight = model.weight
    ours.set_module_tensor_to_device(model, "weight", "cpu")
    assert model.weight is weight
    ours.set_module_tensor_to_device(model, "weight", "cpu", dtype=torch.half)  # only for meta
    assert model.weight is weight and weight.dtype == torch.float32
    ours.set_module_tensor_to_device(model, "weight", "meta")
    assert model.weight.is_meta and isinstance(model.weight, nn.Parameter)


def test_tied_params_map_places_a_tied_weight_once() -> None:
    shared = torch.randn(5, 4)

    def steps(put: Callable[..., Any], m: nn.Module) -> None:
        tied: dict[int, dict[Any, torch.Tensor]] = {shared.data_ptr(): {}}
        put(m, "emb.weight", "cpu", value=shared, tied_params_map=tied)
        put(m, "head.weight", "cpu", value=shared.clone().view(5, 4), tied_params_map=tied)
        put(m, "body.0.weight", "cpu", value=torch.zeros(4, 4), tied_params_map=tied)
        assert list(tied[shared.data_ptr()]) == ["cpu"]
        assert tied[shared.data_ptr()]["cpu"] is m.emb.weight  # type: ignore[union-attr]
        put(m, "head.weight", "cpu", value=shared, tied_params_map=tied)  # reuses it
    got = {row[0]: row for row in _same(_meta_net, steps)}
    assert got["head.weight"][6] == "emb.weight"  # one object under both names


@pytest.mark.parametrize(("name", "kwargs", "match"), [
    ("emb.weight", {}, "meta"),  # no data to move
    ("emb.weight", {"value": torch.ones(4, 5)}, "shape"),
    ("emb.nothing", {"value": torch.ones(1)}, "emb"),
    ("nothing.weight", {"value": torch.ones(1)}, "nothing"),
])
def test_refusals_are_value_errors_like_accelerates(name: str, kwargs: dict[str, Any],
                                                    match: str) -> None:
    with pytest.raises((ValueError, AttributeError)):
        acc.set_module_tensor_to_device(_meta_net(), name, "cpu", **kwargs)
    with pytest.raises(ValueError, match=match):
        ours.set_module_tensor_to_device(_meta_net(), name, "cpu", **kwargs)


def test_fp16_statistics_become_the_scb_attribute() -> None:
    model = nn.Linear(2, 2)
    ours.set_module_tensor_to_device(model, "weight", "cpu", value=torch.ones(2, 2),
                                     fp16_statistics=torch.ones(2, dtype=torch.half))
    assert model.weight.SCB.tolist() == [1.0, 1.0]  # type: ignore[attr-defined]


def test_named_module_tensors_and_id_tensor_storage_match_accelerate() -> None:
    model = Net()
    model.head.weight = model.emb.weight  # type: ignore[assignment]  # same shape (5, 4)
    for kwargs in ({}, {"recurse": True}, {"include_buffers": False, "recurse": True},
                   {"remove_non_persistent": True}):
        theirs = [(n, id(t)) for n, t in acc.named_module_tensors(model, **kwargs)]
        assert [(n, id(t)) for n, t in ours.named_module_tensors(model, **kwargs)] == theirs
    base = torch.arange(6.0)
    for tensor in (base, base[2:], torch.zeros(3, dtype=torch.bfloat16), torch.empty(0)):
        assert ours.id_tensor_storage(tensor) == acc.id_tensor_storage(tensor)
    assert ours.id_tensor_storage(base) == ours.id_tensor_storage(base[2:])


def test_named_module_tensors_drops_nested_non_persistent_buffers() -> None:
    """Accelerate compares full names with leaf names, so it keeps ``sub.scale``; accel drops
    every non-persistent buffer, as the flag says."""
    names = [n for n, _ in ours.named_module_tensors(nn.Sequential(Net()), recurse=True,
                                                     remove_non_persistent=True)]
    assert "0.scale" not in names and "0.body.1.running_mean" in names


def test_tied_weight_helpers_match_accelerate() -> None:
    def broken() -> nn.Module:
        model = Net()
        model.head.weight = model.emb.weight  # type: ignore[assignment]
        groups = ours.find_tied_parameters(model)
        model.head.weight = nn.Parameter(torch.zeros(5, 4))  # the tie broken (as hooks do)
        model.groups = groups  # type: ignore[assignment]
        return model
    for impl in (acc.retie_parameters, ours.retie_parameters):
        model = broken()
        impl(model, model.groups)
        assert model.head.weight is model.emb.weight
    meta = _meta_net()
    ours.retie_parameters(meta, [["emb.weight", "head.weight"]])  # all meta: left alone
    assert meta.head.weight is not meta.emb.weight
    groups = [["emb.weight", "head.weight"]]
    with pytest.warns(UserWarning, match="different devices"):
        ours.check_tied_parameters_on_same_device(groups, {"emb": "cpu", "head": "disk", "": 0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours.check_tied_parameters_on_same_device(groups, {"": "cpu"})
    for impl in (acc.check_tied_parameters_on_same_device,
                 ours.check_tied_parameters_on_same_device):
        with pytest.raises(ValueError):
            impl(groups, {"emb": "cpu"})  # head.weight placed nowhere


class PreTrainedModel(nn.Module):
    """Stands for transformers' base class (both implementations look at the class name)."""

    def __init__(self, **config: Any) -> None:
        super().__init__()
        self.config = type("Config", (), config)()
        self.out = nn.Linear(2, 2)

    def get_output_embeddings(self) -> nn.Module:
        return self.out


@pytest.mark.parametrize("config", [
    {}, {"tie_word_embeddings": True}, {"tie_word_embeddings": False},
    {"is_encoder_decoder": True, "tie_encoder_decoder": True}, {"is_encoder_decoder": True}])
def test_check_tied_parameters_in_config_matches_accelerate(config: dict[str, bool]) -> None:
    model = PreTrainedModel(**config)
    assert ours.check_tied_parameters_in_config(model) == \
        bool(acc.check_tied_parameters_in_config(model))
    assert ours.check_tied_parameters_in_config(nn.Linear(1, 1)) is False
    model.out._tie_weights = True  # type: ignore[assignment]
    assert ours.check_tied_parameters_in_config(model) is True


def test_ensure_weights_retied_keeps_ties_through_reallocation() -> None:
    def reinit(module: nn.Module) -> nn.Module:  # an FSDP param_init_fn: new storages
        return module.to_empty(device="cpu", recurse=False)
    for impl in (acc.ensure_weights_retied, ours.ensure_weights_retied):
        model = _meta_net()
        model.head.weight = model.emb.weight  # type: ignore[assignment]
        assert impl(reinit, Net(), "cpu") is reinit  # nothing tied declared
        model._tied_weights_keys = ["head.weight"]  # type: ignore[assignment]
        init = impl(reinit, model, torch.device("cpu"))
        for module in model.modules():
            init(module)
        assert not model.emb.weight.is_meta and model.head.weight is model.emb.weight


def test_module_order_sizes_and_bytes_match_accelerate() -> None:
    model = Net()
    model.extra = model.body[0]  # a module under two parents
    for fqns in (False, True):
        theirs = acc.get_module_children_bottom_up(model, return_fqns=fqns)
        assert ours.get_module_children_bottom_up(model, return_fqns=fqns) == theirs
    model._no_split_modules = ["Sequential"]  # type: ignore[assignment]
    for target in (Net(), model, _meta_net()):
        assert ours.calculate_maximum_sizes(target) == acc.calculate_maximum_sizes(target)
    for size in (0, 1023, 1024, 1536, 10**6, 3 * 2**30, 5 * 2**40, 7 * 2**50, 2**60, 2.5):
        assert ours.convert_bytes(size) == acc.convert_bytes(size)


def test_state_dict_helpers_match_accelerate(monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"h.1.w": torch.ones(1), "h.10.w": torch.ones(1), "h.1": torch.ones(1),
             "g.w": torch.ones(1)}
    for names in (["h.1"], ["h.1", "g"], ["x"]):
        assert ours.extract_submodules_state_dict(state, names) == \
            acc.extract_submodules_state_dict(state, names)
    shared = torch.arange(4.0).view(2, 2).t()
    # Accelerate's logger refuses to log without an Accelerate state: a plain one stands in
    monkeypatch.setattr(importlib.import_module("accelerate.utils.other"), "logger",
                        logging.getLogger("accelerate-under-test"))
    cleaned = []
    for impl in (acc.clean_state_dict_for_safetensors, ours.clean_state_dict_for_safetensors):
        given = {"a": shared, "b": shared, "c": torch.ones(2), "meta": "not a tensor"}
        with warnings.catch_warnings(record=True):
            result = impl(given)
        assert list(given) == ["a", "c", "meta"]  # aliases deleted from the input too
        assert result["a"].is_contiguous() and torch.equal(result["a"], shared)
        cleaned.append(list(result))
    assert cleaned[0] == cleaned[1]
    with pytest.warns(UserWarning, match=r"\['b'\]"):
        ours.clean_state_dict_for_safetensors({"a": shared, "b": shared})


def test_load_state_dict_matches_accelerate_and_refuses_pickles(tmp_path: Path) -> None:
    file = str(tmp_path / "model.safetensors")
    state = {k: v.clone() for k, v in Net().state_dict().items()}
    save_file(state, file, metadata={"format": "pt"})
    for device_map in (None, {"": "cpu"}, {"emb": "cpu", "body": "disk", "body.0": "cpu"}):
        theirs = acc.load_state_dict(file, device_map)
        got = ours.load_state_dict(file, device_map)
        assert sorted(got) == sorted(theirs)
        assert all(torch.equal(got[k], theirs[k]) and got[k].device == theirs[k].device
                   and got[k].dtype == theirs[k].dtype for k in got)
    torch.save(state, tmp_path / "model.bin")
    with pytest.raises(CheckpointError, match="pickle"):
        ours.load_state_dict(tmp_path / "model.bin")


def test_load_offloaded_weights_reads_accel_and_accelerate_folders(tmp_path: Path) -> None:
    source = Net()
    state = {k: v for k, v in source.state_dict().items()}
    expected = _describe(source)
    for writer, folder in ((offload_state_dict, tmp_path / "accel"),
                           (acc.offload_state_dict, tmp_path / "accelerate")):
        writer(str(folder), state)
        index = json.loads((folder / "index.json").read_text())
        model = _meta_net()
        model.scale = torch.ones(1)  # non-persistent: not in the folder
        ours.load_offloaded_weights(model, index, folder)
        assert _describe(model) == expected
    ours.load_offloaded_weights(_meta_net(), {}, tmp_path)  # nothing to do
    with pytest.raises(FileNotFoundError, match="offload the model again"):
        ours.load_offloaded_weights(_meta_net(), {"emb.weight": {"dtype": "float32",
                                                                 "shape": [5, 4]}}, tmp_path)


def test_align_module_device_materialises_offloaded_weights() -> None:
    layer = nn.Linear(2, 2)
    weight = layer.weight.detach().clone()
    assert not ours.has_offloaded_params(layer)
    with ours.align_module_device(layer):  # no hook, no device: nothing moves
        assert layer.weight.device.type == "cpu"
    add_hook_to_module(layer, AlignDevicesHook(execution_device="cpu", io_same_device=True))
    assert not ours.has_offloaded_params(layer)  # a hook, but not offloading
    add_hook_to_module(layer, AlignDevicesHook(execution_device="cpu", offload=True))
    assert ours.has_offloaded_params(layer) and layer.weight.is_meta
    for device in (None, "cpu"):
        with ours.align_module_device(layer, device):
            assert torch.equal(layer.weight, weight)
        assert layer.weight.is_meta
        assert layer._hf_hook.execution_device == torch.device("cpu")  # type: ignore[union-attr]
    moved = nn.Linear(2, 2)  # no hook: the module's own parameters go there and come back
    with ours.align_module_device(moved, "meta"):
        assert moved.weight.is_meta and moved.bias.is_meta
        moved.weight = nn.Parameter(torch.zeros(2, 2), requires_grad=False)
        moved.bias = nn.Parameter(torch.ones(2))
    assert moved.weight.device.type == "cpu" and moved.bias.tolist() == [1.0, 1.0]


def test_exports_follow_accelerate() -> None:
    import accel.big_modeling
    import accel.hooks

    for name in ("extract_submodules_state_dict", "retie_parameters"):
        assert getattr(accel.big_modeling, name) is getattr(ours, name)
        assert name in accel.big_modeling.__all__
    for name in ("named_module_tensors", "set_module_tensor_to_device"):
        assert getattr(accel.hooks, name) is getattr(ours, name)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_placements_match_accelerate() -> None:
    """Device indexes (0, "cuda", "cuda:0") and the tie map keyed by the device as given."""
    shared = torch.randn(5, 4)

    def steps(put: Callable[..., Any], m: nn.Module) -> None:
        tied: dict[int, dict[Any, torch.Tensor]] = {shared.data_ptr(): {}}
        put(m, "emb.weight", 0, value=shared, tied_params_map=tied)
        put(m, "head.weight", 0, value=shared, tied_params_map=tied)
        put(m, "body.0.weight", "cuda", value=torch.ones(4, 4), dtype=torch.half)
        put(m, "body.0.bias", "cuda:0", value=torch.ones(4))
        put(m, "body.1.running_var", torch.device("cuda", 0), value=torch.ones(4))
        m.body[0].bias = nn.Parameter(m.body[0].bias.detach().cpu())  # type: ignore[index]
        put(m, "body.0.bias", 0)  # a real tensor moves without a value
    got = {row[0]: row for row in _same(_meta_net, steps)}
    assert got["head.weight"][6] == "emb.weight" and got["emb.weight"][2] == "cuda"
    assert got["body.0.weight"][2:4] == ("cuda", torch.float16)
    assert got["body.0.bias"][1:3] == ("Parameter", "cuda")
