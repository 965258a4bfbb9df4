"""Single-process Accelerator behaviour: settings, prepare, precision, accumulation."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, GradScalerKwargs, InitProcessGroupKwargs


def _setup(acc: Accelerator, lr: float = 0.1) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return acc.prepare(model, opt)


def test_properties_single_process() -> None:
    acc = Accelerator(cpu=True)
    assert (acc.process_index, acc.local_process_index, acc.num_processes) == (0, 0, 1)
    assert acc.is_main_process and acc.is_local_main_process and acc.is_last_process
    assert acc.distributed_type.value == "NO" and not acc.use_distributed
    assert acc.device == torch.device("cpu") and acc.mixed_precision == "no"
    assert acc.sync_gradients and acc.gradient_accumulation_steps == 1
    assert not acc.optimizer_step_was_skipped


def test_unknown_and_conflicting_settings() -> None:
    with pytest.raises(TypeError, match="deepspeed_plugin"):
        Accelerator(cpu=True, deepspeed_plugin=object())
    with pytest.raises(TypeError, match="not an Accelerator argument"):
        Accelerator(cpu=True, foo=1)
    with pytest.raises(ValueError, match="mixed_precision"):
        Accelerator(cpu=True, mixed_precision="fp8")
    with pytest.raises(ValueError, match="either gradient_accumulation_steps"):
        from accel import GradientAccumulationPlugin
        Accelerator(cpu=True, gradient_accumulation_steps=2,
                    gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2))
    with pytest.raises(ValueError, match="disagree"):
        Accelerator(cpu=True, timeout=5, kwargs_handlers=[InitProcessGroupKwargs(timeout=7)])
    with pytest.raises(ValueError, match="two GradScalerKwargs"):
        Accelerator(cpu=True, mixed_precision="fp16",
                    kwargs_handlers=[GradScalerKwargs(), GradScalerKwargs()])
    with pytest.raises(ValueError, match="GradScalerKwargs was given"):
        Accelerator(cpu=True, kwargs_handlers=[GradScalerKwargs()])
    with pytest.raises(ValueError, match="conflicts"):
        Accelerator(cpu=True, device="cuda")


def test_env_settings_and_constructor_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("ACCEL_GRADIENT_ACCUMULATION_STEPS", "4")
    acc = Accelerator(cpu=True)
    assert acc.mixed_precision == "bf16" and acc.gradient_accumulation_steps == 4
    with pytest.warns(UserWarning, match="overrides ACCEL_MIXED_PRECISION"):
        acc = Accelerator(cpu=True, mixed_precision="no")
    assert acc.mixed_precision == "no"


def test_prepare_errors_and_order() -> None:
    acc = Accelerator(cpu=True)
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="same Linear twice"):
        acc.prepare(model, model)
    state, ema = {"a": 1}, object()  # Accelerate hands back what it does not prepare
    assert acc.prepare(state) is state
    assert acc.prepare(None, ema, None) == (None, ema, None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    dl = DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2)
    out = acc.prepare(sched, dl, opt, model)
    assert type(out[0]).__name__ == "AcceleratedScheduler"
    assert type(out[2]).__name__ == "AcceleratedOptimizer"
    assert isinstance(out[3], nn.Module) and len(list(out[1])) == 2
    assert acc.prepare(out[3]) is out[3]  # already prepared: returned unchanged


def test_bf16_autocast_on_cpu() -> None:
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    model, opt = _setup(acc)
    inner = nn.Linear(3, 1)
    with acc.autocast():
        assert inner(torch.ones(2, 3)).dtype == torch.bfloat16
    out = model(torch.ones(2, 3))
    assert out.dtype == torch.float32  # outputs converted back to fp32
    acc.backward(out.sum())
    opt.step()
    plain = acc.unwrap_model(model, keep_fp32_wrapper=False)
    assert "forward" not in plain.__dict__


def test_fp16_skipped_step_and_scheduler() -> None:
    acc = Accelerator(cpu=True, mixed_precision="fp16",
                      kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model, opt, sched = acc.prepare(model, opt, sched)
    before = [p.detach().clone() for p in model.parameters()]
    acc.backward(model(torch.ones(2, 3)).sum() * float("inf"))
    opt.step()
    sched.step()
    opt.zero_grad()
    assert acc.optimizer_step_was_skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert sched.get_last_lr() == [0.1]
    acc.backward(model(torch.ones(2, 3)).sum())
    opt.step()
    sched.step()
    assert not acc.optimizer_step_was_skipped and sched.get_last_lr() == [0.05]


def test_fp16_refuses_fp16_trainable_parameters() -> None:
    acc = Accelerator(cpu=True, mixed_precision="fp16")
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).half())
    with pytest.raises(ValueError, match=r"1\.weight, 1\.bias"):
        acc.prepare(model)


def test_clip_unscales_once_and_noop_during_accumulation(monkeypatch: pytest.MonkeyPatch) -> None:
    acc = Accelerator(cpu=True, mixed_precision="fp16", gradient_accumulation_steps=2)
    model, opt = _setup(acc)
    calls = []
    real = acc.scaler.unscale_
    monkeypatch.setattr(acc.scaler, "unscale_", lambda o: calls.append(o) or real(o))
    for i in range(4):
        with acc.accumulate(model):
            acc.backward(model(torch.ones(2, 3)).sum())
            norm = acc.clip_grad_norm_(model.parameters(), 1.0)
            acc.clip_grad_norm_(model.parameters(), 1.0)  # second call: no second unscale
            assert (norm is None) == (i % 2 == 0)
            opt.step()
            opt.zero_grad()
    assert len(calls) == 2


def test_num_items_normalises_over_the_group() -> None:
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    y = torch.randn(6, 1, generator=torch.Generator().manual_seed(1))
    ref_model = nn.Linear(3, 1)
    model = nn.Linear(3, 1)
    model.load_state_dict(ref_model.state_dict())
    nn.functional.mse_loss(ref_model(x), y, reduction="sum").div(6).backward()
    acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = acc.prepare(model)
    for part in (slice(0, 4), slice(4, 6)):  # uneven micro-batches: 4 then 2 items
        with acc.accumulate(model):
            loss = nn.functional.mse_loss(model(x[part]), y[part], reduction="sum")
            acc.backward(loss, num_items=part.stop - part.start)
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_short_last_group_is_mean_over_its_samples() -> None:
    """7 samples, batch 2, accumulate 2: last group has batches of 2 and 1... and 1 alone."""
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(0))
    y = torch.randn(7, 1, generator=torch.Generator().manual_seed(1))
    acc = Accelerator(cpu=True, gradient_accumulation_steps=3)
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    ref = nn.Linear(3, 1)
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    model, opt, dl = acc.prepare(model, opt, DataLoader(TensorDataset(x, y), batch_size=2))
    for xb, yb in dl:
        with acc.accumulate(model):
            acc.backward(nn.functional.mse_loss(model(xb), yb))
            opt.step()
            opt.zero_grad()
    for xb, yb in DataLoader(TensorDataset(x, y), batch_size=6):  # groups of 3 batches of 2
        nn.functional.mse_loss(ref(xb), yb).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    for a, b in zip(ref.parameters(), model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_scheduler_steps_num_processes_times() -> None:
    from accel.run.accumulation import AccumulationState
    from accel.run.state import RunState
    from accel.run.wrappers import AcceleratedScheduler

    opt = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    wrapped = AcceleratedScheduler(sched, [], RunState(accumulation=AccumulationState()),
                                   num_processes=2, split_batches=False)
    wrapped.step()
    assert sched.last_epoch == 2
    wrapped.split_batches = True
    wrapped.step()
    assert sched.last_epoch == 3


def test_two_accelerators_do_not_share_state() -> None:
    a = Accelerator(cpu=True, gradient_accumulation_steps=2)
    b = Accelerator(cpu=True)
    model = a.prepare(nn.Linear(1, 1))
    with a.accumulate(model):
        pass
    assert not a.sync_gradients and b.sync_gradients
    assert a.gradient_accumulation_steps == 2 and b.gradient_accumulation_steps == 1
    a.set_trigger()
    assert not b.check_trigger() and a.check_trigger()


def test_no_warning_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Accelerator(cpu=True)


def test_accel_num_threads_is_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    monkeypatch.setenv("ACCEL_NUM_THREADS", "1")
    try:
        Accelerator(cpu=True)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_save_writes_what_accelerate_writes_unless_asked_for_safetensors(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    acc = Accelerator(cpu=True, project_dir=str(tmp_path))
    model = nn.Linear(2, 1)
    acc.save({"epoch": 3, "w": torch.ones(1)}, tmp_path / "extra.pt")  # Accelerate's default
    assert torch.load(tmp_path / "extra.pt", weights_only=True)["epoch"] == 3
    acc.save(model, tmp_path / "m.bin", safe_serialization=False)  # a module: its state dict
    assert set(torch.load(tmp_path / "m.bin", weights_only=True)) == {"weight", "bias"}
    acc.save(model, tmp_path / "m.pt", safe_serialization=True)
    acc.save(model, tmp_path / "m.safetensors")  # the name asks for safetensors
    for name in ("m.pt", "m.safetensors"):
        assert torch.equal(load_file(tmp_path / name)["weight"], model.weight)
    assert not list(tmp_path.glob(".*tmp*"))  # written atomically, nothing left behind
    with pytest.warns(UserWarning, match="always safetensors"):
        acc.save_state(safe_serialization=False)


@pytest.mark.parametrize("kwargs, match", [
    ({"cpu": "yes"}, "cpu=...\\) must be True or False"),
    ({"cpu": True, "project_dir": 123}, "project_dir=...\\) must be a path"),
    ({"cpu": True, "log_with": "nonsense"}, "unknown tracker 'nonsense'"),
    ({"cpu": True, "log_with": "csv"}, "Logging with `csv` requires a `logging_dir`"),
    ({"cpu": True, "device_placement": 1}, "device_placement=...\\) must be True or False"),
])
def test_bad_argument_types_raise(kwargs: dict, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        Accelerator(**kwargs)


def test_accelerate_read_only_attributes_report_the_configuration(tmp_path: Path) -> None:
    from accel import DataLoaderConfiguration, ProjectConfiguration

    config = DataLoaderConfiguration(split_batches=True, even_batches=False, non_blocking=True,
                                     use_seedable_sampler=True, use_stateful_dataloader=True)
    project = ProjectConfiguration(project_dir=str(tmp_path), logging_dir=str(tmp_path / "logs"),
                                   iteration=3)
    acc = Accelerator(cpu=True, dataloader_config=config, project_config=project)
    assert (acc.split_batches, acc.even_batches, acc.non_blocking, acc.use_seedable_sampler,
            acc.use_stateful_dataloader, acc.dispatch_batches) == (True, False, True, True,
                                                                   True, False)
    assert (acc.project_dir, acc.logging_dir, acc.save_iteration) == \
        (str(tmp_path), str(tmp_path / "logs"), 3)
    assert (acc.multi_device, acc.should_save_model, acc.data_parallel_rank,
            acc.data_parallel_shard_rank, acc.tensor_parallel_rank, acc.context_parallel_rank,
            acc.pipeline_parallel_rank) == (False, True, 0, 0, 0, 0, 0)
    assert (acc.is_fsdp2, acc.deepspeed_plugin, acc.parallelism_config, acc.torch_device_mesh,
            acc.fp8_backend, acc.is_composable_parallelism_enabled) == \
        (False, None, None, None, None, False)
    with acc.maybe_context_parallel():
        pass
    model = nn.Linear(2, 2)
    assert acc.verify_device_map(model) is False
    model.hf_device_map = {"a": 0, "b": "cpu"}  # dispatched over two devices by a device_map
    assert acc.verify_device_map(model) is True


def test_dataloader_config_can_be_assigned_for_loaders_prepared_later() -> None:
    from torch.utils.data import DataLoader

    from accel import DataLoaderConfiguration

    acc = Accelerator(cpu=True)
    before = acc.prepare(DataLoader(list(range(6)), batch_size=2))
    acc.dataloader_config = DataLoaderConfiguration(even_batches=False)
    after = acc.prepare(DataLoader(list(range(6)), batch_size=2))
    assert acc.even_batches is False and acc.dataloader_config.even_batches is False
    assert before._config.even_batches is True and after._config.even_batches is False
    with pytest.raises(TypeError, match="DataLoaderConfiguration"):
        acc.dataloader_config = {"even_batches": False}  # type: ignore[assignment]


def test_state_debug_and_distributed_type_can_be_set_as_in_accelerate() -> None:
    import os

    from accel import AcceleratorState, DistributedType, GradientState, PartialState
    from accel.distributed.debug import consistency_check

    from accel.compat.operations import COMMUNICATORS

    acc = Accelerator(cpu=True)
    environment = dict(os.environ)
    acc.state.debug = True
    # module-level collectives (accel.utils) follow through their communicator, not os.environ
    assert acc.state.debug and consistency_check in acc._rt.comm.hooks
    assert consistency_check in COMMUNICATORS.current().hooks
    assert dict(os.environ) == environment
    acc.state.debug = False
    assert not acc.state.debug and consistency_check not in acc._rt.comm.hooks
    assert consistency_check not in COMMUNICATORS.current().hooks
    assert dict(os.environ) == environment
    acc.state.distributed_type = "FSDP"
    assert acc.distributed_type is DistributedType.FSDP
    with pytest.warns(UserWarning, match="only supported for multi-GPU.*FSDP") as caught:
        with acc.join_uneven_inputs([]):
            pass
    assert caught[0].filename == __file__  # points at the caller's line
    acc.state.distributed_type = DistributedType.NO
    for cls in (PartialState, AcceleratorState, GradientState):
        cls._reset_state()  # nothing shared to reset: the Accelerator keeps working
    assert acc.prepare(nn.Linear(1, 1)) is not None
