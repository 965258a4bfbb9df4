"""``hvd.DistributedOptimizer``: an optimizer whose ``step()`` uses gradients averaged over ranks.

As in Horovod, the returned object is an instance of the wrapped optimizer's own class (a
subclass made on the fly), so LR schedulers, ``isinstance``, ``state_dict``/``load_state_dict``
and ``param_groups`` keep working; it also keeps the wrapped optimizer's state and settings.
Reductions overlap with backward: a hook on each parameter marks its gradient ready, and full
buckets of gradients go out as one asynchronous ``all_reduce`` each (see
:mod:`accel.horovod.buckets`); ``step()`` waits for them, then steps.

Gradient clipping, as in Horovod's documentation::

    loss.backward()
    optimizer.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with optimizer.skip_synchronize():
        optimizer.step()

Example:
    >>> import torch
    >>> import accel.horovod as hvd
    >>> hvd.init()
    >>> model = torch.nn.Linear(2, 1)
    >>> opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
    ...                                named_parameters=model.named_parameters())
    >>> isinstance(opt, torch.optim.SGD), type(opt).__name__, opt.param_groups[0]["lr"]
    (True, 'SGD', 0.1)
    >>> model(torch.ones(1, 2)).sum().backward(); opt.step(); opt.zero_grad()
    >>> hvd.shutdown()
"""

from __future__ import annotations

import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from .._base.warn import warn_user
from ._join_state import begin, done, joins_of
from ._plumbing import Scope, scope_of
from ._session import current
from .buckets import Bucket, Reducer, plan_by_groups, plan_by_size
from .compression import Compression, Compressor
from .process_sets import ProcessSet, global_process_set
from .reduce_op import Adasum, Average, name_of

__all__ = ["DistributedOptimizer"]

_MB = 1024 * 1024
#: DDP's defaults: a small first bucket (communication starts early), then 25 MB buckets.
_FIRST_BUCKET_MB = 1.0

ZERO_GRAD_PENDING = ("optimizer.zero_grad() was called after loss.backward() but before "
                     "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                     "cause a race condition: call optimizer.step() (or synchronize()) first.")
STEP_AFTER_SYNC = ("optimizer.step() called without optimizer.skip_synchronize() context after "
                   "optimizer.synchronize(). This can cause training slowdown. You may want to "
                   "consider using optimizer.skip_synchronize() context if you use "
                   "optimizer.synchronize() in your code.")


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods the on-the-fly subclass adds in front of the wrapped optimizer's class."""

    _hvd_reducer: Reducer | None
    _hvd_process_set: ProcessSet
    _hvd_synchronized: bool
    _hvd_should_synchronize: bool
    _hvd_hooks: list[Any]
    backward_passes_per_step: int
    op: int
    gradient_predivide_factor: float
    sparse_as_dense: bool

    @property
    def process_set(self) -> ProcessSet:
        return self._hvd_process_set

    def synchronize(self) -> None:
        """Finish every gradient reduction of this step (start those backward did not)."""
        if self._hvd_reducer is not None:
            self._hvd_reducer.finish()
        self._hvd_synchronized = True

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within the block, ``step()`` does not synchronize (call ``synchronize()`` before)."""
        self._hvd_should_synchronize = False
        try:
            yield
        finally:
            self._hvd_should_synchronize = True

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        if self._hvd_should_synchronize:
            if self._hvd_synchronized:
                # Horovod warns and reduces again; the gradients are final already, so accel
                # only warns (a second reduction would double them under op=Sum).
                warn_user(STEP_AFTER_SYNC)
            else:
                self.synchronize()
        self._hvd_synchronized = False
        step = super().step
        return step() if closure is None else step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As the wrapped optimizer's; raises while gradients of this step are in flight."""
        if self._hvd_reducer is not None and self._hvd_reducer.touched:
            raise AssertionError(ZERO_GRAD_PENDING)
        super().zero_grad(set_to_none)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._hvd_reducer is not None:
            self._hvd_reducer.reset(self.backward_passes_per_step)
        self._hvd_synchronized, self._hvd_should_synchronize = False, True
        super().load_state_dict(state_dict)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes are accumulated before a reduction."""
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = passes
        if self._hvd_reducer is not None:
            self._hvd_reducer.reset(passes)


def _named(optimizer: torch.optim.Optimizer,
           named_parameters: Iterable[Any] | None) -> dict[torch.Tensor, str]:
    """Horovod's checks: (name, tensor) tuples, unique names, every parameter named."""
    if named_parameters is None:
        pairs = [(f"allreduce.noname.{i}.{j}", v) for i, group in enumerate(optimizer.param_groups)
                 for j, v in enumerate(group["params"])]
    else:
        pairs = list(named_parameters)
    if any(not isinstance(p, tuple) for p in pairs):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    counts = Counter(k for k, _ in pairs)
    dups = sorted(k for k, n in counts.items() if n > 1)
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: "
                         + ", ".join(dups))
    named_ids = {id(v) for _, v in pairs}
    unnamed = [id(v) for g in optimizer.param_groups for v in g["params"] if id(v) not in named_ids]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were "
                         "not named. Python object ids: " + ", ".join(map(str, unnamed))
                         + " (pass model.named_parameters() of the model whose parameters the "
                         "optimizer holds)")
    return {v: k for k, v in pairs}


def _check_groups(groups: Any) -> None:
    if not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         "torch.Tensor.")
    if isinstance(groups, list):
        grouped: set[int] = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in grouped:
                    raise ValueError("A parameter can only appear once in groups.")
                grouped.add(id(p))


def _check_args(op: int, *, predivide: float, passes: int, num_groups: int, groups: Any) -> Any:
    name_of(op)
    if op == Adasum:
        raise ValueError("op=hvd.Adasum is not available in accel.horovod (torch.distributed has "
                         "no Adasum reduction); use op=hvd.Average (or hvd.Sum)")
    if predivide != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warn_user("Parameter `num_groups` has been replaced by `groups` and will be removed "
                  "in a future version; pass groups=N.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if passes <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if groups is not None:
        _check_groups(groups)
    return groups


def _subclass_instance(optimizer: torch.optim.Optimizer) -> Any:
    """An instance of a subclass of ``type(optimizer)`` that shares its groups and state."""
    base = type(optimizer)
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("this optimizer is already a hvd.DistributedOptimizer; wrap the plain "
                         "optimizer once")
    cls: Any = type(base.__name__, (_DistributedOptimizer, base),
                    {"__module__": base.__module__, "__qualname__": base.__qualname__})
    obj = cls.__new__(cls)
    for key, value in vars(optimizer).items():
        if callable(value) and hasattr(base, key):
            continue  # a method patched on the instance (e.g. by an LR scheduler)
        if isinstance(value, OrderedDict) and key.endswith("_hooks"):
            value = OrderedDict(value)  # its own hook tables from now on
        setattr(obj, key, value)
    return obj


def _plan(opt: Any, *, params: list[torch.Tensor], groups: Any,
          bucket_cap_mb: float) -> list[list[torch.Tensor]]:
    if groups is not None:
        return plan_by_groups(params, groups)
    cap = max(1, int(bucket_cap_mb * _MB))
    return plan_by_size(params, cap, min(cap, int(_FIRST_BUCKET_MB * _MB)))


def _check_same_plan(plan: list[list[torch.Tensor]], names: dict[torch.Tensor, str],
                     scope: Scope) -> None:
    """Every rank must send the same buckets in the same order, or the reductions mismatch."""
    mine = [[(names[p], tuple(p.shape), str(p.dtype)) for p in b] for b in plan]
    everyone: list[Any] = [None] * scope.size
    ticket = begin(scope, desc=("allgather_object",), what="DistributedOptimizer")
    dist.all_gather_object(everyone, mine, group=scope.group)
    done(scope, ticket)
    for rank, theirs in enumerate(everyone):
        if theirs != mine:
            raise ValueError(
                "hvd.DistributedOptimizer: the parameters (names, shapes, dtypes, order) differ "
                f"between this rank and rank {rank} of the process set; build the same model "
                "and optimizer on every rank")


def _install(opt: Any, *, names: dict[torch.Tensor, str], compression: Any, groups: Any,
             bucket_cap_mb: float) -> None:
    """Plan the buckets and register the gradient hooks (only when there is someone to talk to:
    Horovod skips the hooks in a one-process job)."""
    opt._hvd_reducer, opt._hvd_hooks = None, []
    process_set: ProcessSet = opt._hvd_process_set
    current()  # Horovod's error before hvd.init()
    if process_set.included() is False or not dist.is_initialized():
        return  # not a member: this rank takes no part (as in Horovod)
    scope = scope_of(process_set)
    if scope.size <= 1:
        return
    params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
    plan = _plan(opt, params=params, groups=groups, bucket_cap_mb=bucket_cap_mb)
    _check_same_plan(plan, names, scope)
    reducer = Reducer(buckets=[Bucket(params=b) for b in plan], compression=compression, op=opt.op,
                      predivide=opt.gradient_predivide_factor, group=scope.group,
                      group_size=scope.size, passes=opt.backward_passes_per_step,
                      sparse_as_dense=opt.sparse_as_dense, name_of=lambda p: names.get(p, "?"),
                      joins=joins_of(scope.session), set_id=scope.set_id)
    for p in params:
        opt._hvd_hooks.append(p.register_post_accumulate_grad_hook(reducer.grad_ready))
    opt._hvd_reducer = reducer
    # A dropped optimizer must not keep reducing (a new one may be built on the same model).
    weakref.finalize(opt, _remove_hooks, list(opt._hvd_hooks))


def _remove_hooks(handles: list[Any]) -> None:
    for handle in handles:
        handle.remove()


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: type[Compressor] | Compressor = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: int | Sequence[Sequence[torch.Tensor]] | None = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
    *,
    bucket_cap_mb: float = 25.0,
) -> Any:
    """Wrap ``optimizer`` so that ``step()`` applies gradients reduced over ``process_set``.

    Args:
        optimizer: the optimizer to wrap (its class, groups, settings and state are kept).
        named_parameters: ``model.named_parameters()``; names are checked (unique, complete).
        compression: how buckets travel (``hvd.Compression.fp16`` halves the bytes).
        backward_passes_per_step: backward passes accumulated locally before the reduction
            (the sum of the passes is reduced, as in Horovod: scale the loss yourself).
        op: ``hvd.Average`` (default) or ``hvd.Sum`` (``Min``/``Max``/``Product`` also work);
            ``hvd.Adasum`` is refused (no Adasum on torch.distributed).
        gradient_predivide_factor: with ``Average``, gradients are scaled by ``1/factor``
            before the sum and by ``factor/size`` after it.
        num_groups: deprecated spelling of ``groups=N``.
        groups: ``N`` (the parameters in N consecutive groups) or lists of parameters reduced
            together; otherwise buckets of ``bucket_cap_mb`` (accel's keyword, DDP's default).
        sparse_as_dense: reduce sparse gradients as dense ones (else they are refused).
        process_set: the ranks to reduce over (default: all).
    """
    groups = _check_args(op, predivide=gradient_predivide_factor, passes=backward_passes_per_step,
                         num_groups=num_groups,
                         groups=groups)
    names = _named(optimizer, named_parameters)
    opt = _subclass_instance(optimizer)
    opt.backward_passes_per_step = backward_passes_per_step
    opt.op = op
    opt.gradient_predivide_factor = gradient_predivide_factor
    opt.sparse_as_dense = sparse_as_dense
    opt._hvd_process_set = process_set
    opt._hvd_synchronized, opt._hvd_should_synchronize = False, True
    opt._compression = compression
    _install(opt, names=names, compression=compression, groups=groups, bucket_cap_mb=bucket_cap_mb)
    return opt
