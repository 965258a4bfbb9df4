"""Rank-0 loading for FSDP (``cpu_ram_efficient_loading``): only rank 0 holds the full model.

Rank 0 builds (or loads) the model with its weights; every other rank builds it under
``init_empty_weights()`` (parameters on the meta device, nothing allocated). The strategy captures
rank 0's full state before sharding (:func:`capture_full_state`), applies ``fully_shard`` on
every rank, then calls :func:`distribute_from_rank0`: each rank materialises its *local shards*
(``to_empty``), and rank 0 slices every parameter per receiving rank and sends it that slice
alone, point to point. Shard shapes and offsets come from DTensor
(``compute_local_shape_and_global_offset``), so a 1-D mesh with uneven or empty shards and a
2-D HSDP mesh (Replicate, Shard(0)) are both the placements torch describes. No rank but 0 ever
allocates a full parameter; buffers (persistent or not) are replicated, so they are broadcast.

Example:
    >>> import torch
    >>> from accel.big_modeling import init_empty_weights
    >>> with init_empty_weights():
    ...     model = torch.nn.Linear(4, 4)
    >>> refuse_meta_model(model, "DDP")
    Traceback (most recent call last):
    ...
    ValueError: prepare() got a model with 2 of its 2 parameters on the meta device ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ..distributed import ProcessContext

if TYPE_CHECKING:  # torch.distributed.tensor takes half a second to import: only when loading
    from torch.distributed.tensor import DTensor

__all__ = ["CpuRamEfficientLoadingError", "capture_full_state", "distribute_from_rank0",
           "meta_tensor_names", "refuse_meta_model", "to_meta"]

_FIX_RANK0 = ("with cpu_ram_efficient_loading=True rank 0 holds the real weights: build (or "
              "load) the model normally on rank 0 and under init_empty_weights() on the other "
              "ranks only")

#: global shape of each entry of rank 0's full state
_Shapes = dict[str, tuple[int, ...]]
#: what rank 0 offers: its shapes and its parameter names once each (tied ones once), or an
#: error to raise
_Header = tuple[_Shapes, list[str]] | str
#: a shard this rank holds: (local shape, offset in the full tensor); None: not in the mesh
_Box = tuple[tuple[int, ...], tuple[int, ...]] | None


class CpuRamEfficientLoadingError(ValueError):
    """Rank 0's state and the ranks' modules do not fit together (raised on every rank)."""


def meta_tensor_names(module: nn.Module) -> list[str]:
    """Names of ``module``'s parameters and buffers that live on the meta device."""
    return [name for name, tensor in _named_tensors(module) if tensor.is_meta]


def refuse_meta_model(module: nn.Module, strategy: str) -> None:
    """Raise when a model without weights (built under ``init_empty_weights()``) is prepared
    for training by a strategy that cannot fill it (anything but FSDP's rank-0 loading)."""
    names = [name for name, p in module.named_parameters() if p.is_meta]
    if not names:
        return
    total = len(list(module.parameters()))
    raise ValueError(
        f"prepare() got a model with {len(names)} of its {total} parameters on the meta device "
        f"(e.g. {names[0]!r}: built under init_empty_weights()?), so it has no weights to train "
        f"with the {strategy} strategy. Load its weights before prepare() "
        "(model.to_empty(device=...) then model.load_state_dict(...)), or train with FSDP and "
        "FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True), where rank 0 holds the "
        "weights and the other ranks, built under init_empty_weights(), receive their shards")


def capture_full_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Rank 0's full state before ``fully_shard``: the state dict plus non-persistent buffers
    (which a state dict leaves out but the other ranks need too). Tensors are shared, not
    copied."""
    state = {name: tensor.detach() for name, tensor in module.state_dict(keep_vars=True).items()
             if isinstance(tensor, torch.Tensor)}
    for name, buffer in module.named_buffers():
        state.setdefault(name, buffer.detach())
    return state


def to_meta(module: nn.Module) -> None:
    """Move ``module``'s parameters and buffers to the meta device in place, keeping shared
    (tied) tensors shared (``module.to("meta")`` would untie them) and parameter classes."""
    moved: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        for table in (sub._parameters, sub._buffers):
            for name, tensor in table.items():
                if tensor is None:
                    continue
                if id(tensor) not in moved:
                    moved[id(tensor)] = _meta_copy(tensor)
                table[name] = moved[id(tensor)]  # type: ignore[assignment]


def _meta_copy(tensor: torch.Tensor) -> torch.Tensor:
    empty = torch.empty_like(tensor, device="meta")
    if not isinstance(tensor, nn.Parameter):
        return empty
    param = type(tensor)(empty, requires_grad=tensor.requires_grad)
    param.__dict__.update(tensor.__dict__)
    return param


def distribute_from_rank0(module: nn.Module, *, full_state: Mapping[str, torch.Tensor] | None,
                          ctx: ProcessContext, device: torch.device | None = None) -> None:
    """Fill ``module`` (after ``fully_shard``) with rank 0's ``full_state``; every rank calls it.

    Args:
        module: the sharded module; its meta tensors are materialised on ``device`` first.
        full_state: on rank 0 the module's full state captured before sharding (see
            :func:`capture_full_state`; CPU tensors are fine); ignored on other ranks (None).
        ctx: this process's context (rank, backend: NCCL sends from ``ctx.device``).
        device: where meta tensors are materialised (default ``ctx.device``; the CPU when
            FSDP offloads parameters).

    Raises:
        CpuRamEfficientLoadingError: on every rank, when rank 0 has no real weights or its keys
            or shapes do not match the module's (the message lists them).
    """
    from torch.distributed.tensor import DTensor

    header = _rank0_header(module, full_state) if ctx.rank == 0 else None
    header = _broadcast_object(header)
    if isinstance(header, str):
        raise CpuRamEfficientLoadingError(header)
    _agree_on_keys(module, header, ctx)
    if meta_tensor_names(module):
        module.to_empty(device=device or ctx.device)
    comm = ctx.device if ctx.backend == "nccl" else torch.device("cpu")
    params = list(module.named_parameters())  # a tied parameter comes once
    boxes = [_local_box(name, p) for name, p in params]
    everyone: list[list[_Box]] = [[] for _ in range(ctx.world_size)]
    dist.gather_object(boxes, everyone if ctx.rank == 0 else None, dst=0)
    with torch.no_grad():
        for index, (name, param) in enumerate(params):
            if not isinstance(param, DTensor):  # not sharded (an ignored module): whole
                _broadcast_tensor(param, full_state=full_state, name=name, ctx=ctx, comm=comm)
            elif ctx.rank == 0 and full_state is not None:
                _send_shards(param, full=full_state[name], boxes=[b[index] for b in everyone],
                             comm=comm)
            elif boxes[index] is not None and param.to_local().numel() > 0:
                _receive_into(param.to_local().detach(), comm)
        for name, buffer in module.named_buffers():
            _broadcast_tensor(buffer, full_state=full_state, name=name, ctx=ctx, comm=comm)


# -------------------------------------------------------------------------- agreeing first


def _named_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*module.named_parameters(), *module.named_buffers()]


def _rank0_header(module: nn.Module, full_state: Mapping[str, torch.Tensor] | None) -> _Header:
    """What rank 0 offers, or why it cannot (a message that says how to fix it)."""
    if full_state is None:
        return f"rank 0 has no state to send; {_FIX_RANK0}"
    meta = [name for name, tensor in full_state.items() if tensor.is_meta]
    if meta:
        return (f"rank 0's model has {len(meta)} tensors on the meta device (e.g. {meta[0]!r}), "
                f"but {_FIX_RANK0}")
    missing = [name for name, buffer in module.named_buffers()
               if name not in full_state and buffer.is_meta]
    if missing:
        return (f"rank 0's buffers {missing} are on the meta device and not in its state: "
                f"build them with real values on rank 0 (init_empty_weights(include_buffers="
                f"False) there, or no init_empty_weights at all); {_FIX_RANK0}")
    shapes = {name: tuple(t.shape) for name, t in full_state.items()}
    return shapes, [name for name, _ in module.named_parameters()]


def _agree_on_keys(module: nn.Module, header: tuple[_Shapes, list[str]],
                   ctx: ProcessContext) -> None:
    """Every rank checks its module against rank 0's state; all raise if any rank found a
    problem, so that no rank is left waiting in a send."""
    problem = _key_problem(module, header)
    problems: list[str | None] = [None] * ctx.world_size
    dist.all_gather_object(problems, problem)
    found = [f"rank {rank}: {text}" for rank, text in enumerate(problems) if text]
    if found:
        raise CpuRamEfficientLoadingError(
            "cpu_ram_efficient_loading: rank 0's state does not match the model; "
            + "; ".join(found) + ". Build the same model on every rank (the other ranks under "
            "init_empty_weights()), and give rank 0 weights for exactly its keys")


def _key_problem(module: nn.Module, header: tuple[_Shapes, list[str]]) -> str | None:
    expected = {name: tuple(t.shape) for name, t in module.state_dict(keep_vars=True).items()
                if isinstance(t, torch.Tensor)}
    extra = {name for name, _ in module.named_buffers()}  # non-persistent ones may be offered
    offered, rank0_params = header
    missing = sorted(set(expected) - set(offered))
    unexpected = sorted(set(offered) - set(expected) - extra)
    shapes = sorted(f"{name} {list(offered[name])} (model: {list(shape)})"
                    for name, shape in expected.items()
                    if name in offered and offered[name] != shape)
    mine = [name for name, _ in module.named_parameters()]
    tied = sorted(set(mine) ^ set(rank0_params)) or (["(same names, other order)"]
                                                     if mine != rank0_params else [])
    checks = (("missing keys", missing), ("unexpected keys", unexpected),
              ("shape mismatches", shapes),
              ("parameters unlike rank 0's (tied on one side only?)", tied))
    parts = [f"{what} {names[:5]}{' ...' if len(names) > 5 else ''}"
             for what, names in checks if names]
    return ", ".join(parts) or None


# -------------------------------------------------------------------------- moving tensors


def _broadcast_object(value: Any) -> Any:
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _local_box(name: str, param: torch.Tensor) -> _Box:
    """This rank's (local shape, global offset) of a DTensor parameter (None: not sharded or
    this rank is outside its mesh)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(param, DTensor):
        return None
    if not all(isinstance(p, Shard | Replicate) for p in param.placements):
        raise NotImplementedError(
            f"cpu_ram_efficient_loading sends Shard/Replicate DTensors; {name!r} is placed as "
            f"{param.placements}. Load the weights before sharding instead (set "
            "cpu_ram_efficient_loading=False)")
    if param.device_mesh.get_coordinate() is None:  # this rank is outside the mesh
        return None
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh,
                                                          param.placements)
    local = param.to_local()
    if tuple(local.shape) != tuple(shape):
        raise RuntimeError(f"{name!r}: DTensor's local tensor has shape {list(local.shape)} "
                           f"but its placements give {list(shape)}; please report this")
    return tuple(shape), tuple(offset)


def _send_shards(param: DTensor, *, full: torch.Tensor, boxes: list[_Box],
                 comm: torch.device) -> None:
    """Rank 0: slice ``full`` for each rank (its box) and send each rank its slice only."""
    local = param.to_local().detach()
    pending = []
    for rank, box in enumerate(boxes):
        if box is None or 0 in box[0]:
            continue  # outside the mesh, or an empty shard (uneven split)
        piece = full[tuple(slice(o, o + s) for s, o in zip(box[0], box[1], strict=True))]
        if rank == 0:
            local.copy_(piece)
            continue
        outgoing = piece.to(device=comm, dtype=local.dtype).contiguous()
        pending.append((dist.isend(outgoing, dst=rank), outgoing))
    for work, _ in pending:
        if work is not None:
            work.wait()


def _receive_into(local: torch.Tensor, comm: torch.device) -> None:
    if local.device == comm and local.is_contiguous():
        dist.recv(local, src=0)
        return
    incoming = torch.empty(local.shape, dtype=local.dtype, device=comm)
    dist.recv(incoming, src=0)
    local.copy_(incoming)


def _broadcast_tensor(tensor: torch.Tensor, *, full_state: Mapping[str, torch.Tensor] | None,
                      name: str, ctx: ProcessContext, comm: torch.device) -> None:
    """A replicated tensor (buffer, unsharded parameter): rank 0's value to every rank."""
    target = tensor.detach()
    if ctx.rank == 0 and full_state is not None and name in full_state:
        source = full_state[name]
        if source.data_ptr() != target.data_ptr():
            target.copy_(source)
    if target.device == comm and target.is_contiguous():
        dist.broadcast(target, src=0)
        return
    staged = target.to(comm).contiguous()
    dist.broadcast(staged, src=0)
    target.copy_(staged)
