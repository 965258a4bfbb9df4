"""Accelerate's ``accelerate.utils.operations``: collectives on torch's default process group.

They work on the group started by an ``Accelerator``, a ``PartialState``, torchrun or the user;
with no group they are the world-size-1 no-ops. With ``ACCEL_DEBUG=1`` (or ``state.debug =
True``) every collective first checks that the ranks called the same operation on tensors of
the same shape and dtype, and raises :class:`DistributedOperationException` naming each rank's
call when they did not.

They run through one :class:`~accel.distributed.Communicator` per process group, so that a
gather whose shapes every rank sent last time takes the communicator's fast path (reused
buffers, one collective). :class:`GroupCommunicators` is the per-process holder of those
communicators (DESIGN.md §3.2's one kind of module-level state): it keys each by its
``torch.distributed`` group object, weakly, so a destroyed group's communicator goes with it,
and it reads the environment (``ACCEL_DEBUG``, the launcher's ranks) once per group.
``PartialState`` views of a multi-process job share the group's communicator, so
``state.debug = True`` reaches these functions too.

Example:
    >>> import torch
    >>> gather(torch.tensor([1, 2])).tolist(), reduce(torch.tensor([3.0]), "sum").tolist()
    ([1, 2], [3.0])
"""

from __future__ import annotations

import functools
import pickle
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from .. import env
from .._base import tree as _tree
from .._base.warn import warn_user
from ..data import send_to_device
from ..device import DEVICE_KINDS
from ..distributed import Communicator, ProcessContext, build_context
from ..distributed.debug import consistency_check
from ..distributed.ops import CollectiveMismatchError

__all__ = ["CannotPadNestedTensorWarning", "DistributedOperationException", "broadcast",
           "broadcast_object_list", "concatenate", "convert_outputs_to_fp32", "convert_to_fp32",
           "copy_tensor_to_devices", "find_device", "gather", "gather_object", "is_namedtuple",
           "listify", "pad_across_processes", "pad_input_tensors", "recursively_apply", "reduce",
           "send_to_device", "wait_for_everyone"]

#: Accelerate's name for what the ``ACCEL_DEBUG`` check raises.
DistributedOperationException = CollectiveMismatchError


class GroupCommunicators:
    """One :class:`Communicator` per ``torch.distributed`` process group, held by the group.

    Example:
        >>> holder = GroupCommunicators()
        >>> holder.current() is holder.current()  # no process group: one of this process alone
        True
    """

    def __init__(self) -> None:
        self._by_group: weakref.WeakKeyDictionary[Any, Communicator] = \
            weakref.WeakKeyDictionary()
        self._alone: Communicator | None = None

    def current(self, ctx: ProcessContext | None = None) -> Communicator:
        """The communicator of torch's default group, built on first use.

        ``ctx``: the context to build it with (a ``PartialState``'s); by default the one
        derivation that the Accelerator uses too (``build_context``: the group's rank, the
        launcher's local rank). Debug checks follow ``ACCEL_DEBUG`` when it is built, and
        ``state.debug`` afterwards.
        """
        if not (dist.is_available() and dist.is_initialized()):
            if self._alone is None:
                self._alone = Communicator(ProcessContext.single())
            return self._alone
        group = dist.group.WORLD
        comm = self._by_group.get(group)
        if comm is None:
            if ctx is None:
                kind = {"nccl": "cuda", "xla": "xla"}.get(str(dist.get_backend()), "cpu")
                ctx = build_context(env.detect_launch(), DEVICE_KINDS[kind]())
            hooks = [consistency_check] if env.read_settings().debug else []
            comm = self._by_group[group] = Communicator(ctx, hooks)
        return comm


#: This process's communicators (the holder named in the module docstring).
COMMUNICATORS = GroupCommunicators()


def _comm() -> Communicator:
    return COMMUNICATORS.current()


def gather(tensor: Any) -> Any:
    """Concatenate tensors from all ranks along dim 0 (first dims may differ)."""
    return _comm().gather(tensor)


def gather_object(obj: Any) -> list[Any]:
    """Gather picklable objects from all ranks (lists are concatenated)."""
    return _comm().gather_object(obj)


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """All-reduce tensors; ``reduction`` is sum, mean (Accelerate's default here), max or min."""
    return _comm().reduce(tensor, reduction, scale)


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Copy ``from_process``'s tensors into every rank's tensors, in place."""
    return _comm().broadcast(tensor, from_process)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the list's items on every rank by ``from_process``'s items."""
    return _comm().broadcast_object_list(object_list, from_process)


def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0,
                         pad_first: bool = False) -> Any:
    """Pad tensors along ``dim`` to the largest size on any rank (a nested tensor is left as it
    is, with a :class:`CannotPadNestedTensorWarning`: its sizes vary within it)."""
    if any(leaf.is_nested for leaf in _tree.flatten(tensor)[0]):
        warn_user("Cannot pad nested tensors without more information. Leaving unprocessed.",
                  category=CannotPadNestedTensorWarning)
    return _comm().pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)


class CannotPadNestedTensorWarning(UserWarning):
    """``pad_across_processes`` met a nested tensor and left it unpadded."""


def wait_for_everyone() -> None:
    """Barrier: every rank waits here until all have arrived (a no-op without a process group).

    Every rank must reach the call, or the others wait forever.
    """
    _comm().barrier()


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """The main process's ``tensor`` on every process's device; the others pass None (they
    need not know its shape or dtype).

    Example:
        >>> copy_tensor_to_devices(torch.tensor([1, 2])).tolist()
        [1, 2]
    """
    comm = _comm()
    ctx = comm.ctx
    if ctx.is_main_process and not isinstance(tensor, torch.Tensor):
        raise TypeError("copy_tensor_to_devices(tensor): the main process must pass a tensor "
                        f"(the others pass None), got {type(tensor).__name__}")
    if not ctx.is_distributed:
        assert tensor is not None
        return tensor.to(ctx.device)
    meta: list[Any] = [(tuple(tensor.shape), tensor.dtype) if tensor is not None
                       and ctx.is_main_process else None]
    comm.broadcast_object_list(meta, 0)
    shape, dtype = meta[0]
    if ctx.is_main_process and tensor is not None:
        out = tensor.to(ctx.device).clone()
    else:
        out = torch.empty(shape, dtype=dtype, device=ctx.device)
    return comm.broadcast(out, 0)  # type: ignore[no-any-return]


# -- nested structures (Accelerate's tree helpers) -------------------------------------------


def is_namedtuple(data: Any) -> bool:
    """Whether ``data`` is a ``namedtuple`` (or ``typing.NamedTuple``) instance: a tuple with
    ``_fields`` and ``_asdict``.

    Example:
        >>> from collections import namedtuple
        >>> is_namedtuple(namedtuple("Point", "x y")(1, 2)), is_namedtuple((1, 2))
        (True, False)
    """
    return _tree.is_namedtuple(data) and hasattr(data, "_asdict")


def _is_torch_tensor(data: Any) -> bool:
    return isinstance(data, torch.Tensor)


def _same_kind(like: Any, items: Any) -> Any:
    """``items`` (an iterable) as a sequence of ``like``'s type (list, tuple or namedtuple)."""
    return type(like)(*items) if is_namedtuple(like) else type(like)(items)


def recursively_apply(func: Callable[..., Any], data: Any, *args: Any,
                      test_type: Callable[[Any], bool] = _is_torch_tensor,
                      error_on_other_type: bool = False, **kwargs: Any) -> Any:
    """``data`` (nested lists, tuples, namedtuples and mappings) with ``func(leaf, *args,
    **kwargs)`` in place of every leaf for which ``test_type(leaf)`` is true (by default: every
    tensor). Other leaves are kept as they are, or with ``error_on_other_type`` raise
    ``TypeError``. Containers keep their types.

    Example:
        >>> recursively_apply(lambda t, k: t * k, {"a": [torch.ones(1)], "b": 2}, 3)
        {'a': [tensor([3.])], 'b': 2}
    """
    def walk(item: Any) -> Any:
        if isinstance(item, (tuple, list)):
            return _same_kind(item, (walk(x) for x in item))
        if isinstance(item, Mapping):
            return type(item)({key: walk(value) for key, value in item.items()})  # type: ignore[call-arg]
        if test_type(item):
            return func(item, *args, **kwargs)
        if error_on_other_type:
            test = "is_torch_tensor" if test_type is _is_torch_tensor else \
                getattr(test_type, "__name__", repr(test_type))
            raise TypeError(f"Unsupported types ({type(item)}) passed to "
                            f"`{getattr(func, '__name__', repr(func))}`. Only nested "
                            f"list/tuple/dicts of objects that are valid for `{test}` should be "
                            "passed.")
        return item

    return walk(data)


def concatenate(data: Any, dim: int = 0) -> Any:
    """Concatenate a list of batches of the same structure (tensors, or lists, tuples and dicts
    of them) along ``dim``, leaf by leaf; a single batch comes back as it is.

    Raises:
        TypeError: a leaf is not a tensor and there is more than one batch.

    Example:
        >>> concatenate([{"x": torch.zeros(2)}, {"x": torch.ones(1)}])["x"].tolist()
        [0.0, 0.0, 1.0]
    """
    first = data[0]
    if isinstance(first, (tuple, list)):
        return _same_kind(first, (concatenate([batch[i] for batch in data], dim=dim)
                                  for i in range(len(first))))
    if isinstance(first, Mapping):
        return type(first)({key: concatenate([batch[key] for batch in data], dim=dim)  # type: ignore[call-arg]
                            for key in first})
    if isinstance(first, torch.Tensor):
        return torch.cat(data, dim=dim)
    if isinstance(data, (tuple, list)) and len(data) == 1:
        return first
    raise TypeError(f"concatenate: can only concatenate tensors, got {type(first)}; keep "
                    "non-tensor values out of the batches (or gather them with gather_object)")


def listify(data: Any) -> Any:
    """``data`` with every tensor turned into (nested) Python numbers (``tensor.tolist()``,
    bfloat16 read as float32).

    Example:
        >>> listify({"a": torch.tensor([1, 2]), "b": (torch.tensor(0.5, dtype=torch.bfloat16),)})
        {'a': [1, 2], 'b': (0.5,)}
    """
    def to_list(tensor: torch.Tensor) -> Any:
        tensor = tensor.detach().cpu()
        if tensor.dtype == torch.bfloat16:  # numpy (behind tolist) has no bfloat16
            tensor = tensor.float()
        return tensor.tolist()

    return recursively_apply(to_list, data)


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Pad every tensor of ``tensor`` with zeros along ``dim`` from ``batch_size`` rows to the
    next multiple of ``num_processes`` (at least ``num_processes``), so that the batch splits
    evenly across the processes.

    Example:
        >>> pad_input_tensors(torch.ones(3, 2), 3, 2).tolist()
        [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]
    """
    if num_processes < 1:
        raise ValueError(f"pad_input_tensors: num_processes must be >= 1, got {num_processes}")
    target = max(1, -(-batch_size // num_processes)) * num_processes

    def pad(item: torch.Tensor) -> torch.Tensor:
        if item.shape[dim] > target:
            raise ValueError(f"pad_input_tensors: the tensor has {item.shape[dim]} rows along "
                             f"dim {dim}, more than batch_size={batch_size} padded to {target}; "
                             "pass the tensor's own batch size")
        shape = list(item.shape)
        shape[dim] = target
        out = item.new_zeros(shape)
        out.narrow(dim, 0, item.shape[dim]).copy_(item)
        return out

    return recursively_apply(pad, tensor, error_on_other_type=True)


def _is_half(data: Any) -> bool:
    return (isinstance(data, torch.Tensor) or hasattr(data, "dtype")) and \
        data.dtype in (torch.float16, torch.bfloat16)


def _to_float(tensor: Any) -> Any:
    return tensor.float()


def convert_to_fp32(tensor: Any) -> Any:
    """``tensor`` (nested lists, tuples and dicts of tensors) with every float16 or bfloat16
    tensor converted to float32; other values unchanged.

    Example:
        >>> convert_to_fp32({"y": torch.ones(1, dtype=torch.float16), "n": 1})["y"].dtype
        torch.float32
    """
    return recursively_apply(_to_float, tensor, test_type=_is_half)


class _Fp32Outputs:
    """A forward whose outputs come back in float32; refuses to be pickled (say how to unwrap)."""

    def __init__(self, model_forward: Callable[..., Any]) -> None:
        self.model_forward = model_forward
        functools.update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> Any:
        raise pickle.PicklingError(
            "cannot pickle a model whose forward converts its outputs to float32 (mixed "
            "precision): unwrap it first with accelerator.unwrap_model(model) or "
            "extract_model_from_parallel(model, keep_fp32_wrapper=False)")


def convert_outputs_to_fp32(model_forward: Callable[..., Any]) -> Callable[..., Any]:
    """``model_forward`` with its float16/bfloat16 outputs converted to float32 (see
    :func:`convert_to_fp32`). ``extract_model_from_parallel(model, keep_fp32_wrapper=False)``
    puts the original forward back.

    Example:
        >>> forward = convert_outputs_to_fp32(lambda x: x.half())
        >>> forward(torch.ones(1)).dtype
        torch.float32
    """
    wrapper = _Fp32Outputs(model_forward)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return wrapper(*args, **kwargs)

    forward.__wrapped__ = wrapper  # type: ignore[attr-defined]
    # what accel.precision.remove_forward_wrapper reads to undo a forward wrapper
    forward._accel_original = model_forward  # type: ignore[attr-defined]
    return forward


def find_device(data: Any) -> torch.device | None:
    """The device of the first tensor in ``data`` (nested lists, tuples and dicts), or None.

    Example:
        >>> find_device([1, "a", {"t": torch.zeros(1)}])
        device(type='cpu')
    """
    if isinstance(data, torch.Tensor):
        return data.device
    if isinstance(data, Mapping):
        data = list(data.values())
    if isinstance(data, (tuple, list)):
        for item in data:
            device = find_device(item)
            if device is not None:
                return device
    return None
