"""The device mesh of a run, with Hugging Face Accelerate's names: ``ParallelismConfig`` and
its handlers ``TorchTensorParallelConfig`` and ``TorchContextParallelConfig``.

A mesh has named dimensions, in Accelerate's (and torchtitan's) order: ``dp_replicate`` (copies
of the model), ``dp_shard`` (ranks that shard it with FSDP2), ``cp`` (context parallel),
``sp`` (sequence parallel) and ``tp`` (tensor parallel). Only dimensions larger than 1 are
built; :meth:`ParallelismConfig.build_device_mesh` also names Accelerate's joined dimensions
(``dp``, ``dp_shard_cp``, ``dp_cp``) on the mesh.

Like the FSDP plugin, the config never reads the environment: ``accel launch
--parallelism_config_*`` flags reach a worker as ``ACCEL_PARALLELISM_CONFIG_*`` settings, which
``Accelerator()`` resolves. A data-parallel size left ``None`` is what the world size leaves for
it (see :meth:`ParallelismConfig.mesh_shape`); the other sizes default to 1.

Example:
    >>> config = ParallelismConfig(dp_shard_size=4, tp_size=2)
    >>> config._get_mesh()
    (('dp_shard', 'tp'), (4, 2))
    >>> config.dp_dim_names, config.non_dp_dim_names, config.total_size
    (['dp_shard'], ['tp'], 8)
    >>> ParallelismConfig(dp_replicate_size=2).mesh_shape(world_size=8)
    (2, 4)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._base.warn import warn_user

__all__ = ["MESH_ORDER", "ParallelismConfig", "TP_STYLES", "TorchContextParallelConfig",
           "TorchTensorParallelConfig", "refuse_model_parallel"]

#: mesh dimensions, outermost first (Accelerate's canonical order)
MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")
#: tensor-parallel styles of a ``tp_plan`` (transformers' vocabulary)
TP_STYLES = ("colwise", "rowwise", "colwise_rep", "rowwise_rep", "sequence_parallel")
_CP_STRATEGIES = ("allgather", "alltoall")
_SP_BACKENDS = ("torch", "deepspeed")


@dataclass
class TorchTensorParallelConfig:
    """How tensor parallelism splits a model (Accelerate's handler, with accel's ``tp_plan``).

    Args:
        enable_async_tp: asynchronous TP (as in Accelerate, not supported: warns and runs
            synchronous TP).
        tp_plan: module-name patterns (``"layers.*.mlp.up"``) mapped to a style of
            :data:`TP_STYLES`; ``None`` uses the model's own transformers plan.

    Example:
        >>> TorchTensorParallelConfig(tp_plan={"fc1": "colwise", "fc2": "rowwise"}).tp_plan
        {'fc1': 'colwise', 'fc2': 'rowwise'}
    """

    enable_async_tp: bool = False
    tp_plan: dict[str, str] | None = None

    def __post_init__(self) -> None:
        if self.enable_async_tp:
            warn_user("TorchTensorParallelConfig(enable_async_tp=True): asynchronous tensor "
                      "parallelism is not supported (as in Accelerate); synchronous TP runs")
        if self.tp_plan is not None:
            if not isinstance(self.tp_plan, dict):
                raise TypeError("tp_plan must be a dict of module-name patterns to styles, got "
                                f"{type(self.tp_plan).__name__}")
            bad = {k: v for k, v in self.tp_plan.items() if v not in TP_STYLES}
            if bad:
                raise ValueError(f"tp_plan styles {bad} are not known; use one of "
                                 f"{', '.join(TP_STYLES)}")


@dataclass
class TorchContextParallelConfig:
    """How context parallelism exchanges keys and values (Accelerate's handler).

    Example:
        >>> TorchContextParallelConfig().cp_comm_strategy
        'allgather'
    """

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = "allgather"
        if self.cp_comm_strategy not in _CP_STRATEGIES:
            raise ValueError(f"Invalid cp_comm_strategy: {self.cp_comm_strategy}. Must be one "
                             f"of {' or '.join(map(repr, _CP_STRATEGIES))}.")


@dataclass
class ParallelismConfig:
    """The device mesh: ``dp_replicate_size`` copies × ``dp_shard_size`` FSDP shards ×
    ``cp_size`` × ``sp_size`` × ``tp_size`` ranks (Accelerate's fields).

    A data-parallel size left ``None`` is inferred from the world size; with neither given the
    model is sharded over all ranks on one node, and over each node's ranks, replicated across
    nodes, on several. ``cp_backend`` is ``"torch"``; ``sp_backend`` is ``"torch"`` (Ulysses
    all-to-all around attention) by default.
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: Any = None
    cp_handler: Any = None
    sp_handler: Any = None
    #: the mesh :meth:`get_device_mesh` built (Accelerate's attribute)
    device_mesh: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"ParallelismConfig({name}={value!r}) must be a positive int")
        tp, cp, sp = self.tp_size or 1, self.cp_size or 1, self.sp_size or 1
        self.tp_size, self.cp_size, self.sp_size = tp, cp, sp
        self.cp_backend = self.cp_backend or "torch"
        self.sp_backend = self.sp_backend or "torch"
        if self.cp_backend != "torch":
            raise ValueError(f"ParallelismConfig(cp_backend={self.cp_backend!r}): context "
                             "parallelism runs on torch's engine; use cp_backend='torch'")
        if self.sp_backend not in _SP_BACKENDS:
            raise ValueError(f"ParallelismConfig(sp_backend={self.sp_backend!r}): use "
                             "sp_backend='torch'")
        self._check_handlers()
        if cp > 1 and sp > 1:
            raise ValueError(f"ParallelismConfig(cp_size={cp}, sp_size={sp})"
                             ": context and sequence parallelism split the same sequence; set "
                             "one of them to 1")
        if (tp > 1 or cp > 1) and (self.dp_replicate_size or 1) > 1 and \
                self.dp_shard_size == 1:
            raise ValueError("ParallelismConfig: tensor/context parallelism composes with FSDP "
                             "(dp_shard_size > 1), not with pure replication (dp_replicate_size "
                             "> 1, dp_shard_size=1); raise dp_shard_size")

    def _check_handlers(self) -> None:
        if self.tp_enabled and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_enabled and self.cp_handler is None:
            self.cp_handler = TorchContextParallelConfig()
        for name, cls in (("tp_handler", TorchTensorParallelConfig),
                          ("cp_handler", TorchContextParallelConfig)):
            handler = getattr(self, name)
            if handler is not None and not isinstance(handler, cls):
                raise TypeError(f"ParallelismConfig({name}=...) must be a {cls.__name__}, got "
                                f"{type(handler).__name__}")

    # -- sizes and names (Accelerate's properties) ------------------------------------------
    @property
    def _sizes(self) -> dict[str, int]:
        return {"dp_replicate": self.dp_replicate_size or 1, "dp_shard": self.dp_shard_size or 1,
                "cp": self.cp_size or 1, "sp": self.sp_size or 1, "tp": self.tp_size or 1}

    def _enabled(self, *names: str) -> list[str]:
        return [name for name in names if self._sizes[name] > 1]

    @property
    def total_size(self) -> int:
        """The product of every size (a ``None`` data-parallel size counts as 1)."""
        return self.data_parallel_size * self.non_data_parallel_size

    @property
    def data_parallel_size(self) -> int:
        return (self.dp_replicate_size or 1) * (self.dp_shard_size or 1)

    @property
    def non_data_parallel_size(self) -> int:
        """Ranks that see the same batch: ``tp_size * cp_size * sp_size``."""
        return (self.tp_size or 1) * (self.cp_size or 1) * (self.sp_size or 1)

    @property
    def dp_replicate_enabled(self) -> bool:
        return self._sizes["dp_replicate"] > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self._sizes["dp_shard"] > 1

    @property
    def tp_enabled(self) -> bool:
        return self._sizes["tp"] > 1

    @property
    def cp_enabled(self) -> bool:
        return self._sizes["cp"] > 1

    @property
    def sp_enabled(self) -> bool:
        return self._sizes["sp"] > 1

    @property
    def dp_dim_names(self) -> list[str]:
        """The data-parallel dimensions (each gets its own batches)."""
        return self._enabled("dp_replicate", "dp_shard")

    @property
    def non_dp_dim_names(self) -> list[str]:
        """The dimensions whose ranks see the same batch."""
        return self._enabled("tp", "cp", "sp")

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """The dimensions FSDP shards the model over (joined as ``dp_shard_cp``)."""
        return self._enabled("dp_shard", "cp")

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """The dimensions the loss is averaged over (joined as ``dp_cp``)."""
        return self._enabled("dp_replicate", "dp_shard", "cp")

    @property
    def fsdp_dim_names(self) -> list[str]:
        return self._enabled("dp_replicate") + ["dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        return self.dp_dim_names + self.non_dp_dim_names

    def _set_size(self, parallelism: str, size: int) -> None:
        setattr(self, f"{parallelism}_size", size)

    # -- meshes ------------------------------------------------------------------------------
    def _get_mesh(self) -> tuple[tuple[str, ...], tuple[int, ...]] | tuple[()]:
        """``(dim names, shape)`` of the dimensions larger than 1, outermost first; ``()``
        when there are none (one process)."""
        dims = [name for name in MESH_ORDER if name in self.active_mesh_dims]
        if not dims:
            return ()
        return tuple(dims), tuple(self._sizes[name] for name in dims)

    def build_device_mesh(self, device_type: str) -> Any:
        """The named ``DeviceMesh`` over the running process group (Accelerate's method), with
        the joined dimensions ``dp``, ``dp_shard_cp`` and ``dp_cp`` named on it; ``None`` when
        every size is 1. A data-parallel size left ``None`` is inferred first."""
        from torch.distributed import device_mesh as torch_mesh

        config = self if None not in (self.dp_replicate_size, self.dp_shard_size) \
            else self._resolved()
        mesh = config._get_mesh()
        if not mesh:
            return None
        names, shape = mesh
        # a list of names, as Accelerate indexes it (torch takes lists and tuples)
        device_mesh: Any = torch_mesh.init_device_mesh(device_type, shape, mesh_dim_names=names)
        for dims, joined in ((config.dp_dim_names, "dp"),
                             (config.dp_shard_cp_dim_names, "dp_shard_cp"),
                             (config.dp_cp_dim_names, "dp_cp")):
            if dims:
                device_mesh[dims]._flatten(joined)
        return device_mesh

    def get_device_mesh(self, device_type: str | None = None) -> Any:
        """The mesh built by :meth:`build_device_mesh` on first call (then kept)."""
        if self.device_mesh is None:
            if device_type is None:
                raise ValueError("get_device_mesh() builds the mesh on first use: pass the "
                                 "device type, e.g. get_device_mesh('cuda')")
            self.device_mesh = self.build_device_mesh(device_type)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise ValueError(f"the device mesh was built for {self.device_mesh.device_type!r}, "
                             f"not {device_type!r}; build one config per device type")
        return self.device_mesh

    def _resolved(self) -> ParallelismConfig:
        import torch.distributed as dist

        rep, shard = self.mesh_shape(dist.get_world_size())
        return ParallelismConfig(dp_replicate_size=rep, dp_shard_size=shard,
                                 tp_size=self.tp_size, cp_size=self.cp_size,
                                 sp_size=self.sp_size, sp_backend=self.sp_backend,
                                 tp_handler=self.tp_handler, cp_handler=self.cp_handler)

    def mesh_shape(self, world_size: int, local_world_size: int | None = None
                   ) -> tuple[int, int]:
        """``(replicate, shard)`` for ``world_size`` ranks; a missing size is inferred
        (``local_world_size``: the shard size by default, when the job spans several nodes)."""
        if world_size % self.non_data_parallel_size:
            raise ValueError(f"ParallelismConfig(tp_size={self.tp_size}, cp_size={self.cp_size}"
                             f", sp_size={self.sp_size}) does not divide {world_size} processes")
        world = world_size // self.non_data_parallel_size
        rep, shard = self.dp_replicate_size, self.dp_shard_size
        if rep is None and shard is None:
            if local_world_size and world > local_world_size and world % local_world_size == 0:
                return world // local_world_size, local_world_size
            return 1, world
        if rep is None:
            rep = world // shard if shard and world % shard == 0 else 0
        elif shard is None:
            shard = world // rep if world % rep == 0 else 0
        if not rep or not shard or rep * shard * self.non_data_parallel_size != world_size:
            raise ValueError(f"ParallelismConfig(dp_replicate_size={self.dp_replicate_size}, "
                             f"dp_shard_size={self.dp_shard_size}) does not fit {world_size} "
                             "processes: the product of the sizes must equal the number of "
                             "processes")
        return rep, shard

    def data_parallel_mesh(self, device_type: str, local_world_size: int | None = None) -> Any:
        """The ``DeviceMesh`` FSDP2 shards over: 1-D ``("dp_shard",)`` without replication,
        else 2-D ``("dp_replicate", "dp_shard")`` (HSDP), even where a size is 1
        (``local_world_size``: see :meth:`mesh_shape`)."""
        import torch.distributed as dist
        from torch.distributed import device_mesh as torch_mesh

        rep, shard = self.mesh_shape(dist.get_world_size(), local_world_size)
        if rep == 1:
            return torch_mesh.init_device_mesh(device_type, (shard,),
                                               mesh_dim_names=("dp_shard",))
        return torch_mesh.init_device_mesh(device_type, (rep, shard),
                                           mesh_dim_names=("dp_replicate", "dp_shard"))


def refuse_model_parallel(config: ParallelismConfig) -> None:
    """Raise for a config with tensor, context or sequence parallelism: the config and its mesh
    are built, but no strategy applies them to a model yet (data parallelism only).

    Example:
        >>> refuse_model_parallel(ParallelismConfig(dp_shard_size=2))
        >>> refuse_model_parallel(ParallelismConfig(tp_size=2))
        Traceback (most recent call last):
        ValueError: ParallelismConfig(tp_size=2): accel does not apply tensor, context or ...
    """
    given = {name: getattr(config, name) for name in ("tp_size", "cp_size", "sp_size")
             if (getattr(config, name) or 1) > 1}
    if given:
        sizes = ", ".join(f"{name}={value}" for name, value in given.items())
        raise ValueError(f"ParallelismConfig({sizes}): accel does not apply tensor, context or "
                         "sequence parallelism to models yet (the config and its device mesh "
                         "are Accelerate's); shard with dp_shard_size and dp_replicate_size "
                         "(FSDP2/HSDP)")
