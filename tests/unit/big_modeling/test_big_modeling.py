"""init_empty_weights / init_on_device: meta-device construction without allocating weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import accel
from accel.big_modeling import init_empty_weights, init_on_device
from accel.env import LaunchEnvironmentError


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.body = nn.Linear(6, 6)
        self.norm = nn.BatchNorm1d(6)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("positions", torch.arange(5), persistent=False)


class Tagged(nn.Parameter):
    """A parameter subclass with an attribute (as quantisation libraries use)."""


class _Allocations(TorchDispatchMode):
    """Bytes of every non-meta tensor that an aten op creates while the mode is active."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and not tensor.is_meta:
                self.bytes += tensor.untyped_storage().nbytes()
        return out


def test_parameters_go_to_meta_and_buffers_stay_real_by_default() -> None:
    with init_empty_weights():
        model = Tied()
    assert all(p.is_meta for p in model.parameters())
    assert model.norm.running_mean.device.type == "cpu"
    assert torch.equal(model.positions, torch.arange(5))  # computed buffers keep their values
    assert model.body.weight.shape == (6, 6) and model.body.weight.dtype == torch.float32
    assert isinstance(model.body.weight, nn.Parameter) and model.body.weight.requires_grad
    assert nn.Module.register_parameter is nn.Module.__dict__["register_parameter"]
    assert accel.init_empty_weights is init_empty_weights  # Accelerate's top-level names
    assert accel.init_on_device is init_on_device


def test_tied_weights_stay_tied() -> None:
    with init_empty_weights():
        model = Tied()
    assert model.head.weight is model.embed.weight
    assert len(list(model.parameters())) == 5  # embed (= head), body and norm weight and bias


def test_include_buffers_puts_every_tensor_on_meta_and_allocates_nothing() -> None:
    with _Allocations() as counted, init_empty_weights(include_buffers=True):
        model = Tied()
    assert all(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert counted.bytes == 0
    with _Allocations() as control:  # the count sees a normal construction
        Tied()
    assert control.bytes > 0


def test_parameter_class_attributes_and_requires_grad_are_kept() -> None:
    with init_empty_weights():
        module = nn.Module()
        frozen = Tagged(torch.ones(3), requires_grad=False)
        frozen.quant_state = "nf4"  # type: ignore[attr-defined]
        module.frozen = frozen
    moved = module.frozen
    assert moved.is_meta and type(moved) is Tagged and not moved.requires_grad
    assert moved.quant_state == "nf4"


def test_init_on_device_takes_strings_and_devices() -> None:
    with init_on_device("cpu"):
        layer = nn.Linear(2, 3)
    assert layer.weight.device.type == "cpu" and not layer.weight.is_meta
    with init_on_device(torch.device("meta"), include_buffers=True):
        norm = nn.LayerNorm(4)
        free = torch.zeros(2)
    assert norm.weight.is_meta and free.is_meta
    with init_on_device("meta"):
        free = torch.zeros(2)
    assert not free.is_meta  # without include_buffers only parameters move


def test_patch_is_removed_when_the_block_raises() -> None:
    with pytest.raises(ValueError, match="boom"), init_empty_weights():
        raise ValueError("boom")
    assert not nn.Linear(2, 2).weight.is_meta
    with init_empty_weights(), init_on_device("cpu"):  # nested: the inner one wins, then unwinds
        inner = nn.Linear(2, 2)
    assert not inner.weight.is_meta and not nn.Linear(2, 2).weight.is_meta


def test_include_buffers_default_comes_from_the_accel_setting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_INIT_INCLUDE_BUFFERS", "1")
    with init_empty_weights():
        norm = nn.BatchNorm1d(3)
    assert norm.running_mean.is_meta
    with init_empty_weights(include_buffers=False):  # an argument beats the setting
        norm = nn.BatchNorm1d(3)
    assert not norm.running_mean.is_meta
    monkeypatch.setenv("ACCEL_INIT_INCLUDE_BUFFERS", "maybe")
    with pytest.raises(LaunchEnvironmentError, match="ACCEL_INIT_INCLUDE_BUFFERS"), \
            init_empty_weights():
        pass


def test_preparing_an_empty_model_says_how_to_fill_it() -> None:
    with init_empty_weights():
        model = Tied()
    for accelerator in (accel.Accelerator(), accel.Accelerator(device_placement=False)):
        with pytest.raises(ValueError, match=r"5 of its 5 parameters on the meta device") as err:
            accelerator.prepare(model)
        assert "cpu_ram_efficient_loading=True" in str(err.value)
        assert "model.to_empty(device=...)" in str(err.value)
    model.to_empty(device="cpu")  # filled: prepared as usual
    assert accel.Accelerator().prepare(model) is not None


def test_rank0_state_includes_non_persistent_buffers() -> None:
    from accel.strategy.rank0_load import capture_full_state, meta_tensor_names

    model = Tied()
    state = capture_full_state(model)
    assert set(state) == set(model.state_dict()) | {"positions"}
    assert state["head.weight"] is not model.head.weight  # detached views, not parameters
    assert state["head.weight"].data_ptr() == model.embed.weight.data_ptr()  # no copy
    assert not any(t.requires_grad for t in state.values())
    with init_empty_weights():
        empty = Tied()
    assert meta_tensor_names(empty) == ["embed.weight", "body.weight", "body.bias",
                                        "norm.weight", "norm.bias"]
    assert meta_tensor_names(model) == []
