"""Hooks attached module by module, layerwise casting, the recurrent-layer check and the
offload folder format (accel.big_modeling.attach, structure, offload)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import accel.hooks
from accel.big_modeling import (
    AlignDevicesHook,
    LayerwiseCastingHook,
    OffloadedWeightsLoader,
    _refuse_recurrent_layers_under_sequence_parallelism,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
    attach_layerwise_casting_hooks,
    cpu_offload,
    disk_offload,
    init_empty_weights,
    load_offloaded_weight,
    offload_weight,
    remove_hook_from_submodules,
    save_offload_index,
)
from accel.big_modeling.state_dicts import get_state_dict_offloaded_model
from accel.big_modeling.structure import (
    compute_module_total_buffer_size,
    get_non_persistent_buffers,
)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(3, 4)
        self.batchnorm = nn.BatchNorm1d(4)
        self.linear2 = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.batchnorm(self.linear1(x)))


def _net() -> Net:
    torch.manual_seed(0)
    return Net().eval()


def test_accelerate_paths_name_the_attach_functions() -> None:
    for name in ("attach_align_device_hook", "attach_align_device_hook_on_blocks",
                 "attach_execution_device_hook", "LayerwiseCastingHook"):
        assert getattr(accel.hooks, name) is globals()[name]


def test_attach_align_device_hook_offloads_each_layer_and_keeps_outputs() -> None:
    model = _net()
    x = torch.randn(2, 3)
    expected = model(x)
    attach_align_device_hook(model, execution_device="cpu", offload=True)
    assert not hasattr(model, "_hf_hook")  # no tensors of its own
    assert all(isinstance(m._hf_hook, AlignDevicesHook)
               for m in (model.linear1, model.batchnorm, model.linear2))
    assert model.linear1.weight.device.type == "meta"
    assert model.batchnorm.running_mean.device.type == "cpu"  # buffers are not offloaded
    torch.testing.assert_close(model(x), expected)
    remove_hook_from_submodules(model)
    assert model.linear1.weight.device.type == "cpu"
    torch.testing.assert_close(model(x), expected)


def test_attach_align_device_hook_reads_a_weights_map_by_full_name() -> None:
    model = _net()
    x = torch.randn(2, 3)
    expected = model(x)
    weights = {name: t.detach().clone() for name, t in model.state_dict().items()}
    attach_align_device_hook(model, execution_device="cpu", offload=True, weights_map=weights,
                             offload_buffers=True)
    assert model.batchnorm.running_mean.device.type == "meta"
    torch.testing.assert_close(model(x), expected)


def test_preload_module_classes_get_one_hook_for_their_subtree() -> None:
    model = nn.Sequential(_net())
    attach_align_device_hook(model, execution_device="cpu", offload=True,
                             preload_module_classes=["Net"])
    assert model[0]._hf_hook.place_submodules and not hasattr(model[0].linear1, "_hf_hook")
    assert model(torch.randn(2, 3)).shape == (2, 5)


def test_attach_execution_device_hook_skips_hooked_modules() -> None:
    model = _net()
    attach_align_device_hook(model.linear1, execution_device="cpu", offload=True)
    first = model.linear1._hf_hook
    attach_execution_device_hook(model, "cpu")
    assert model.linear1._hf_hook is first and not model.batchnorm._hf_hook.offload
    assert model._hf_hook.execution_device == torch.device("cpu")


def test_attach_on_blocks_with_per_block_maps() -> None:
    model = _net()
    x = torch.randn(2, 3)
    expected = model(x)
    attach_align_device_hook_on_blocks(
        model, execution_device={"": "cpu", "linear1": "cpu", "batchnorm": "cpu",
                                 "linear2": "cpu"},
        offload={"linear1": True, "batchnorm": False, "linear2": False})
    assert model._hf_hook.io_same_device
    assert model.linear1.weight.device.type == "meta"
    assert model.linear2._hf_hook.place_submodules and not model.linear2._hf_hook.offload
    torch.testing.assert_close(model(x), expected)


def test_attach_on_blocks_with_one_device_hooks_the_whole_module() -> None:
    model = _net()
    attach_align_device_hook_on_blocks(model, execution_device="cpu")
    assert model._hf_hook.place_submodules and not hasattr(model.linear1, "_hf_hook")


@pytest.mark.parametrize("skip", [None, ["batchnorm", "linear1"], "linear2"])
def test_layerwise_casting_stores_low_and_computes_high(skip: list[str] | str | None) -> None:
    model = _net()
    x = torch.randn(2, 3)
    attach_layerwise_casting_hooks(model, storage_dtype=torch.float16,
                                   compute_dtype=torch.float32, skip_modules_pattern=skip)
    skipped = {"linear1"} if skip == ["batchnorm", "linear1"] else {"linear2"} if skip else set()
    for name in ("linear1", "linear2"):
        layer = model.get_submodule(name)
        want = torch.float32 if name in skipped else torch.float16
        assert layer.weight.dtype == want and layer.bias.dtype == want
        assert isinstance(getattr(layer, "_hf_hook", None), LayerwiseCastingHook) != \
            (name in skipped)
    assert model.batchnorm.weight.dtype == torch.float32  # not a casting layer
    with torch.no_grad():
        assert model(x).dtype == torch.float32
    assert model.linear1.weight.dtype == (torch.float32 if "linear1" in skipped
                                          else torch.float16)


def test_constants_path_names_the_same_casting_layers() -> None:
    from accel.big_modeling.attach import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING as ours
    from accel.utils.constants import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING as theirs
    assert ours == theirs


def test_layerwise_casting_skips_classes() -> None:
    model = _net()
    attach_layerwise_casting_hooks(model, torch.bfloat16, torch.float32,
                                   skip_modules_classes=(nn.Linear,))
    assert model.linear1.weight.dtype == torch.float32 and not hasattr(model.linear1, "_hf_hook")


def test_recurrent_layers_are_refused() -> None:
    def model(kinds: list[str] | None) -> SimpleNamespace:
        config = SimpleNamespace(layer_types=kinds)
        config.get_text_config = lambda: config
        return SimpleNamespace(config=config)

    with pytest.raises(ValueError, match="linear_attention.*sequence parallelism"):
        _refuse_recurrent_layers_under_sequence_parallelism(
            model(["full_attention", "linear_attention"]))  # type: ignore[arg-type]
    for kinds in (["full_attention"], None):
        _refuse_recurrent_layers_under_sequence_parallelism(model(kinds))  # type: ignore[arg-type]
    _refuse_recurrent_layers_under_sequence_parallelism(nn.Linear(2, 2))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float8_e4m3fn,
                                   torch.int64, torch.bool])
def test_offload_folders_use_accelerates_raw_format(tmp_path: Path, dtype: torch.dtype) -> None:
    weight = torch.randn(2, 3).to(dtype)
    index = offload_weight(weight, "layer.weight", tmp_path, {})
    assert index == {"layer.weight": {"dtype": str(dtype)[6:], "shape": [2, 3]}}
    back = load_offloaded_weight(tmp_path / "layer.weight.dat", index["layer.weight"])
    assert back.dtype == dtype and torch.equal(back.view(torch.uint8), weight.view(torch.uint8))
    odd = offload_weight(torch.tensor(3.0), "a/b", tmp_path)  # not a safe file name; a scalar
    assert odd["a/b"]["file"] == "a_b.dat" and odd["a/b"]["shape"] == []
    save_offload_index({**index, **odd}, tmp_path)
    loader = OffloadedWeightsLoader(save_folder=tmp_path)
    assert loader["a/b"].item() == 3.0 and torch.equal(loader["layer.weight"].view(torch.uint8),
                                                       weight.view(torch.uint8))


def test_state_dict_of_an_offloaded_model_reads_the_weights_back(tmp_path: Path) -> None:
    for offload in ("cpu", "disk"):
        model = nn.Sequential(_net(), nn.Linear(5, 2))
        model[0].batchnorm.register_buffer("scratch", torch.ones(1), persistent=False)
        expected = {k: v.clone() for k, v in model.state_dict().items()}
        if offload == "cpu":
            cpu_offload(model)
        else:
            disk_offload(model, tmp_path)
        assert model[1].weight.is_meta
        got = get_state_dict_offloaded_model(model)
        assert list(got) == list(expected)
        assert all(torch.equal(got[k], v) for k, v in expected.items())
        assert model[1].weight.is_meta  # still offloaded
    with init_empty_weights():
        empty = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="no offload hook holds"):
        get_state_dict_offloaded_model(empty)


def test_buffer_helpers() -> None:
    model = nn.Sequential(_net())
    model[0].batchnorm.register_buffer("scratch", torch.zeros(10), persistent=False)
    assert get_non_persistent_buffers(model) == set()
    assert get_non_persistent_buffers(model, recurse=True) == {"scratch"}
    assert get_non_persistent_buffers(model, recurse=True, fqns=True) == {"0.batchnorm.scratch"}
    assert compute_module_total_buffer_size(model) == 4 * 4 * 2 + 8 + 40
    assert compute_module_total_buffer_size(model.half()) == 2 * 4 * 2 + 8 + 20


def test_checkpoint_loaded_to_disk_stores_a_tied_weight_once(tmp_path: Path) -> None:
    import json

    from safetensors.torch import save_file

    from accel.big_modeling import load_checkpoint_in_model

    def tied() -> nn.Sequential:
        model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
        model[1].weight = model[0].weight
        return model

    source = tied()
    state = {k: v for k, v in source.state_dict().items() if k != "1.weight"}
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "m.safetensors"))
    with init_empty_weights():
        model = tied()
    load_checkpoint_in_model(model, tmp_path / "m.safetensors", device_map={"": "disk"},
                             offload_folder=tmp_path / "off")
    index = json.loads((tmp_path / "off" / "index.json").read_text())
    files = {entry.get("file", f"{name}.dat") for name, entry in index.items()}
    assert files == {"0.weight.dat", "0.bias.dat", "1.bias.dat"}
    loader = OffloadedWeightsLoader(save_folder=tmp_path / "off")
    assert torch.equal(loader["1.weight"], source[0].weight.detach())
