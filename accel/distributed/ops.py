"""Collectives over nested dict/list/tuple structures of tensors.

``Communicator.gather`` accepts tensors whose first dimension differs across ranks on every
backend. In the steady state it costs one ``all_gather``: each rank sends a small shape header
together with its payload, padded to a capacity that every rank derives identically from the
previous call's headers; only when some header says a rank overflowed does a second round run
(every rank sees every header, so all ranks decide the same way). What a gather derives from its
leaves' shapes and dtypes is computed once per signature, and small gathers keep their send and
receive buffers with every view into them, so a call whose shapes every rank sent last time
costs one copy in and one out per leaf, one header comparison and the collective: no more tensor
operations than a hand-written ``all_gather`` + ``cat`` of one tensor, and one collective for
any number of tensors.

At world size 1 every collective returns at once without touching torch.distributed.

Example:
    >>> import torch
    >>> from accel.distributed.context import ProcessContext
    >>> comm = Communicator(ProcessContext.single())
    >>> comm.gather(torch.tensor(3.0)).tolist()
    [3.0]
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from .._base import tree as _tree
from .context import ProcessContext

__all__ = ["REDUCTIONS", "CollectiveHook", "Communicator", "CollectiveMismatchError"]

REDUCTIONS = ("sum", "mean", "max", "min")
_ALIGN = 8
#: bytes per rank a small gather sends at least (every byte costs on the wire)
_MIN_CAPACITY = 1024
_CACHE_SIZE = 64
#: send buffers kept for reuse: at most this many, each at most this large (bytes)
_PLANS = 8
_PLAN_BYTES = 1 << 20

#: A hook is a context-manager factory called around every collective with (op, leaves).
CollectiveHook = Callable[[str, Sequence[torch.Tensor]], contextlib.AbstractContextManager[None]]


class CollectiveMismatchError(RuntimeError):
    """Ranks called a collective with different ops, shapes or dtypes (debug mode)."""


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _grow(needed: int) -> int:
    return max(_MIN_CAPACITY, 1 << max(needed - 1, 0).bit_length())


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    # reshape copies only when the tensor is not contiguous; detach only when it must
    # (every tensor op costs a few microseconds, which is the price of a small gather)
    flat = (tensor.detach() if tensor.requires_grad else tensor).reshape(-1)
    return flat.view(torch.uint8)


#: one collective into one output tensor (``all_gather_single`` replaces the deprecated
#: ``all_gather_into_tensor`` in newer torch; gloo supports both with a 1-D output)
_ALL_GATHER_INTO = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class _Layout:
    """What a gather derives from its leaves' shapes and dtypes (header, offsets, capacity key),
    computed once per signature: recomputing it in Python at every call would cost about as
    much as a small collective."""

    __slots__ = ("shapes", "offsets", "needed", "wanted", "header", "key")

    def __init__(self, leaves: list[torch.Tensor], scope: tuple[int, ...] | None) -> None:
        self.shapes = [tuple(t.shape) if t.dim() else (1,) for t in leaves]
        self.offsets: list[int] = []
        needed = 0
        for tensor, shape in zip(leaves, self.shapes, strict=True):
            self.offsets.append(needed)
            needed += _align(math.prod(shape) * tensor.element_size())
        self.needed, self.wanted = needed, _grow(needed)
        self.header = [needed] + [d for shape in self.shapes for d in shape]
        # Capacities are agreed per group: a subgroup gather must not change what the other
        # ranks assume for the next whole-job gather.
        layout = tuple((t.dtype, s[1:]) for t, s in zip(leaves, self.shapes, strict=True))
        self.key = (scope, layout, len(self.header))


class _SendPlan:
    """A gather's send buffer (int64: header, then payload), a typed view per leaf, and (for
    small gathers) the receive buffer with its views: every rank's header, and each leaf's
    block as it arrives when all ranks send the same shapes.

    Kept between calls with the same signature and capacity, so that the steady state of a
    small gather costs one copy in and one copy out per leaf, one collective, one header
    comparison and no allocation but the results: at a few microseconds per tensor op,
    rebuilding the header and views each time would cost more than the collective itself.
    """

    __slots__ = ("capacity", "send", "dests", "fits", "recv", "expected", "heads", "blocks")

    def __init__(self, lay: _Layout, capacity: int, device: torch.device,
                 leaves: list[torch.Tensor], world: int) -> None:
        header, hlen = lay.header, len(lay.header)
        self.capacity, self.fits = capacity, lay.needed <= capacity
        self.send = torch.empty(hlen + capacity // 8, dtype=torch.int64, device=device)
        self.send[:hlen].copy_(torch.tensor(header, dtype=torch.int64))
        self.expected = self.send[:hlen].expand(world, hlen)
        row = self.send.numel()
        # Results are copies (a header sits between any two ranks' payloads; see ``blocks``),
        # so the receive buffer can be reused; only small ones are kept.
        self.recv = (torch.empty(world * row, dtype=torch.int64, device=device)
                     if world * row * 8 <= _PLAN_BYTES else None)
        self.heads = (None if self.recv is None
                      else self.recv.as_strided(self.expected.shape, (row, 1)))
        self.blocks = _blocks(lay, leaves=leaves, recv=self.recv, world=world,
                              row_bytes=row * 8) if self.fits else None
        self.dests: list[torch.Tensor] = []
        if not self.fits:  # this rank overflows: its payload goes in the second round
            return
        payload = self.send.view(torch.uint8)[hlen * 8:]
        for tensor, shape, offset in zip(leaves, lay.shapes, lay.offsets, strict=True):
            nbytes = math.prod(shape) * tensor.element_size()
            dest = payload[offset: offset + nbytes]
            self.dests.append(dest if tensor.element_size() > _ALIGN
                              else dest.view(tensor.dtype).view(shape))

    def fill(self, leaves: list[torch.Tensor]) -> None:
        # dests is empty when this rank overflows (its payload goes in the second round).
        for dest, tensor in zip(self.dests, leaves, strict=False):
            source = tensor.detach() if tensor.requires_grad else tensor
            dest.copy_(_as_bytes(source) if dest.dtype != source.dtype else source)

    def receive(self, world: int, group: Any) -> torch.Tensor:
        """Every rank's send buffer, concatenated (into the kept receive buffer if any)."""
        out = self.recv
        if out is None:
            out = torch.empty(world * self.send.numel(), dtype=torch.int64,
                              device=self.send.device)
        _ALL_GATHER_INTO(out, self.send, group=group)
        return out

    def uniform(self, flat: torch.Tensor) -> bool:
        """Whether every rank sent this rank's header (same shapes; nobody overflowed)."""
        if not self.fits:
            return False
        heads = self.heads
        if heads is None or flat is not self.recv:
            heads = flat.as_strided(self.expected.shape, (self.send.numel(), 1))
        return bool(torch.equal(heads, self.expected))

    def results(self) -> list[torch.Tensor]:
        """The leaves from the kept receive buffer after a uniform gather, each a new tensor."""
        assert self.blocks is not None
        out = []
        for block, shape, copy, device in self.blocks:
            value = block.reshape(shape)  # a copy: a header lies between the ranks' rows...
            if device is not None:
                value = value.to(device)
            elif copy:  # ... but a view when each rank sent one row (a batch of one, 0-d)
                value = value.contiguous()
            out.append(value)
        return out


#: a leaf's rows in the kept receive buffer: the (world, count) view, the result's shape,
#: whether reshaping it gives a view (which must be copied), and the leaf's device if other
_Block = tuple[torch.Tensor, tuple[int, ...], bool, "torch.device | None"]


def _blocks(lay: _Layout, *, leaves: list[torch.Tensor], recv: torch.Tensor | None, world: int,
            row_bytes: int) -> list[_Block] | None:
    if recv is None or any(t.element_size() > _ALIGN for t in leaves):
        return None  # unpacked from each call's buffer (complex128: byte copies first)
    base = len(lay.header) * 8
    blocks: list[_Block] = []
    for tensor, shape, offset in zip(leaves, lay.shapes, lay.offsets, strict=True):
        size = tensor.element_size()
        typed = recv if recv.dtype == tensor.dtype else recv.view(tensor.dtype)
        view = typed.as_strided((world, math.prod(shape)), (row_bytes // size, 1),
                                (base + offset) // size)
        device = None if tensor.device == recv.device else tensor.device
        blocks.append((view, (world * shape[0],) + shape[1:], shape[0] == 1, device))
    return blocks


class Communicator:
    """Collectives for one process context. Holds only per-instance gather state (agreed
    capacities and reusable send buffers)."""

    def __init__(self, ctx: ProcessContext, hooks: Sequence[CollectiveHook] = ()) -> None:
        self.ctx = ctx
        self.hooks = list(hooks)
        self._capacity: OrderedDict[tuple[Any, ...], int] = OrderedDict()
        self._layouts: OrderedDict[tuple[Any, ...], _Layout] = OrderedDict()
        self._plans: OrderedDict[tuple[Any, ...], _SendPlan] = OrderedDict()

    # -- plumbing ---------------------------------------------------------------------------
    @property
    def _comm_device(self) -> torch.device:
        return self.ctx.device if self.ctx.backend == "nccl" else torch.device("cpu")

    def _collective(self, op: str, leaves: Sequence[torch.Tensor]
                    ) -> contextlib.AbstractContextManager[Any]:
        hooks = self.hooks
        if not hooks:
            return contextlib.nullcontext()
        if len(hooks) == 1:  # the usual case (the stall monitor): no ExitStack per collective
            return hooks[0](op, leaves)
        return self._stacked(op, leaves)

    @contextlib.contextmanager
    def _stacked(self, op: str, leaves: Sequence[torch.Tensor]) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for hook in self.hooks:
                stack.enter_context(hook(op, leaves))
            yield

    # -- barrier ----------------------------------------------------------------------------
    def barrier(self) -> None:
        """Wait until every rank reaches this point."""
        if not self.ctx.is_distributed:
            return
        with self._collective("barrier", ()):
            if self.ctx.backend == "nccl":
                dist.barrier(device_ids=[self.ctx.device.index])
            else:
                dist.barrier()

    # -- gather -----------------------------------------------------------------------------
    def gather(self, data: Any, group: Any = None) -> Any:
        """Concatenate every rank's tensors along dim 0 (0-d tensors become shape (world,)).

        First dimensions may differ across ranks; dtypes (bool included) are kept. ``group``
        (a ``torch.distributed`` process group this rank belongs to; ``None`` = every rank)
        gathers among its members only, in their rank order. Collective hooks assume that the
        whole job takes part, so they do not run around a subgroup gather.
        """
        leaves, rebuild = _tree.flatten(data)
        return self.gather_flat(leaves, rebuild, group)

    def gather_flat(self, leaves: list[torch.Tensor], rebuild: Callable[[list[Any]], Any],
                    group: Any = None) -> Any:
        """``gather`` of a structure already flattened by ``_tree.flatten``."""
        if not self.ctx.is_distributed or (group is not None and dist.get_world_size(group) == 1):
            return rebuild([t.reshape(1) if t.dim() == 0 else t for t in leaves])
        if group is not None:
            return rebuild(self._gather_leaves(leaves, group))
        with self._collective("gather", leaves):
            return rebuild(self._gather_leaves(leaves))

    def _gather_leaves(self, leaves: list[torch.Tensor], group: Any = None) -> list[torch.Tensor]:
        scope = None if group is None else tuple(dist.get_process_group_ranks(group))
        signature = (scope, *[(t.shape, t.dtype, t.device) for t in leaves])
        lay = self._layouts.get(signature)
        if lay is None:
            lay = self._layouts[signature] = _Layout(leaves, scope)
            while len(self._layouts) > _CACHE_SIZE:
                self._layouts.popitem(last=False)
        capacity = self._capacity.get(lay.key, _MIN_CAPACITY)
        world = self.ctx.world_size if group is None else dist.get_world_size(group)
        plan = self._send_plan(signature, lay=lay, capacity=capacity, leaves=leaves, world=world)
        plan.fill(leaves)
        flat = plan.receive(world, group)
        row_bytes, base = plan.send.numel() * 8, len(lay.header) * 8
        if plan.uniform(flat):  # the steady state: every rank sent these shapes
            self._remember(lay.key, capacity=capacity, largest=lay.needed, wanted=lay.wanted)
            if flat is plan.recv and plan.blocks is not None:
                return plan.results()
            return _unpack_uniform(leaves, shapes=lay.shapes, offsets=lay.offsets, flat=flat,
                                   world=world, row_bytes=row_bytes, base=base)
        headers = flat.as_strided((world, len(lay.header)), (row_bytes // 8, 1)).tolist()
        largest = max(h[0] for h in headers)
        if largest > capacity:  # someone overflowed: every rank sees it and joins round two
            payload = torch.empty(_align(largest), dtype=torch.uint8, device=flat.device)
            self._pack(payload, leaves, lay.offsets)
            flat, row_bytes, base = self._all_gather(payload, world, group), payload.numel(), 0
        self._remember(lay.key, capacity=capacity, largest=largest)
        if all(h == lay.header for h in headers):  # everyone overflowed with the same shapes
            return _unpack_uniform(leaves, shapes=lay.shapes, offsets=lay.offsets, flat=flat,
                                   world=world, row_bytes=row_bytes, base=base)
        rows = flat.view(torch.uint8).view(world, row_bytes)[:, base:]
        return self._unpack(leaves, headers, rows)

    def _send_plan(self, signature: tuple[Any, ...], *, lay: _Layout, capacity: int,
                   leaves: list[torch.Tensor], world: int) -> _SendPlan:
        plan = self._plans.get(signature)
        if plan is not None and plan.capacity == capacity:
            self._plans.move_to_end(signature)
            return plan
        plan = _SendPlan(lay, capacity, self._comm_device, leaves, world)
        if capacity <= _PLAN_BYTES and plan.fits:
            self._plans[signature] = plan
            while len(self._plans) > _PLANS:
                self._plans.popitem(last=False)
        return plan

    @staticmethod
    def _pack(buffer: torch.Tensor, leaves: list[torch.Tensor], offsets: list[int]) -> None:
        for tensor, offset in zip(leaves, offsets, strict=True):
            raw = _as_bytes(tensor)
            buffer[offset: offset + raw.numel()].copy_(raw, non_blocking=True)

    @staticmethod
    def _all_gather(send: torch.Tensor, world: int, group: Any = None) -> torch.Tensor:
        """Every rank's ``send``, concatenated (1-D: gloo checks each rank's chunk against the
        input's shape)."""
        out = torch.empty(world * send.numel(), dtype=send.dtype, device=send.device)
        _ALL_GATHER_INTO(out, send, group=group)
        return out

    def _remember(self, key: tuple[Any, ...], *, capacity: int, largest: int,
                  wanted: int | None = None) -> None:
        """Every rank calls this after every gather with the same arguments, so all ranks keep
        the same capacities (and evict the same keys)."""
        wanted = _grow(largest) if wanted is None else wanted
        # Shrink only when far too large, so a short last batch does not cost a second round
        # at the start of the next epoch.
        if wanted > capacity or wanted * 4 < capacity:
            capacity = wanted
        self._capacity[key] = capacity
        self._capacity.move_to_end(key)
        while len(self._capacity) > _CACHE_SIZE:
            self._capacity.popitem(last=False)

    @staticmethod
    def _unpack(
        leaves: list[torch.Tensor], headers: list[list[int]], rows: torch.Tensor
    ) -> list[torch.Tensor]:
        parts: list[list[torch.Tensor]] = [[] for _ in leaves]
        for rank in range(rows.shape[0]):
            dims = headers[rank][1:]
            offset = 0
            for index, tensor in enumerate(leaves):
                ndim = max(tensor.dim(), 1)
                shape, dims = dims[:ndim], dims[ndim:]
                nbytes = math.prod(shape) * tensor.element_size()
                chunk = rows[rank, offset: offset + nbytes]
                if tensor.element_size() > _ALIGN:  # complex128: rows are only 8-byte aligned
                    chunk = chunk.clone()
                parts[index].append(chunk.view(tensor.dtype).reshape(shape))
                offset += _align(nbytes)
        return [torch.cat(p).to(t.device) for p, t in zip(parts, leaves, strict=True)]

    def gather_object(self, obj: Any, group: Any = None) -> list[Any]:
        """Gather picklable objects; lists/tuples are concatenated, other objects listed.

        ``group`` restricts the gather to a subgroup (hooks, which assume every rank takes
        part, are skipped then).
        """
        if not self.ctx.is_distributed:
            return list(obj) if isinstance(obj, (list, tuple)) else [obj]
        size = self.ctx.world_size if group is None else dist.get_world_size(group)
        out: list[Any] = [None] * size
        with self._collective("gather_object", ()) if group is None else contextlib.nullcontext():
            dist.all_gather_object(out, obj, group=group)
        if all(isinstance(item, (list, tuple)) for item in out):
            return [x for item in out for x in item]
        return out

    # -- reduce -----------------------------------------------------------------------------
    def reduce(self, data: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """All-reduce every tensor (sum, mean, max or min); returns new tensors."""
        if reduction not in REDUCTIONS:
            raise ValueError(f"unknown reduction {reduction!r}; expected one of {REDUCTIONS}")
        leaves, rebuild = _tree.flatten(data)
        for tensor in leaves:
            if tensor.dtype == torch.bool and reduction in ("sum", "mean"):
                raise TypeError(f"cannot {reduction} bool tensors; use 'max' (any) or 'min' "
                                "(all), or convert to int first")
        if not self.ctx.is_distributed:
            out = [self._finish(t.clone(), reduction=reduction, scale=scale,
                                world=1) for t in leaves]
            return rebuild(out)
        with self._collective(f"reduce:{reduction}", leaves):
            return rebuild(self._reduce_leaves(leaves, reduction, scale))

    def _reduce_leaves(self, leaves: list[torch.Tensor], reduction: str,
                       scale: float) -> list[torch.Tensor]:
        op = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM,
              "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[reduction]
        out: list[torch.Tensor | None] = [None] * len(leaves)
        groups: dict[torch.dtype, list[int]] = {}
        for index, tensor in enumerate(leaves):
            groups.setdefault(tensor.dtype, []).append(index)
        for dtype, indices in groups.items():  # one collective per dtype
            wire = torch.uint8 if dtype == torch.bool else dtype
            flat = torch.cat([leaves[i].detach().reshape(-1).to(self._comm_device, wire)
                              for i in indices])
            dist.all_reduce(flat, op=op)
            start = 0
            for i in indices:
                n = leaves[i].numel()
                value = flat[start: start + n].reshape(leaves[i].shape).to(leaves[i].device, dtype)
                out[i] = self._finish(value, reduction=reduction, scale=scale,
                                      world=self.ctx.world_size)
                start += n
        return [t for t in out if t is not None]

    @staticmethod
    def _finish(tensor: torch.Tensor, *, reduction: str, scale: float, world: int) -> torch.Tensor:
        if reduction == "mean":
            tensor = tensor / world
        if scale != 1.0:
            tensor = tensor * scale
        return tensor

    # -- broadcast --------------------------------------------------------------------------
    def broadcast(self, data: Any, from_process: int = 0) -> Any:
        """Copy ``from_process``'s tensors into every rank's tensors (same shapes), in place."""
        self._check_src(from_process)
        leaves, _ = _tree.flatten(data)
        if not self.ctx.is_distributed or not leaves:
            return data
        with self._collective("broadcast", leaves):
            sizes = [_align(t.numel() * t.element_size()) for t in leaves]
            buffer = torch.zeros(sum(sizes), dtype=torch.uint8, device=self._comm_device)
            offsets = [sum(sizes[:i]) for i in range(len(sizes))]
            self._pack(buffer, leaves, offsets)
            dist.broadcast(buffer, src=from_process)
            for tensor, offset in zip(leaves, offsets, strict=True):
                nbytes = tensor.numel() * tensor.element_size()
                src = buffer[offset: offset + nbytes].view(tensor.dtype).reshape(tensor.shape)
                with torch.no_grad():
                    tensor.copy_(src)
        return data

    def broadcast_object_list(self, objects: list[Any], from_process: int = 0) -> list[Any]:
        """Replace ``objects``' items on every rank by ``from_process``'s (picklable) items."""
        self._check_src(from_process)
        if not isinstance(objects, list):
            raise TypeError(f"broadcast_object_list needs a list, got {type(objects).__name__}")
        if self.ctx.is_distributed:
            with self._collective("broadcast_object_list", ()):
                dist.broadcast_object_list(objects, src=from_process)
        return objects

    def _check_src(self, from_process: int) -> None:
        if not 0 <= from_process < self.ctx.world_size:
            raise ValueError(f"from_process={from_process} is not a rank of this job (0.."
                             f"{self.ctx.world_size - 1})")

    # -- padding ----------------------------------------------------------------------------
    def pad_across_processes(self, data: Any, *, dim: int = 0, pad_index: int = 0,
                             pad_first: bool = False) -> Any:
        """Pad every tensor along ``dim`` to the largest size that any rank has (nested tensors,
        whose sizes vary within them, are left as they are)."""
        leaves, rebuild = _tree.flatten(data)
        if not self.ctx.is_distributed or not leaves:
            return data
        sizes = torch.tensor([t.shape[dim] if not t.is_nested and -t.dim() <= dim < t.dim() else 0
                              for t in leaves],
                             dtype=torch.int64, device=self._comm_device)
        with self._collective("pad_across_processes", leaves):
            dist.all_reduce(sizes, op=dist.ReduceOp.MAX)
        return rebuild([_pad(t, dim=dim, size=int(m), value=pad_index, first=pad_first)
                        for t, m in zip(leaves, sizes.tolist(), strict=True)])


def _unpack_uniform(leaves: list[torch.Tensor], *, shapes: list[tuple[int, ...]],
                    offsets: list[int], flat: torch.Tensor, world: int, row_bytes: int,
                    base: int) -> list[torch.Tensor]:
    """Every rank sent the same shapes: each leaf is a strided view of the gathered ``flat``
    buffer (``world`` rows of ``row_bytes``, leaf ``i`` at byte ``base + offsets[i]``),
    copied once into its result (which never shares memory with ``flat``)."""
    out = []
    for tensor, shape, offset in zip(leaves, shapes, offsets, strict=True):
        size, count = tensor.element_size(), math.prod(shape)
        start = base + offset
        if size <= _ALIGN:  # offsets and rows are 8-byte aligned
            typed = flat if flat.dtype == tensor.dtype else flat.view(tensor.dtype)
            block = typed.as_strided((world, count), (row_bytes // size, 1), start // size)
        else:  # e.g. complex128: copy the bytes out first (into a new, 16-byte aligned tensor:
            # ``contiguous()`` returns an empty view itself, which cannot be viewed as complex)
            raw = flat.view(torch.uint8).as_strided((world, count * size), (row_bytes, 1), start)
            block = torch.empty((world, count), dtype=tensor.dtype, device=flat.device)
            block.view(torch.uint8).copy_(raw)
        value = block.reshape((world * shape[0],) + shape[1:])
        if shape[0] == 1:  # the reshape was a view of ``flat``, which a kept receive buffer
            value = value.contiguous()  # reuses at the next gather: copy (a batch of one, 0-d)
        out.append(value if value.device == tensor.device else value.to(tensor.device))
    return out


def _pad(tensor: torch.Tensor, *, dim: int, size: int, value: int, first: bool) -> torch.Tensor:
    if tensor.is_nested or not -tensor.dim() <= dim < tensor.dim() or tensor.shape[dim] >= size:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = size
    out = tensor.new_full(shape, value)
    index = [slice(None)] * tensor.dim()
    length = tensor.shape[dim]
    index[dim] = slice(size - length, size) if first else slice(0, length)
    out[tuple(index)] = tensor
    return out
