"""SyncBatchNorm settings, conversion and node layouts (one process; the statistics across
processes are checked in tests/distributed/test_sync_batchnorm.py)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import accel.horovod as hvd
from accel import Accelerator
from accel.distributed import ProcessContext
from accel.distributed.batchnorm import (
    BatchNormSync,
    SyncBatchNorm,
    convert_sync_batchnorm,
    parse_mode,
)
from accel.distributed.nodes import node_group, node_partition
from accel.env import EnvSettings, LaunchEnvironmentError, read_settings
from accel.run.connector import resolve_sync_batchnorm
from accel.strategy import DDPStrategy, SingleDeviceStrategy, XLAStrategy


def _ctx(world: int = 1, rank: int = 0) -> ProcessContext:
    return ProcessContext(rank=rank, local_rank=rank, world_size=world, local_world_size=world,
                          node_rank=0, device=torch.device("cpu"), backend="gloo", launcher="none")


def _model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(2, 4, 1), nn.BatchNorm2d(4),
                         nn.Sequential(nn.BatchNorm1d(4, affine=False), nn.ReLU()))


# -- settings ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "mode"), [(True, "global"), ("global", "global"),
                                             ("NODE", "node"), (" local ", "node"),
                                             (False, None), (None, None)])
def test_parse_mode(value: bool | str | None, mode: str | None) -> None:
    assert parse_mode(value) == mode


@pytest.mark.parametrize("value", ["yes", "machine", 1, 0.5])
def test_parse_mode_refuses_other_values_naming_the_choices(value: object) -> None:
    with pytest.raises(ValueError, match="'global'.*'node'.*False"):
        parse_mode(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(("raw", "read"), [("global", "global"), ("node", "node"),
                                           ("LOCAL", "node"), ("1", "global"),
                                           ("true", "global"), ("0", "off"), ("false", "off"),
                                           ("", None)])
def test_accel_sync_batchnorm_variable(raw: str, read: str | None) -> None:
    assert read_settings({"ACCEL_SYNC_BATCHNORM": raw}).sync_batchnorm == read
    assert read_settings({}).sync_batchnorm is None


def test_accel_sync_batchnorm_variable_refuses_a_bad_value() -> None:
    with pytest.raises(LaunchEnvironmentError, match="ACCEL_SYNC_BATCHNORM.*global, node or "
                                                     "false"):
        read_settings({"ACCEL_SYNC_BATCHNORM": "machine"})


def test_constructor_beats_environment_and_says_so() -> None:
    node, off = EnvSettings(sync_batchnorm="node"), EnvSettings(sync_batchnorm="off")
    assert resolve_sync_batchnorm(None, node) == "node"
    assert resolve_sync_batchnorm(None, off) is None
    assert resolve_sync_batchnorm(None, EnvSettings()) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # agreeing sources: no warning
        assert resolve_sync_batchnorm("node", node) == "node"
        assert resolve_sync_batchnorm(False, off) is None
    with pytest.warns(UserWarning, match=r"sync_batchnorm='global'\) overrides "
                                         "ACCEL_SYNC_BATCHNORM='node'"):
        assert resolve_sync_batchnorm(True, node) == "global"
    with pytest.warns(UserWarning, match="overrides ACCEL_SYNC_BATCHNORM='node'"):
        assert resolve_sync_batchnorm(False, node) is None


def test_accelerator_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Accelerator(cpu=True).sync_batchnorm is False
    assert Accelerator(cpu=True, sync_batchnorm=True).sync_batchnorm == "global"
    monkeypatch.setenv("ACCEL_SYNC_BATCHNORM", "node")
    assert Accelerator(cpu=True).sync_batchnorm == "node"
    with pytest.raises(ValueError, match=r"Accelerator\(sync_batchnorm=...\)='nodes'"):
        Accelerator(cpu=True, sync_batchnorm="nodes")


def test_one_process_leaves_batchnorm_alone() -> None:
    model = _model()
    accelerator = Accelerator(cpu=True, sync_batchnorm="node")
    prepared = accelerator.prepare(model)
    assert type(accelerator.unwrap_model(prepared)[1]) is nn.BatchNorm2d
    assert SingleDeviceStrategy(_ctx()).convert_batchnorm(model, BatchNormSync()) is model


# -- conversion --------------------------------------------------------------------------------
def test_conversion_shares_parameters_and_buffers() -> None:
    model = _model().eval()
    bn = model[1]
    converted = convert_sync_batchnorm(model, "a group")
    first, nested = converted[1], converted[2][0]
    assert type(first) is SyncBatchNorm and type(nested) is SyncBatchNorm
    assert first.process_group == nested.process_group == "a group"
    assert first.weight is bn.weight and first.running_var is bn.running_var
    assert first.num_batches_tracked is bn.num_batches_tracked and not first.training
    assert nested.weight is None and nested.running_mean is not None
    single = convert_sync_batchnorm(nn.BatchNorm1d(3, momentum=None, eps=1e-3))
    assert type(single) is SyncBatchNorm and single.momentum is None and single.eps == 1e-3


def test_conversion_keeps_synchronised_layers_and_their_group() -> None:
    ours = SyncBatchNorm(4, process_group="mine")
    theirs = nn.SyncBatchNorm(4, process_group="theirs")
    model = convert_sync_batchnorm(nn.Sequential(ours, theirs), "other")
    assert model[0] is ours and ours.process_group == "mine"
    # torch's class cannot train on CPU: accel's takes its place, with its group and weights
    assert type(model[1]) is SyncBatchNorm and model[1].process_group == "theirs"
    assert model[1].weight is theirs.weight
    kept = convert_sync_batchnorm(nn.Sequential(theirs), "other", device="cuda")
    assert kept[0] is theirs  # where torch's kernels run, torch's layer stays


def test_conversion_on_cuda_gives_torchs_class() -> None:
    converted = convert_sync_batchnorm(nn.Sequential(nn.BatchNorm1d(3)), "g", device="cuda:0")
    assert type(converted[0]) is nn.SyncBatchNorm and converted[0].process_group == "g"


def test_strategy_converts_with_the_resolved_group_when_distributed() -> None:
    strategy = DDPStrategy(_ctx(world=2))
    model = strategy.convert_batchnorm(_model(), BatchNormSync(mode="node", group="node group"))
    assert type(model[1]) is SyncBatchNorm and model[1].process_group == "node group"
    assert type(strategy.convert_batchnorm(_model(), True)[1]) is SyncBatchNorm
    assert type(strategy.convert_batchnorm(_model(), None)[1]) is nn.BatchNorm2d


def test_xla_leaves_batchnorm_with_a_warning() -> None:
    model = _model()
    with pytest.warns(UserWarning, match="not supported on XLA"):
        assert XLAStrategy(_ctx(world=2)).convert_batchnorm(model, True) is model


def test_layer_checks_and_plain_batchnorm_without_a_group() -> None:
    layer = SyncBatchNorm(3)
    with pytest.raises(ValueError, match="at least 2D"):
        layer(torch.randn(3))
    with pytest.raises(ValueError, match="non-zero"):
        SyncBatchNorm(0)(torch.randn(2, 0))
    x = torch.randn(5, 3, 4)
    reference = nn.BatchNorm1d(3)
    torch.testing.assert_close(layer(x), reference(x))
    torch.testing.assert_close(layer.running_var, reference.running_var)


# -- node layouts ------------------------------------------------------------------------------
@pytest.mark.parametrize(("layout", "nodes"), [
    ([(0, "a"), (0, "a"), (1, "b"), (1, "b")], [[0, 1], [2, 3]]),  # torchrun, contiguous
    ([(0, "a"), (0, "b"), (1, "a"), (1, "b")], [[0, 2], [1, 3]]),  # mpirun round robin
    ([(0, "h"), (1, "h"), (0, "h"), (1, "h")], [[0, 2], [1, 3]]),  # simulated on one host
    ([(0, "a"), (0, "b"), (0, "a")], [[0, 2], [1]]),  # no local variables: hosts decide
    ([(0, "a"), (1, "a"), (2, "b"), (3, "b")], [[0], [1], [2], [3]]),  # node ranks refine hosts
    ([(0, "a")], [[0]]),
])
def test_node_partition(layout: list[tuple[int, str]], nodes: list[list[int]]) -> None:
    assert node_partition(layout) == nodes


def test_node_group_of_one_process_is_the_default_group() -> None:
    assert node_group(_ctx()) is None


def test_node_group_needs_a_running_process_group() -> None:
    with pytest.raises(RuntimeError, match="after Accelerator\\(\\) or hvd.init\\(\\)"):
        node_group(_ctx(world=2))


# -- hvd.SyncBatchNorm -------------------------------------------------------------------------
def test_hvd_sync_batchnorm_arguments() -> None:
    layer = hvd.SyncBatchNorm(3, 1e-3, 0.2, False, False)
    assert (layer.eps, layer.momentum, layer.affine, layer.track_running_stats) == \
        (1e-3, 0.2, False, False)
    assert isinstance(layer, nn.modules.batchnorm._BatchNorm) and layer.mode == "global"
    assert hvd.SyncBatchNorm(3, mode="local").mode == "node"
    with pytest.raises(ValueError, match="torch.nn.BatchNorm"):
        hvd.SyncBatchNorm(3, mode=False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="either process_set or mode='node'"):
        hvd.SyncBatchNorm(3, process_set=hvd.global_process_set, mode="node")


def test_hvd_sync_batchnorm_needs_init_to_train() -> None:
    layer = hvd.SyncBatchNorm(3)
    with pytest.raises(ValueError, match=r"use hvd.init\(\)"):
        layer(torch.randn(4, 3))
    layer.eval()
    assert layer(torch.randn(4, 3)).shape == (4, 3)  # running statistics: no session needed
    hvd.init()
    try:
        layer.train()
        x = torch.randn(4, 3, 2)
        torch.testing.assert_close(layer(x), nn.BatchNorm1d(3)(x))
    finally:
        hvd.shutdown()


# -- accel launch --sync_batchnorm -------------------------------------------------------------
def test_launch_flag_env_and_config_reach_workers() -> None:
    from accel.launch.config_file import parse_config
    from accel.launch.errors import CLIError
    from accel.launch.torchrun import worker_env
    from tests.unit.launch.test_cli import settings

    s = settings(["--cpu", "--sync_batchnorm", "node", "t.py"])
    env = worker_env(s)
    assert env["ACCEL_SYNC_BATCHNORM"] == "node" and s.sources["sync_batchnorm"] == \
        "flag --sync_batchnorm"
    assert read_settings(env).sync_batchnorm == "node"
    assert "ACCEL_SYNC_BATCHNORM" not in worker_env(settings(["--cpu", "t.py"]))
    config = parse_config({"distributed_type": "MULTI_CPU", "sync_batchnorm": "global"}, "c")
    assert worker_env(settings(["t.py"], config=config))["ACCEL_SYNC_BATCHNORM"] == "global"
    off = settings(["t.py"], {"ACCEL_SYNC_BATCHNORM": "false"}, config)
    assert worker_env(off)["ACCEL_SYNC_BATCHNORM"] == "off"  # env beats the file
    with pytest.raises(CLIError, match="not a SyncBatchNorm mode"):
        settings(["t.py"], {"ACCEL_SYNC_BATCHNORM": "machine"})
    with pytest.raises(SystemExit):
        settings(["--sync_batchnorm", "machine", "t.py"])


def test_torch_kernel_devices_run_torchs_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA-like devices the layer runs ``torch.nn.SyncBatchNorm.forward`` on itself (checked
    here by declaring the CPU such a device: without a process group torch's forward is plain
    BatchNorm, and it must find every attribute it reads on accel's layer)."""
    import accel.distributed.batchnorm as module

    calls: list[int] = []
    original = nn.SyncBatchNorm.forward

    def spy(self: nn.Module, input: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return original(self, input)  # type: ignore[arg-type]

    monkeypatch.setattr(module, "_torch_kernel_devices", lambda: ("cpu",))
    monkeypatch.setattr(nn.SyncBatchNorm, "forward", spy)
    layer, reference = SyncBatchNorm(3, momentum=None), nn.BatchNorm1d(3, momentum=None)
    x = torch.randn(6, 3)
    torch.testing.assert_close(layer(x), reference(x))
    torch.testing.assert_close(layer.running_mean, reference.running_mean)
    assert calls == [1]
