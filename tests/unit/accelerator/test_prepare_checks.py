"""prepare() refusing quantized offloaded models, the skipped-step flag seen by schedulers, and
get_state_dict of a model with offloaded weights."""

from __future__ import annotations

import pytest
import torch

from accel.accelerator.facade import Accelerator
from accel.big_modeling import cpu_offload
from accel.run.prepare import check_quantized_placement


def _quantized(device_map: dict[str, object]) -> torch.nn.Module:
    model = torch.nn.Linear(2, 2)
    model.is_loaded_in_8bit = True  # what transformers sets on a bitsandbytes model
    model.hf_device_map = device_map
    return model


@pytest.mark.parametrize("where", ["cpu", "disk"])
def test_quantized_model_with_offload_is_refused(where: str) -> None:
    acc = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="8-bit or 4-bit precision cannot be trained with CPU or "
                                         "disk offload"):
        acc.prepare_model(_quantized({"": where}))
    plain = torch.nn.Linear(2, 2)
    plain.hf_device_map = {"": "cpu"}  # not quantized: prepared as usual
    assert acc.prepare_model(plain) is plain


def test_quantized_model_over_devices_is_refused_only_when_distributed() -> None:
    model = _quantized({"a": 0, "b": 1})
    check_quantized_placement(model, distributed=False)
    with pytest.raises(ValueError, match="distributed job"):
        check_quantized_placement(model, distributed=True)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\(\)`")
def test_is_overflow_is_the_skipped_step_flag_that_schedulers_read() -> None:
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=lambda n: 1 - n / 10)
    model, opt, sched = acc.prepare(model, opt, sched)
    opt._is_overflow = True
    assert opt.step_was_skipped is True and acc.optimizer_step_was_skipped
    sched.step()
    assert sched.get_last_lr() == [1.0]  # skipped step: the schedule does not advance
    opt._is_overflow = False
    assert opt.step_was_skipped is False
    sched.step()
    assert sched.get_last_lr() == [0.9]


def test_get_state_dict_reads_offloaded_weights() -> None:
    acc = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    cpu_offload(model, execution_device="cpu")
    assert any(p.device.type == "meta" for p in model.parameters())
    state = acc.get_state_dict(model)
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[k], expected[k]) for k in expected)
    assert any(p.device.type == "meta" for p in model.parameters())  # offloaded again
