"""Memory helpers: retry with a smaller batch on out-of-memory, release references and caches.

Example:
    >>> @find_executable_batch_size(starting_batch_size=64)
    ... def train(batch_size):
    ...     if batch_size > 50:
    ...         raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    ...     return batch_size
    >>> train()  # 64, 57 and 51 did not fit
    45
"""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = [
    "clear_device_cache",
    "find_executable_batch_size",
    "free_memory",
    "release_memory",
    "should_reduce_batch_size",
]

R = TypeVar("R")

#: Substrings of RuntimeError messages that mean "this batch does not fit".
_OOM_MESSAGES = (
    "out of memory",  # "CUDA out of memory.", "CUDA error: out of memory", "XPU out of memory"...
    "DefaultCPUAllocator: can't allocate memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",  # what cuDNN raises for oversized batches
)


def should_reduce_batch_size(exception: BaseException) -> bool:
    """True when ``exception`` is an out-of-memory error that a smaller batch may avoid.

    Example:
        >>> should_reduce_batch_size(RuntimeError("CUDA error: out of memory"))
        True
        >>> should_reduce_batch_size(ValueError("out of memory"))
        False
    """
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)
    if oom_types and isinstance(exception, oom_types):
        return True
    if isinstance(exception, RuntimeError) and len(exception.args) == 1:
        message = str(exception.args[0])
        return any(part in message for part in _OOM_MESSAGES)
    return False


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Run ``gc`` (optionally) and empty the allocator caches of backends already in use.

    CUDA and XPU caches are emptied only when that backend is already initialised, so this never
    initialises CUDA (a later ``fork`` keeps working). MPS has no "initialised" query; its cache
    is emptied when MPS is available (MPS has no fork restriction).

    Example:
        >>> clear_device_cache(garbage_collection=True)
    """
    if garbage_collection:
        gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and getattr(xpu, "is_initialized", lambda: False)():
        xpu.empty_cache()
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        torch.mps.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop references, collect garbage and empty device caches; returns one None per object.

    Python cannot clear the caller's variables, so rebind them to the result:

    Example:
        >>> a, b = [1.0] * 10, {"x": 1}
        >>> a, b = release_memory(a, b)
        >>> a is None and b is None
        True
    """
    released: list[None] = [None] * len(objects)
    del objects
    clear_device_cache(garbage_collection=True)
    return released


#: ``accelerate``'s other name for it (``Accelerator.free_memory`` also drops its own references).
free_memory = release_memory


def _check_signature(function: Callable[..., Any]) -> inspect.Signature:
    name = getattr(function, "__name__", repr(function))
    signature = inspect.signature(function)
    first = next(iter(signature.parameters.values()), None)
    if first is None or first.kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                           inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                           inspect.Parameter.VAR_POSITIONAL):
        raise TypeError(
            f"find_executable_batch_size: `{name}{signature}` must take the batch size as its "
            f"first positional argument, e.g. `def {name}(batch_size, ...)`"
        )
    return signature


def _call_error(name: str, *, signature: inspect.Signature, exc: TypeError,
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        return (f"{name}() was called with arguments that do not fit `{name}{signature}` after "
                f"the batch size that find_executable_batch_size passes first: {exc}")
    return (f"{name}() was called with the batch size as its first argument, but "
            "find_executable_batch_size passes it: call it without the batch size, e.g. "
            f"`{name}(model)` for `def {name}(batch_size, model)`")


def _retry(function: Callable[..., R], *, name: str, batch_size: int,
           reduce: Callable[[int], int], args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
    tried: list[int] = []
    last = ""
    while batch_size > 0:
        clear_device_cache(garbage_collection=True)
        tried.append(batch_size)
        try:
            return function(batch_size, *args, **kwargs)
        except Exception as exc:  # re-raised below unless it is an OOM
            if not should_reduce_batch_size(exc):
                raise
            last = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        # Out of the except block: the exception and its frames (and tensors) are released.
        smaller = reduce(batch_size)
        if not isinstance(smaller, int) or smaller >= batch_size:
            raise ValueError(f"reduce_batch_size_fn({batch_size}) returned {smaller!r}; it "
                             "must return a smaller int")
        batch_size = smaller
    clear_device_cache(garbage_collection=True)
    if not tried:
        raise RuntimeError(f"{name}: no executable batch size found, reached zero: "
                           "starting_batch_size is 0; start from a positive batch size")
    raise RuntimeError(
        f"{name}: no executable batch size found, reached zero; every size tried ran out of "
        f"memory ({', '.join(map(str, tried))}). Last error: {last}. Reduce the model or input "
        "size, or the memory other processes use."
    )


def _reduction(reduce_batch_size_fn: Callable[..., int] | None) -> Callable[[int], int]:
    """``reduce(batch_size) -> smaller``: 90 % of it by default (as in Accelerate); a function
    that takes no argument (Accelerate's form, which tracks the size itself) is called bare."""
    if reduce_batch_size_fn is None:
        return lambda size: int(size * 0.9)
    given = reduce_batch_size_fn
    try:
        inspect.signature(given).bind(0)
    except TypeError:
        return lambda size: given()
    except ValueError:  # no signature (some builtins): called with the size
        pass
    return given


def find_executable_batch_size(
    function: Callable[..., R] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[..., int] | None = None,
) -> Any:
    """Call ``function(batch_size, *args, **kwargs)``, retrying with a smaller batch on OOM.

    The batch size starts at ``starting_batch_size`` on every call and is multiplied by 0.9
    (rounded down, as in Accelerate) after each out-of-memory error (see
    :func:`should_reduce_batch_size`), or reduced by ``reduce_batch_size_fn``: called with the
    failed size, or with no argument (Accelerate's form); it must return a smaller int. Garbage
    is collected and device caches are emptied before each try. Any other exception propagates
    unchanged. Call the decorated function *without* the batch size: the decorator supplies it.

    Raises:
        TypeError: ``function`` does not take the batch size first, or was called with it.
        ValueError: ``starting_batch_size`` is negative.
        RuntimeError: every batch size down to 1 ran out of memory, or
            ``starting_batch_size`` is 0 (raised when the function is called, as in Accelerate).

    Example:
        >>> @find_executable_batch_size(starting_batch_size=8)
        ... def run(batch_size, scale):
        ...     return batch_size * scale
        >>> run(10)
        80
    """
    if function is None:
        return functools.partial(find_executable_batch_size,
                                 starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)
    if starting_batch_size < 0:
        raise ValueError(f"starting_batch_size must be a positive int, got {starting_batch_size}")
    signature = _check_signature(function)
    reduce = _reduction(reduce_batch_size_fn)
    name = getattr(function, "__name__", repr(function))

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> R:
        try:
            signature.bind(starting_batch_size, *args, **kwargs)
        except TypeError as exc:
            raise TypeError(_call_error(name, signature=signature, exc=exc, args=args,
                                        kwargs=kwargs)) from None
        return _retry(function, name=name, batch_size=starting_batch_size, reduce=reduce, args=args,
                      kwargs=kwargs)

    return wrapper
