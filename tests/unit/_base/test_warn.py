"""warn_user: a warning about the user's code points at the user's line, however deep in accel.

Code compiled under a file name inside the accel package counts as accel's frames (that is all
``warn_user`` looks at), so the synthetic call paths below need no test-only code in accel.
"""

from __future__ import annotations

import sys
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import accel
from accel._base import warn as warn_module
from accel._base.warn import warn_user

ACCEL_FILE = str(Path(accel.__file__).parent / "_base" / "_synthetic_for_test_warn.py")

#: Several accel frames: a function, a context manager (contextlib frames in between), a
#: function decorated with torch.no_grad (torch's contextlib wrapper) and a thread target.
SYNTHETIC = """
import contextlib
import torch
from accel._base.warn import warn_user

def deepest(message, category):
    warn_user(message, category)

@torch.no_grad()
def middle(message, category):
    deepest(message, category)

@contextlib.contextmanager
def managed(message, category):
    middle(message, category)
    yield

def outer(message, category):
    return managed(message, category)

def in_thread(message, category):
    thread = threading.Thread(target=deepest, args=(message, category))
    thread.start()
    thread.join()

WARN_LINE = 7  # the warn_user line in deepest()
"""


@pytest.fixture
def synthetic() -> ModuleType:
    module = ModuleType("accel._synthetic_for_test_warn")
    module.__file__ = ACCEL_FILE
    module.__dict__["threading"] = threading
    exec(compile(SYNTHETIC, ACCEL_FILE, "exec"), module.__dict__)
    return module


def _record(fn: Any, *args: Any) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(*args)
    return list(caught)


def test_the_package_directory_is_found_from_the_module_name() -> None:
    assert str(Path(accel.__file__).parent) == warn_module._PACKAGE_DIR
    assert warn_module._PACKAGE == "accel"


def test_through_accel_frames_and_a_context_manager_it_names_the_users_line(
        synthetic: ModuleType) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        with synthetic.outer("check your config", DeprecationWarning):
            pass
    assert len(caught) == 1
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)
    assert caught[0].category is DeprecationWarning and str(caught[0].message) == \
        "check your config"


def test_the_category_filters_and_the_once_registry_behave_as_warnings_warn(
        synthetic: ModuleType) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # once per location
        for _ in range(3):
            synthetic.deepest("repeated", UserWarning)
    assert len(caught) == 1 and caught[0].filename == __file__
    with warnings.catch_warnings(), pytest.raises(FutureWarning, match="as an error"):
        warnings.simplefilter("error", FutureWarning)
        synthetic.deepest("as an error", FutureWarning)


def test_without_a_user_frame_it_names_accels_own_line(synthetic: ModuleType) -> None:
    """A warning from an accel thread: every frame is accel's or thread start-up."""
    caught = _record(synthetic.in_thread, "from a thread", UserWarning)
    assert len(caught) == 1
    assert (caught[0].filename, caught[0].lineno) == (ACCEL_FILE, synthetic.WARN_LINE)


def test_called_directly_from_user_code_it_names_that_line() -> None:
    caught = _record(lambda: warn_user("direct"))
    line = sys._getframe().f_lineno - 1
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


# ------------------------------------------------------------------ real warnings of accel
def test_a_config_warning_raised_in_a_dataclass_post_init_names_the_constructor_line() -> None:
    """accel.config: the warning passes __post_init__ and the __init__ @dataclass generated."""
    from accel.config import DDPCommunicationHookType, DistributedDataParallelKwargs

    with pytest.warns(UserWarning, match="comm_wrapper=BF16 is ignored") as caught:
        line = sys._getframe().f_lineno + 1
        DistributedDataParallelKwargs(comm_wrapper=DDPCommunicationHookType.BF16)
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


def test_a_connector_warning_names_the_accelerator_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """accel.run.connector, through the facade's constructor and the connector's helpers."""
    from accel import Accelerator

    monkeypatch.setenv("ACCEL_MIXED_PRECISION", "bf16")
    with pytest.warns(UserWarning, match="overrides ACCEL_MIXED_PRECISION") as caught:
        line = sys._getframe().f_lineno + 1
        Accelerator(cpu=True, mixed_precision="no")
    mine = [w for w in caught if "overrides ACCEL_MIXED_PRECISION" in str(w.message)]
    assert [(w.filename, w.lineno) for w in mine] == [(__file__, line)]


class _Stream(IterableDataset[torch.Tensor]):
    def __iter__(self) -> Any:
        return iter(torch.arange(4.0).split(1))


def test_a_data_warning_from_a_context_manager_names_the_with_line() -> None:
    """accel.data: override_even_batches is a context manager; its warning names the ``with``."""
    from accel.config import DataLoaderConfiguration
    from accel.data import DataTracker, build_prepared_loader, override_even_batches
    from accel.distributed import Communicator, ProcessContext

    ctx = ProcessContext.single()
    loader = build_prepared_loader(DataLoader(_Stream(), batch_size=None), ctx=ctx,
                                   comm=Communicator(ctx), device=None,
                                   config=DataLoaderConfiguration(), tracker=DataTracker(), seed=0)
    with pytest.warns(UserWarning, match="only supported for map-style datasets") as caught:
        line = sys._getframe().f_lineno + 1
        with override_even_batches([loader], even=False):
            pass
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


def test_a_warning_from_optimizer_step_names_the_step_line() -> None:
    """accel.horovod: torch wraps ``optimizer.step`` (profiling and LR-scheduler hooks) in
    frames of its own; the warning passes them and names the script's ``step()`` line."""
    import accel.horovod as hvd

    hvd.init()
    try:
        model = torch.nn.Linear(2, 1)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        torch.optim.lr_scheduler.StepLR(opt, step_size=1)  # wraps opt.step once more
        model(torch.ones(1, 2)).sum().backward()
        opt.synchronize()
        with pytest.warns(UserWarning, match="skip_synchronize") as caught:
            line = sys._getframe().f_lineno + 1
            opt.step()
    finally:
        hvd.shutdown()
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)
