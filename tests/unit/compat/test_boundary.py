"""The Accelerate boundary (issue 27): Accelerate's names, refusals and aliases live in
accel/compat; the engine's facade and strategies carry none of them."""

from __future__ import annotations

import importlib
import inspect
import os
import pickle
import sys
from typing import Any

import pytest
import torch

import accel
from accel.accelerator import facade
from accel.compat import accelerator as public
from accel.compat.distributed_type import DistributedType
from accel.compat.operations import COMMUNICATORS, GroupCommunicators
from accel.compat.refusals import (
    REFUSED,
    UNSUPPORTED_ARGUMENTS,
    NotProvidedError,
    NotSupportedError,
    is_stand_in,
)


def test_distributed_type_is_one_enum_under_every_accelerate_path() -> None:
    import accel.accelerator
    import accel.config
    import accel.utils
    import accel.utils.dataclasses

    for owner in (accel, accel.utils, accel.utils.dataclasses, accel.accelerator):
        assert owner.DistributedType is DistributedType
    assert not hasattr(accel.config, "DistributedType")  # L0 knows no Accelerate enum


def test_the_engine_facade_has_no_accelerate_only_members() -> None:
    for name in ("state", "gradient_state", "distributed_type", "is_fsdp2", "deepspeed_plugin",
                 "split_batches", "data_parallel_shard_rank"):
        assert not hasattr(facade.Accelerator, name), name
        assert hasattr(public.Accelerator, name), name
    assert accel.Accelerator is public.Accelerator
    assert issubclass(public.Accelerator, facade.Accelerator)
    # the public signature is the engine's: refused names are not parameters
    params = inspect.signature(accel.Accelerator).parameters
    assert list(params) == list(inspect.signature(facade.Accelerator).parameters)
    assert not set(UNSUPPORTED_ARGUMENTS) & set(params)


def test_the_engine_facade_runs_alone() -> None:
    engine = facade.Accelerator(cpu=True)
    model = engine.prepare(torch.nn.Linear(2, 1))
    assert engine.sync_gradients and engine.reduce(torch.tensor([2.0])).tolist() == [2.0]
    with engine.main_process_first(), engine.split_between_processes([1, 2]) as mine:
        assert mine == [1, 2]
    assert engine.on_process(process_index=0)(lambda: "ran")() == "ran"
    with pytest.raises(ValueError, match="on_local_process needs local_process_index="):
        engine.on_local_process(lambda: None)
    engine.sync_gradients = False
    assert not engine.sync_gradients
    assert model is not None
    with pytest.raises(TypeError, match="unexpected keyword argument 'split_batches'"):
        facade.Accelerator(cpu=True, split_batches=True)  # type: ignore[call-arg]


def test_split_batches_is_taken_as_accelerate_takes_it_and_honoured() -> None:
    wanted = r"DataLoaderConfiguration\(split_batches=True\)"
    with pytest.warns(FutureWarning, match=wanted) as seen:
        acc = accel.Accelerator(cpu=True, split_batches=True)  # type: ignore[call-arg]
    assert seen[0].filename == __file__  # the user's line, through the compat __init__
    assert acc.split_batches and acc.dataloader_config.split_batches
    config = accel.DataLoaderConfiguration(split_batches=True, even_batches=False)
    with pytest.warns(FutureWarning):
        same = accel.Accelerator(cpu=True, split_batches=True,  # type: ignore[call-arg]
                                 dataloader_config=config)
    assert same.dataloader_config is config
    with pytest.raises(ValueError, match="disagrees with dataloader_config"):
        accel.Accelerator(cpu=True, split_batches=False,  # type: ignore[call-arg]
                          dataloader_config=config)


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_ARGUMENTS))
def test_the_public_accelerator_refuses_accelerate_arguments_with_the_fix(name: str) -> None:
    with pytest.raises(TypeError, match="unsupported argument") as err:
        accel.Accelerator(cpu=True, **{name: object()})
    assert UNSUPPORTED_ARGUMENTS[name] in str(err.value)


def test_unknown_arguments_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match="'colour': it is not an Accelerator argument"):
        accel.Accelerator(cpu=True, colour="blue")


def test_public_accelerator_views_pickle_and_state_is_kept() -> None:
    acc = accel.Accelerator(cpu=True)
    assert acc.state is acc.state and acc.gradient_state is acc.gradient_state
    acc.gradient_state.sync_gradients = False
    assert not acc.sync_gradients  # the view is the run's own flag
    acc.sync_gradients = True
    copy = pickle.loads(pickle.dumps(acc))
    assert type(copy) is public.Accelerator and copy.distributed_type is DistributedType.NO
    assert copy.state.num_processes == 1


def test_notebook_launcher_still_finds_a_public_accelerator() -> None:
    from accel.launch.notebook import _check_parent

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("CUDA is initialised in this process: the check stops there first")
    acc = accel.Accelerator(cpu=True)
    with pytest.raises(RuntimeError, match="an accel Accelerator already exists"):
        _check_parent(cuda=True)
    del acc


def test_local_sgd_needs_no_distributed_type() -> None:
    from accel.local_sgd import LocalSGD

    source = inspect.getsource(sys.modules["accel.accelerator.local_sgd"])
    assert "DistributedType" not in source
    acc = accel.Accelerator(cpu=True)
    acc.state.distributed_type = DistributedType.XLA  # what a script reports changes nothing
    model = acc.prepare(torch.nn.Linear(2, 1))
    with LocalSGD(acc, model, local_sgd_steps=2) as local_sgd:
        local_sgd.step()
    assert not local_sgd.enabled  # one process


# -- refusals: "not supported: use X" at the Accelerate path (DESIGN.md §6) -------------------


@pytest.mark.parametrize(("path", "name", "reason"), [
    ("accel.utils", "DeepSpeedPlugin", "DeepSpeed is not supported"),
    ("accel.utils.dataclasses", "DeepSpeedPlugin", "DeepSpeed is not supported"),
    ("accel.utils.operations", "find_batch_size", "nested-tensor helpers"),
    ("accel.state", "is_initialized", "PartialState().initialized"),
    ("accel.data_loader", "get_sampler", "batch_sampler"),
    ("accel.checkpointing", "save_custom_state", "register_for_checkpointing"),
    ("accel.utils.modeling", "get_module_leaves", "placement algorithm"),
    ("accel.tracking", "register_tracker_class", "GeneralTracker"),
    ("accel", "DeepSpeedPlugin", "DeepSpeed is not supported"),
])
def test_a_refused_name_imports_and_says_why_when_used(path: str, name: str,
                                                        reason: str) -> None:
    namespace: dict[str, Any] = {}
    exec(f"from {path} import {name}", namespace)  # a script may import what it never uses
    found = namespace[name]
    module = importlib.import_module(path)
    assert getattr(module, name) is found and is_stand_in(found)
    assert not isinstance(object(), found) and repr(found).endswith("not supported by accel>")
    with pytest.raises(NotSupportedError, match=f"{path}.{name} is not supported: ") as err:
        found()
    assert reason in str(err.value) and isinstance(err.value, NotImplementedError)
    with pytest.raises(NotProvidedError, match=f"{path}.{name} is not supported: ") as got:
        found.some_member  # noqa: B018
    assert reason in str(got.value)
    assert name not in getattr(module, "__all__", [])  # a star import leaves it out


def test_a_name_another_path_has_points_there() -> None:
    with pytest.raises(ImportError, match="accel provides it as `accel.utils.convert_bytes`"):
        exec("from accel.utils.other import convert_bytes", {})
    with pytest.raises(ImportError, match="cannot import name 'no_such_name'"):
        exec("from accel.utils import no_such_name", {})  # not Accelerate's: plain error


def test_refused_accelerator_attributes_say_why() -> None:
    acc = accel.Accelerator(cpu=True)
    assert not hasattr(acc, "profile")
    with pytest.raises(NotProvidedError, match="Accelerator.profile is not supported: use "
                       "`torch.profiler`"):
        acc.profile  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'profilee'") as err:
        acc.profilee  # noqa: B018
    assert not isinstance(err.value, NotProvidedError)


def test_every_refused_name_is_really_absent() -> None:
    provided = []
    for path, refused in REFUSED.items():
        owner: Any = accel.Accelerator if path == "accel.Accelerator" else \
            importlib.import_module(path)
        provided += [f"{path}.{n}" for n in refused
                     if n in dir(owner) and not is_stand_in(getattr(owner, n))]
    assert not provided, f"refused but provided (drop them from REFUSED): {provided}"


# -- one communicator per process group; debug without os.environ ------------------------------


def test_accel_utils_reuses_one_communicator_and_debug_leaves_the_environment() -> None:
    from accel import PartialState, utils
    from accel.distributed.debug import consistency_check

    first = COMMUNICATORS.current()
    utils.gather(torch.tensor([1.0]))
    assert COMMUNICATORS.current() is first  # not rebuilt per call
    assert GroupCommunicators().current() is not first  # a holder of its own
    environment = dict(os.environ)
    state = PartialState(cpu=True)
    state.debug = True
    assert state.debug and consistency_check in first.hooks
    assert dict(os.environ) == environment
    state.debug = False
    assert not state.debug and consistency_check not in first.hooks
    assert dict(os.environ) == environment
