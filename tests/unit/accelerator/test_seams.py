"""The per-axis interfaces of issue 13: strategies, precision modes, the connector, run state.

Each test pins a behaviour the facade now gets only through these interfaces (no backend
branches of its own), so a new strategy or precision mode is checked against the same contract.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from accel import Accelerator
from accel.compat.distributed_type import DistributedType, distributed_type_of
from accel.config import GradientAccumulationPlugin, PrecisionType, ProjectConfiguration
from accel.device.mps import MPSDevice
from accel.distributed import ProcessContext
from accel.precision import BF16Precision, FP16Precision, NoPrecision, Precision, make_precision
from accel.run.accumulation import AccumulationState
from accel.run.connector import Arguments, connect
from accel.run.state import RunState
from accel.strategy import DDPStrategy, SingleDeviceStrategy, Strategy, XLAStrategy, select_strategy


def _ctx(world: int = 1, device: str = "cpu") -> ProcessContext:
    return ProcessContext(rank=0, local_rank=0, world_size=world, local_world_size=world,
                          node_rank=0, device=torch.device(device), backend="gloo", launcher="none")


def test_strategy_is_abstract_and_selected_in_one_place() -> None:
    with pytest.raises(TypeError, match="abstract"):
        Strategy(_ctx())  # type: ignore[abstract]
    assert type(select_strategy(_ctx())) is SingleDeviceStrategy
    assert type(select_strategy(_ctx(2))) is DDPStrategy
    assert type(select_strategy(_ctx(1, "xla"))) is XLAStrategy


@pytest.mark.parametrize(("world", "device", "expected"), [
    (1, "cpu", DistributedType.NO), (2, "cpu", DistributedType.MULTI_CPU),
    (2, "cuda", DistributedType.MULTI_GPU), (1, "xla", DistributedType.XLA),
    (4, "xla", DistributedType.XLA)])
def test_distributed_type_is_derived_from_the_strategy_at_the_boundary(
        world: int, device: str, expected: DistributedType) -> None:
    strategy = select_strategy(_ctx(world, device))
    assert distributed_type_of(strategy) is expected
    assert not hasattr(strategy, "distributed_type")  # the engine knows no Accelerate names
    assert strategy.replicates_model is (strategy.name in ("single", "ddp"))


def test_an_unknown_strategy_has_no_distributed_type() -> None:
    class Custom(SingleDeviceStrategy):
        name = "custom"

    with pytest.raises(ValueError, match="'custom' has no Accelerate DistributedType"):
        distributed_type_of(Custom(_ctx()))


def test_single_device_strategy_operations_are_plain_torch() -> None:
    strategy = select_strategy(_ctx())
    model = strategy.wrap_model(nn.Linear(3, 2), sync_batchnorm=True)  # no SyncBN at world 1
    compiled_like = nn.Module()
    compiled_like._orig_mod = model  # what torch.compile's wrapper holds
    assert strategy.unwrap(compiled_like) is model
    with strategy.no_sync(model), strategy.trigger_sync(model), strategy.join([model]):
        model(torch.ones(1, 3)).sum().backward()
    norm = strategy.clip_grad_norm_(model.parameters(), 1e-3)
    assert norm > 1e-3
    assert torch.linalg.vector_norm(
        torch.cat([p.grad.flatten() for p in model.parameters()])) <= 1e-3 + 1e-6
    state = strategy.model_state_dict(compiled_like)
    assert set(state) == {"weight", "bias"}
    fresh = nn.Linear(3, 2)
    result = strategy.load_model_state_dict(fresh, state=state)
    assert not result.missing_keys and torch.equal(fresh.weight, model.weight)


def test_with_placement_keeps_the_strategy_kind() -> None:
    strategy = select_strategy(_ctx(2))
    unplaced = strategy.with_placement(False)
    assert type(unplaced) is DDPStrategy and not unplaced.place
    assert strategy.with_placement(True) is strategy


def test_precision_owns_its_forward_wrapper_and_its_removal() -> None:
    cpu = torch.device("cpu")
    with pytest.raises(TypeError, match="abstract"):
        Precision(cpu)  # type: ignore[abstract]
    full = make_precision("no", device=cpu)
    model = nn.Linear(2, 2)
    assert isinstance(full, NoPrecision) and full.wrap_forward(model) is model
    assert "forward" not in model.__dict__  # nothing installed in full precision
    bf16 = make_precision("bf16", device=cpu)
    assert isinstance(bf16, BF16Precision)
    bf16.wrap_forward(model)
    out = model(torch.ones(1, 2))
    assert out.dtype == torch.float32  # computed in bf16, handed back in fp32
    bf16.unwrap_forward(model)
    assert "forward" not in model.__dict__


def test_make_precision_asks_the_device_kind() -> None:
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="not supported on mps"):
        make_precision("fp16", device=torch.device("mps"), hardware=MPSDevice())
    fp16 = make_precision(PrecisionType.FP16, device=cpu)
    assert isinstance(fp16, FP16Precision) and fp16.scaler is not None
    with pytest.raises(ValueError, match="float32 trainable parameters"):
        fp16.check_model(nn.Linear(2, 2).half())


def test_connector_resolves_without_touching_the_users_objects(tmp_path: Path) -> None:
    plugin = GradientAccumulationPlugin()  # num_steps=None: resolved to 1, plugin untouched
    project = ProjectConfiguration()
    options, runtime = connect(Arguments(cpu=True, project_dir=str(tmp_path),
                                         project_config=project,
                                         gradient_accumulation_plugin=plugin))
    assert plugin.num_steps is None and project.project_dir is None
    assert options.accumulation.num_steps == 1
    assert options.project.project_dir == str(tmp_path) == options.project.logging_dir
    assert dataclasses.is_dataclass(runtime)
    with pytest.raises(dataclasses.FrozenInstanceError):
        runtime.strategy = None  # type: ignore[misc]
    assert runtime.context.device == torch.device("cpu")


def test_connector_warns_when_the_constructor_overrides_accel_launch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_TIMEOUT", "60")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Accelerator(cpu=True, timeout=30)
    mine = [w for w in caught if "overrides ACCEL_TIMEOUT" in str(w.message)]
    assert len(mine) == 1 and mine[0].filename == __file__  # points at the user's line


def test_run_state_is_owned_per_accelerator_and_restored_explicitly() -> None:
    a, b = Accelerator(cpu=True), Accelerator(cpu=True)
    model, opt = a.prepare(nn.Linear(2, 1), torch.optim.SGD(nn.Linear(2, 1).parameters(), 0.1))
    assert a._run.models == [model] and a._run.optimizers == [opt] and b._run.models == []
    run = RunState(accumulation=AccumulationState(num_steps=4))
    run.optimizers.append(opt)
    run.restored(Path("ckpt"), accumulation_step=3, optimizer_steps=7)
    assert (run.accumulation.step, opt.steps_taken, run.loaded_dir) == (3, 7, Path("ckpt"))


def test_autocast_forward_survives_deepcopy_and_pickle() -> None:
    """An EMA copy of a prepared bf16 model runs its own weights; a pickled one too."""
    import copy
    import inspect
    import pickle

    acc = Accelerator(cpu=True, mixed_precision="bf16")
    model = acc.prepare(nn.Linear(2, 1))
    ema = copy.deepcopy(model)
    with torch.no_grad():
        ema.weight.zero_()
        ema.bias.zero_()
    x = torch.ones(1, 2)
    assert ema(x).item() == 0.0 and model(x).item() != 0.0  # not the original's forward
    twin = pickle.loads(pickle.dumps(model))
    assert torch.equal(twin(x), model(x)) and twin(x).dtype == torch.float32
    assert list(inspect.signature(model.forward).parameters) == ["input"]
    acc.unwrap_model(twin, keep_fp32_wrapper=False)
    assert "forward" not in twin.__dict__
    clone = pickle.loads(pickle.dumps(acc))  # the Accelerator itself (for DataLoader workers)
    assert (clone.process_index, clone.mixed_precision, clone._run.models) == (0, "bf16", [])


def test_dynamo_settings_from_accel_launch_are_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    from accel.utils import is_compiled_module

    monkeypatch.setenv("ACCEL_DYNAMO_BACKEND", "eager")  # accel launch --dynamo_backend eager
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # applied, so nothing to warn about
        accelerator = Accelerator(cpu=True)
    assert is_compiled_module(accelerator.prepare(nn.Linear(2, 1)))
    monkeypatch.setenv("ACCEL_DYNAMO_BACKEND", "no")
    net = nn.Linear(2, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Accelerator(cpu=True).prepare(net) is net
