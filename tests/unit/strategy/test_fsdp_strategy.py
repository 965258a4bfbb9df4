"""The FSDP strategy's choices and refusals that need no process group: unit selection,
ignored modules, strategy selection and the optimizer check (training itself is tested with
real processes in tests/distributed/test_fsdp.py)."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from torch import nn

from accel.config import PrecisionType
from accel.config.fsdp import FullyShardedDataParallelPlugin, ParallelismConfig
from accel.distributed import ProcessContext
from accel.strategy import FSDPStrategy, select_strategy
from accel.strategy.fsdp_units import ignored_parameters, select_units


class Block(nn.Module):
    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class Net(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def _names(model: nn.Module, **kwargs: object) -> list[str]:
    plugin = FullyShardedDataParallelPlugin(**kwargs)  # type: ignore[arg-type]
    ignored, _ = ignored_parameters(model, plugin)
    return [name for name, _ in select_units(model, plugin, ignored)]


def test_units_by_class_name_bottom_up_and_from_no_split_modules() -> None:
    model = Net()
    assert _names(model, transformer_cls_names_to_wrap=["Block"]) == ["blocks.0", "blocks.1"]
    assert _names(model, auto_wrap_policy="TRANSFORMER_BASED_WRAP") == ["blocks.0", "blocks.1"]
    assert _names(model) == []  # no_wrap: only the root
    nested = nn.Sequential(Block(), nn.Sequential(Block()))
    assert _names(nested, auto_wrap_policy="size_based_wrap", min_num_params=1) == \
        ["0.lin", "1.0.lin"]  # children first; a parent with no free parameters is no unit


def test_a_class_name_that_names_no_module_is_refused_with_the_classes_there_are() -> None:
    with pytest.raises(ValueError, match=r"names \['Layer'\].*Block, Embedding, Linear"):
        _names(Net(), transformer_cls_names_to_wrap=["Layer"])
    with pytest.raises(ValueError, match="transformer_cls_names_to_wrap=\\['MyBlock'\\]"):
        _names(nn.Sequential(Block()), auto_wrap_policy="transformer_based_wrap")


def test_a_module_with_a_tied_weight_used_outside_it_is_never_a_unit() -> None:
    class Embed(nn.Embedding):
        pass

    model = nn.Sequential(Embed(10, 4), Block(), nn.Linear(4, 10, bias=False))
    model[2].weight = model[0].weight
    with pytest.warns(UserWarning, match=r"0 \(Embed\) is not sharded as a unit.*2\.weight"):
        assert _names(model, transformer_cls_names_to_wrap=["Embed", "Block"]) == ["1"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # size-based: skipped silently
        assert _names(model, auto_wrap_policy="size_based_wrap", min_num_params=1) == ["1.lin"]


def test_callable_policies_simple_and_torch_fsdp1_style() -> None:
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    model = Net()
    assert _names(model, auto_wrap_policy=lambda m: isinstance(m, Block)) == \
        ["blocks.0", "blocks.1"]
    fsdp1 = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    assert _names(model, auto_wrap_policy=fsdp1) == ["blocks.0", "blocks.1"]


def test_ignored_modules_by_object_or_regex_and_their_errors() -> None:
    model = Net()
    plugin = FullyShardedDataParallelPlugin(ignored_modules=[model.blocks[1]])
    modules, params = ignored_parameters(model, plugin)
    assert modules == {model.blocks[1]} and params == set(model.blocks[1].parameters())
    assert _names(model, transformer_cls_names_to_wrap=["Block"],
                  ignored_modules=[model.blocks[1]]) == ["blocks.0"]
    modules, _ = ignored_parameters(model, FullyShardedDataParallelPlugin(
        ignored_modules=r"blocks\.\d"))
    assert modules == set(model.blocks)
    with pytest.raises(ValueError, match="matches no module name"):
        ignored_parameters(model, FullyShardedDataParallelPlugin(ignored_modules="nothing"))
    with pytest.raises(ValueError, match="not part of the model"):
        ignored_parameters(model, FullyShardedDataParallelPlugin(ignored_modules=[Block()]))


def _ctx(world: int = 2, device: str = "cpu") -> ProcessContext:
    return ProcessContext(rank=0, local_rank=0, world_size=world, local_world_size=world,
                          node_rank=0, device=torch.device(device), backend="gloo",
                          launcher="torchrun")


def test_strategy_selection_and_its_refusals() -> None:
    plugin = FullyShardedDataParallelPlugin()
    strategy = select_strategy(_ctx(), fsdp_plugin=plugin, precision=PrecisionType.BF16)
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.name == "fsdp" and not strategy.replicates_model
    assert (strategy.distributed_state, strategy.sharded_state) == (True, True)
    assert strategy.with_placement(False).plugin is plugin
    assert select_strategy(_ctx(), fsdp_plugin=FullyShardedDataParallelPlugin(
        state_dict_type="FULL_STATE_DICT")).sharded_state is False
    # a mesh that shards means FSDP; one that only replicates is DDP
    assert isinstance(select_strategy(_ctx(4), parallelism=ParallelismConfig(
        dp_replicate_size=2)), FSDPStrategy)
    assert select_strategy(_ctx(2), parallelism=ParallelismConfig(
        dp_replicate_size=2)).name == "ddp"
    with pytest.raises(ValueError, match="on XLA drop the plugin"):
        select_strategy(_ctx(device="xla"), fsdp_plugin=plugin)
    # one process: FSDP2 on a one-device mesh, with one warning (Accelerate runs the script)
    with pytest.warns(UserWarning, match="FSDP on one process") as caught:
        single = select_strategy(_ctx(1), fsdp_plugin=plugin)
    assert len(caught) == 1 and isinstance(single, FSDPStrategy)
    assert single.name == "fsdp"
    with pytest.raises(ValueError, match="does not fit 4 processes"):
        select_strategy(_ctx(4), fsdp_plugin=plugin,
                        parallelism=ParallelismConfig(dp_replicate_size=3))


def test_mesh_shapes_default_to_hybrid_across_nodes() -> None:
    assert ParallelismConfig().mesh_shape(8, 4) == (2, 4)  # 2 nodes: shard in, replicate across
    assert ParallelismConfig().mesh_shape(4, 4) == (1, 4)
    assert ParallelismConfig(dp_shard_size=2).mesh_shape(8) == (4, 2)
    assert ParallelismConfig(dp_replicate_size=1).mesh_shape(8, 4) == (1, 8)
    # FSDP1's FULL_SHARD asks for sharding across every rank, also on several nodes
    several_nodes = ProcessContext(rank=0, local_rank=0, world_size=8, local_world_size=4,
                                   node_rank=0, device=torch.device("cpu"), backend="gloo",
                                   launcher="torchrun")
    full = select_strategy(several_nodes,
                           fsdp_plugin=FullyShardedDataParallelPlugin(sharding_strategy="FULL_SHARD"))
    assert isinstance(full, FSDPStrategy)
    assert full.mesh.parallelism.mesh_shape(8, 4) == (1, 8)


def test_an_optimizer_with_state_is_refused_naming_the_order_to_use() -> None:
    strategy = select_strategy(_ctx(), fsdp_plugin=FullyShardedDataParallelPlugin(
        cpu_offload=True))
    model = nn.Linear(2, 2)
    opt = torch.optim.Adam(model.parameters())
    strategy.check_optimizer(opt)  # no state yet: fine
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    with pytest.raises(ValueError, match="offloaded to the CPU.*step or load_state\\(\\) after"):
        strategy.check_optimizer(opt)
