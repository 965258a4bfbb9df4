"""PartialState, AcceleratorState and GradientState (Accelerate's names) as views without global
state, at world size 1; the two-process behaviour is in tests/distributed/test_state.py."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, DistributedType, GradientAccumulationPlugin
from accel.state import AcceleratorState, GradientState, PartialState

#: Accelerate 1.15's DistributedType, member by member.
ACCELERATE_TYPES = ["NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA",
                    "MULTI_MUSA", "MULTI_XPU", "DEEPSPEED", "FSDP", "XLA", "MEGATRON_LM",
                    "MULTI_HPU", "MULTI_NEURON"]


def test_partial_state_describes_a_single_process() -> None:
    state = PartialState(cpu=True)
    assert (state.process_index, state.local_process_index, state.num_processes) == (0, 0, 1)
    assert state.device == torch.device("cpu")
    assert state.distributed_type is DistributedType.NO and state.backend is None
    assert state.is_main_process and state.is_local_main_process and state.is_last_process
    assert not state.use_distributed and not state.debug and state.initialized
    assert "process_index=0" in repr(state)


def test_partial_state_debug_follows_accel_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_DEBUG", "1")
    assert PartialState(cpu=True).debug


def test_partial_state_process_control_in_one_process(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    state = PartialState(cpu=True)
    assert state.wait_for_everyone() is None
    with state.main_process_first(), state.local_main_process_first():
        pass
    inputs = {"a": [1, 2, 3]}
    with state.split_between_processes(inputs, apply_padding=True) as mine:
        assert mine is inputs  # one process: unchanged, whatever the type
    state.print("hello", 1)
    assert capsys.readouterr().out == "hello 1\n"
    state.destroy_process_group()  # no group at world size 1: nothing to do
    assert not dist.is_initialized()


def test_partial_state_decorators_run_everywhere_in_one_process() -> None:
    state = PartialState(cpu=True)

    def f(x: int) -> int:
        return x + 1

    assert state.on_main_process(f)(1) == 2
    assert state.on_local_main_process(f)(1) == 2
    assert state.on_last_process(f)(1) == 2
    # As in Accelerate: without distribution every process index runs.
    assert state.on_process(f, process_index=0)(1) == 2
    assert state.on_process(process_index=1)(f)(1) == 2
    assert state.on_local_process(local_process_index=3)(f)(1) == 2
    with pytest.raises(ValueError, match="process_index=<rank>"):
        state.on_process(f)
    with pytest.raises(ValueError, match="local_process_index="):
        state.on_local_process(f)


def test_partial_state_arguments_are_checked() -> None:
    assert PartialState(cpu=True, timeout=60, backend=None).num_processes == 1
    with pytest.raises(TypeError, match="InitProcessGroupKwargs"):
        PartialState(cpu=True, bogus=1)
    with pytest.raises(TypeError, match="cpu must be True or False"):
        PartialState(cpu="yes")  # type: ignore[arg-type]


def test_two_partial_states_agree_and_share_nothing_mutable() -> None:
    first, second = PartialState(cpu=True), PartialState(cpu=True)
    assert first is not second and first.__dict__ is not second.__dict__
    keys = ("process_index", "local_process_index", "num_processes", "device",
            "distributed_type", "backend", "is_main_process")
    assert {k: getattr(first, k) for k in keys} == {k: getattr(second, k) for k in keys}


def test_accelerator_after_partial_state_sees_the_same_process() -> None:
    state = PartialState(cpu=True)
    accelerator = Accelerator(cpu=True)
    assert not accelerator._rt.group.owned and not dist.is_initialized()  # nothing to adopt
    assert (accelerator.process_index, accelerator.num_processes, accelerator.device) == \
        (state.process_index, state.num_processes, state.device)
    assert accelerator.state.process_index == state.process_index


def test_accelerator_state_is_a_view_of_its_runtime() -> None:
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    state = accelerator.state
    assert isinstance(state, AcceleratorState) and isinstance(state, PartialState)
    assert state.mixed_precision == "bf16" == accelerator.mixed_precision
    assert state.distributed_type is accelerator.distributed_type
    assert state._process.comm is accelerator._rt.comm  # one communicator (and stall monitor)
    assert (state.process_index, state.num_processes, state.device) == \
        (accelerator.process_index, accelerator.num_processes, accelerator.device)
    assert state.dynamo_plugin is accelerator.state.dynamo_plugin
    assert state.dynamo_plugin.backend == "NO"  # TorchDynamoPlugin(): nothing compiled
    for name in ("deepspeed_plugin", "deepspeed_plugins", "fsdp_plugin",
                 "megatron_lm_plugin", "torch_tp_plugin", "parallelism_config", "device_mesh"):
        assert getattr(state, name) is None, name
    assert state.is_fsdp2 is False
    assert "mixed_precision='bf16'" in repr(state)
    assert Accelerator(cpu=True).state.mixed_precision == "no"  # each Accelerator its own view


def test_standalone_accelerator_state(monkeypatch: pytest.MonkeyPatch) -> None:
    assert AcceleratorState(cpu=True).mixed_precision == "no"
    assert AcceleratorState(mixed_precision="fp16", cpu=True).mixed_precision == "fp16"
    monkeypatch.setenv("ACCEL_MIXED_PRECISION", "bf16")
    assert AcceleratorState(cpu=True).mixed_precision == "bf16"
    assert AcceleratorState(cpu=True, fsdp_plugin=None).fsdp_plugin is None
    with pytest.raises(TypeError, match="fsdp_plugin must be a FullyShardedDataParallelPlugin"):
        AcceleratorState(cpu=True, fsdp_plugin=object())
    with pytest.raises(TypeError, match="deepspeed_plugin=.*not supported"):
        AcceleratorState(cpu=True, deepspeed_plugin=object())


def test_accelerator_process_helpers_delegate_to_its_state() -> None:
    accelerator = Accelerator(cpu=True)
    assert accelerator.on_process(process_index=1)(lambda: "ran")() == "ran"  # as Accelerate
    assert accelerator.on_local_process(lambda: "ran", local_process_index=0)() == "ran"
    assert accelerator.on_main_process(lambda: "ran")() == "ran"
    with accelerator.main_process_first(), accelerator.local_main_process_first():
        pass
    with accelerator.split_between_processes([1, 2, 3]) as mine:
        assert mine == [1, 2, 3]


def test_gradient_state_is_bound_to_the_accelerator() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    grad = accelerator.gradient_state
    assert isinstance(grad, GradientState) and grad is accelerator.gradient_state
    assert (grad.num_steps, grad.adjust_scheduler, grad.sync_with_dataloader) == (2, True, True)
    assert grad.plugin_kwargs == {"num_steps": 2, "adjust_scheduler": True,
                                  "sync_with_dataloader": True, "sync_each_batch": False}
    grad.sync_gradients = False
    assert accelerator.sync_gradients is False
    accelerator.sync_gradients = True
    assert grad.sync_gradients is True
    accelerator.gradient_accumulation_steps = 3
    assert grad.num_steps == 3


def test_two_accelerators_gradient_states_are_independent() -> None:
    a, b = Accelerator(cpu=True), Accelerator(cpu=True, gradient_accumulation_steps=4)
    a.gradient_state.sync_gradients = False
    assert b.gradient_state.sync_gradients is True and b.sync_gradients is True
    assert (a.gradient_state.num_steps, b.gradient_state.num_steps) == (1, 4)


def test_gradient_state_follows_the_active_loader() -> None:
    accelerator = Accelerator(cpu=True)
    data = TensorDataset(torch.arange(6.0).unsqueeze(1))
    loader = accelerator.prepare(DataLoader(data, batch_size=2))
    grad = accelerator.gradient_state
    assert (grad.in_dataloader, grad.active_dataloader, grad.end_of_dataloader,
            grad.remainder) == (False, None, False, -1)
    seen = []
    for _ in loader:
        assert grad.in_dataloader and grad.active_dataloader is loader and grad.remainder == 0
        seen.append(grad.end_of_dataloader)
    assert seen == [False, False, True] and not grad.in_dataloader


def test_standalone_gradient_states_are_independent() -> None:
    first = GradientState(GradientAccumulationPlugin(num_steps=4, adjust_scheduler=False))
    second = GradientState()
    first.sync_gradients = False
    assert (first.num_steps, first.adjust_scheduler, first.sync_gradients) == (4, False, False)
    assert (second.num_steps, second.sync_gradients, second.initialized) == (1, True, True)
    assert "sync_gradients=False" in repr(first)


def test_distributed_type_has_accelerates_members_and_values() -> None:
    assert [member.name for member in DistributedType] == ACCELERATE_TYPES
    assert all(DistributedType[name].value == name for name in ACCELERATE_TYPES)
    assert DistributedType.MULTI_XLA is DistributedType.XLA  # accel's older name, an alias
    accelerator = Accelerator(cpu=True)
    assert accelerator.distributed_type == DistributedType.NO
    assert accelerator.distributed_type == "NO"  # a str enum, as Accelerate's
    assert accelerator.distributed_type != DistributedType.DEEPSPEED
    assert accelerator.state.distributed_type not in (DistributedType.FSDP,
                                                      DistributedType.MEGATRON_LM)


def test_state_classes_are_exported_lazily() -> None:
    accel = importlib.import_module("accel")
    module = importlib.import_module("accel.state")
    for name in ("PartialState", "AcceleratorState", "GradientState"):
        assert getattr(accel, name) is getattr(module, name) and name in accel.__all__


def test_standalone_state_reports_the_fsdp_plugin_accel_launch_asked_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_USE_FSDP", "1")
    monkeypatch.setenv("ACCEL_FSDP_RESHARD_AFTER_FORWARD", "false")
    state = AcceleratorState(cpu=True)
    assert state.is_fsdp2 and state.fsdp_plugin is not None
    assert state.fsdp_plugin.reshard_after_forward is False
