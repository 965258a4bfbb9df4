"""``ParallelismConfig`` and its handlers: Accelerate's sizes, dimension names and mesh (built
on a stand-in ``init_device_mesh`` here; tests/distributed builds real ones), accel's inferred
data-parallel sizes, and the refusal of model parallelism until a strategy applies it."""

from __future__ import annotations

from typing import Any

import pytest

from accel import ParallelismConfig, TorchContextParallelConfig, TorchTensorParallelConfig
from accel.config.parallelism import refuse_model_parallel


def test_sizes_infer_the_data_parallel_dimensions_from_the_world() -> None:
    assert ParallelismConfig().mesh_shape(4) == (1, 4)
    assert ParallelismConfig().mesh_shape(8, local_world_size=4) == (2, 4)  # HSDP across nodes
    assert ParallelismConfig(dp_replicate_size=2).mesh_shape(8) == (2, 4)
    assert ParallelismConfig(dp_shard_size=2).mesh_shape(8) == (4, 2)
    assert ParallelismConfig(dp_shard_size=2, tp_size=2).mesh_shape(8) == (2, 2)
    assert ParallelismConfig(tp_size=4).mesh_shape(8) == (1, 2)
    with pytest.raises(ValueError, match=r"does not fit 6 processes: the product of the sizes"):
        ParallelismConfig(dp_replicate_size=4).mesh_shape(6)
    with pytest.raises(ValueError, match="does not fit"):
        ParallelismConfig(dp_replicate_size=2, dp_shard_size=2).mesh_shape(8)
    with pytest.raises(ValueError, match=r"tp_size=4.*does not divide 6 processes"):
        ParallelismConfig(tp_size=4).mesh_shape(6)


def test_fields_default_and_validate_as_accelerate() -> None:
    config = ParallelismConfig()
    assert (config.tp_size, config.cp_size, config.sp_size, config.cp_backend,
            config.sp_backend, config.tp_handler) == (1, 1, 1, "torch", "torch", None)
    assert config.total_size == 1 and config._get_mesh() == ()
    assert isinstance(ParallelismConfig(tp_size=2).tp_handler, TorchTensorParallelConfig)
    assert ParallelismConfig(cp_size=2).cp_handler == TorchContextParallelConfig("allgather")
    for bad in (0, "2", True, -1):
        with pytest.raises(ValueError, match="must be a positive int"):
            ParallelismConfig(dp_shard_size=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="must be a positive int"):
            ParallelismConfig(tp_size=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="context and sequence parallelism split the same"):
        ParallelismConfig(cp_size=2, sp_size=2)
    with pytest.raises(ValueError, match="not with pure replication"):
        ParallelismConfig(dp_replicate_size=2, dp_shard_size=1, tp_size=2)
    with pytest.raises(ValueError, match="use cp_backend='torch'"):
        ParallelismConfig(cp_size=2, cp_backend="ring")
    with pytest.raises(TypeError, match="cp_handler=...\\) must be a TorchContextParallelConfig"):
        ParallelismConfig(cp_size=2, cp_handler=TorchTensorParallelConfig())


def test_handlers() -> None:
    assert TorchContextParallelConfig().cp_comm_strategy == "allgather"
    assert TorchContextParallelConfig("alltoall").cp_comm_strategy == "alltoall"
    with pytest.raises(ValueError, match="Invalid cp_comm_strategy: ring"):
        TorchContextParallelConfig("ring")
    plan = {"layers.*.up": "colwise", "layers.*.down": "rowwise"}
    assert TorchTensorParallelConfig(tp_plan=plan).tp_plan == plan
    with pytest.raises(ValueError, match=r"styles \{'x': 'diagonal'\} are not known; use one"):
        TorchTensorParallelConfig(tp_plan={"x": "diagonal"})
    with pytest.raises(TypeError, match="tp_plan must be a dict"):
        TorchTensorParallelConfig(tp_plan=["colwise"])  # type: ignore[arg-type]
    with pytest.warns(UserWarning, match="asynchronous tensor parallelism is not supported"):
        TorchTensorParallelConfig(enable_async_tp=True)


@pytest.mark.parametrize("sizes, names, shape", [
    ((8, 1, 1, 1), ("dp_replicate",), (8,)),
    ((2, 4, 1, 1), ("dp_replicate", "dp_shard"), (2, 4)),
    ((1, 2, 2, 2), ("dp_shard", "cp", "tp"), (2, 2, 2)),
    ((2, 2, 2, 2), ("dp_replicate", "dp_shard", "cp", "tp"), (2, 2, 2, 2)),
    ((1, 1, 1, 4), ("tp",), (4,)),
])
def test_mesh_names_and_joined_dimensions(sizes: tuple[int, int, int, int],
                                          names: tuple[str, ...], shape: tuple[int, ...],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Any] = []

    class Mesh:
        def __init__(self, shape: tuple[int, ...], names: tuple[str, ...]) -> None:
            self.shape, self.mesh_dim_names = shape, names
            self.joined: dict[str, list[str]] = {}

        def __getitem__(self, dims: list[str]) -> Any:
            mesh = self

            class Sub:
                def _flatten(self, name: str) -> None:
                    mesh.joined[name] = list(dims)
            return Sub()

    def init_device_mesh(device_type: str, shape: tuple[int, ...], *,
                         mesh_dim_names: tuple[str, ...]) -> Mesh:
        mesh = Mesh(shape, mesh_dim_names)
        built.append(mesh)
        return mesh

    import torch.distributed.device_mesh as torch_mesh
    monkeypatch.setattr(torch_mesh, "init_device_mesh", init_device_mesh)
    rep, shard, cp, tp = sizes
    config = ParallelismConfig(dp_replicate_size=rep, dp_shard_size=shard, cp_size=cp,
                               tp_size=tp)
    assert config._get_mesh() == (names, shape)
    mesh = config.get_device_mesh("cpu")
    assert (mesh.mesh_dim_names, mesh.shape) == (names, shape)
    assert config.get_device_mesh() is mesh and len(built) == 1  # built once, then kept
    dp = [n for n in ("dp_replicate", "dp_shard") if n in names]
    expected = {"dp": dp, "dp_shard_cp": [n for n in ("dp_shard", "cp") if n in names],
                "dp_cp": [n for n in ("dp_replicate", "dp_shard", "cp") if n in names]}
    assert mesh.joined == {k: v for k, v in expected.items() if v}
    assert config.total_size == rep * shard * cp * tp
    assert config.non_dp_dim_names == [n for n in ("tp", "cp") if n in names]
    assert config.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"][0 if rep > 1 else 1:]


def test_model_parallelism_is_refused_until_a_strategy_applies_it() -> None:
    refuse_model_parallel(ParallelismConfig(dp_replicate_size=2, dp_shard_size=2))
    for name in ("tp_size", "cp_size", "sp_size"):
        with pytest.raises(ValueError, match=rf"\({name}=2\): accel does not apply tensor, "
                           "context or sequence parallelism to models yet"):
            refuse_model_parallel(ParallelismConfig(**{name: 2}))  # type: ignore[arg-type]
    from accel import Accelerator
    with pytest.raises(ValueError, match=r"\(tp_size=2\): accel does not apply"):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(tp_size=2))
