"""find_executable_batch_size, release_memory, free_memory, clear_device_cache."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

import pytest
import torch

from accel.run.memory import (
    clear_device_cache,
    find_executable_batch_size,
    free_memory,
    release_memory,
    should_reduce_batch_size,
)

OOMS: list[Callable[[], BaseException]] = [
    lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
    lambda: torch.cuda.OutOfMemoryError("boom"),
    lambda: RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB"),
    lambda: RuntimeError("CUDA error: out of memory"),
    lambda: RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't "
                         "allocate memory: you tried to allocate 999 bytes."),
]


@pytest.mark.parametrize("make_error", OOMS)
def test_reduces_by_a_tenth_on_oom_and_stops_at_the_first_size_that_fits(
        make_error: Callable[[], BaseException]) -> None:
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size: int, scale: int, *, offset: int = 0) -> int:
        tried.append(batch_size)
        if batch_size > 50:
            raise make_error()
        return batch_size * scale + offset

    assert train(10, offset=1) == 451
    assert tried == [64, 57, 51, 45]  # int(size * 0.9), as in Accelerate
    tried.clear()
    assert train(1) == 45  # every call starts again from starting_batch_size
    assert tried == [64, 57, 51, 45]


def test_other_errors_propagate_at_once() -> None:
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=8)
    def train(batch_size: int) -> None:
        tried.append(batch_size)
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        train()
    assert tried == [8]
    assert not should_reduce_batch_size(ValueError("out of memory"))
    assert not should_reduce_batch_size(RuntimeError("expected a tensor"))


def test_reaching_zero_raises_with_the_sizes_tried() -> None:
    def train(batch_size: int) -> None:
        raise RuntimeError("CUDA out of memory.")

    with pytest.raises(RuntimeError, match=r"train: no executable batch size found, reached "
                                           r"zero.*\(8, 7, 6, 5, 4, 3, 2, 1\)"
                                           r".*Last error: RuntimeError: CUDA out of memory"):
        find_executable_batch_size(train, starting_batch_size=8)()


def test_custom_reduction_and_bad_reduction() -> None:
    tried: list[int] = []

    def train(batch_size: int) -> int:
        tried.append(batch_size)
        if batch_size > 70:
            raise torch.OutOfMemoryError("no")
        return batch_size

    assert find_executable_batch_size(train, 100, lambda b: b - 10)() == 70
    assert tried == [100, 90, 80, 70]
    with pytest.raises(ValueError, match=r"reduce_batch_size_fn\(100\) returned 100"):
        find_executable_batch_size(train, 100, lambda b: b)()
    sizes = iter([95, 75, 60])  # Accelerate's form: no argument, it tracks the size itself
    tried.clear()
    assert find_executable_batch_size(train, 100, lambda: next(sizes))() == 60
    assert tried == [100, 95, 75, 60]


def test_previous_attempt_is_released_before_the_next() -> None:
    attempts: list[weakref.ref[torch.Tensor]] = []
    alive_at_start: list[bool] = []

    @find_executable_batch_size(starting_batch_size=4)
    def train(batch_size: int) -> int:
        alive_at_start.append(any(ref() is not None for ref in attempts))
        activations = torch.zeros(batch_size, 1000)  # held by the traceback of a failed try
        attempts.append(weakref.ref(activations))
        if batch_size > 1:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return int(activations.shape[0])

    assert train() == 1
    assert alive_at_start == [False] * 4  # sizes 4, 3, 2, 1


def test_batch_size_must_be_the_first_argument() -> None:
    with pytest.raises(TypeError, match="must take the batch size as its first positional"):
        find_executable_batch_size(lambda: None)
    with pytest.raises(TypeError, match="must take the batch size"):
        find_executable_batch_size(lambda *, batch_size: None)

    @find_executable_batch_size(starting_batch_size=2)
    def train(batch_size: int, model: str) -> str:
        return f"{model}:{batch_size}"

    with pytest.raises(TypeError, match="called with the batch size as its first argument"):
        train(64, "m")
    with pytest.raises(TypeError, match="do not fit"):
        train()
    assert train("m") == "m:2"
    assert train.__name__ == "train"
    with pytest.raises(ValueError, match="starting_batch_size"):
        find_executable_batch_size(lambda b: b, starting_batch_size=-1)
    at_zero = find_executable_batch_size(lambda b: b, starting_batch_size=0)  # as Accelerate:
    with pytest.raises(RuntimeError, match="reached zero: starting_batch_size is 0"):
        at_zero()  # raised on the call


def test_release_memory_returns_nones_and_frees() -> None:
    big = torch.zeros(1000)
    ref = weakref.ref(big)
    a, b, c = release_memory(big, [1], "x")
    assert (a, b, c) == (None, None, None)
    del big
    gc.collect()
    assert ref() is None
    assert release_memory() == []
    assert free_memory is release_memory
    cuda_before = torch.cuda.is_initialized()
    clear_device_cache(garbage_collection=True)
    assert torch.cuda.is_initialized() == cuda_before  # never initialises CUDA
