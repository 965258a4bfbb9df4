"""accel.utils at world size 1 (multi-process collectives: tests/distributed)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch

from accel import utils


def test_set_seed_reproduces_all_generators() -> None:
    utils.set_seed(123)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    utils.set_seed(123)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first
    with pytest.raises(TypeError, match="seed must be an int"):
        utils.set_seed("1")  # type: ignore[arg-type]


def test_collectives_without_a_group_are_identity() -> None:
    t = torch.arange(3)
    assert utils.gather(t).tolist() == [0, 1, 2]
    assert utils.gather(torch.tensor(5.0)).tolist() == [5.0]
    assert utils.reduce(torch.tensor([2.0]), "mean").tolist() == [2.0]
    assert utils.gather_object(["a"]) == ["a"]
    assert utils.broadcast_object_list([1]) == [1]
    assert utils.pad_across_processes(t) is t
    assert torch.equal(utils.send_to_device({"x": t}, torch.device("cpu"))["x"], t)


# -- the names Accelerate scripts import from accelerate.utils (issue 15) ----------------------


def test_tqdm_and_wait_for_everyone_without_a_group() -> None:
    from accel.run.progress import tqdm

    assert utils.tqdm is tqdm
    assert utils.wait_for_everyone() is None  # no process group: nothing to wait for


def test_patch_environment_sets_upper_cased_strings_and_restores() -> None:
    import os

    from accel import env

    assert "ACCEL_T_NEW" not in os.environ and "ACCEL_T_OLD" not in os.environ
    with env.patched({"ACCEL_T_OLD": "before"}):
        with utils.patch_environment(accel_t_new=3, accel_t_old=True):
            assert os.environ["ACCEL_T_NEW"] == "3"
            assert os.environ["ACCEL_T_OLD"] == "True"
        assert "ACCEL_T_NEW" not in os.environ
        assert os.environ["ACCEL_T_OLD"] == "before"
        with pytest.raises(KeyError), utils.patch_environment(accel_t_old="during"):
            raise KeyError("the block fails")
        assert os.environ["ACCEL_T_OLD"] == "before"  # restored on the error too
    assert "ACCEL_T_OLD" not in os.environ


def test_write_basic_config_shares_accel_config_default(tmp_path: Any) -> None:
    from accel.launch.config_cmd import default_values
    from accel.launch.config_file import load_yaml, read_config

    target = tmp_path / "sub" / "cfg.yaml"
    assert utils.write_basic_config("bf16", target) == target
    gpus = torch.cuda.device_count()
    assert load_yaml(target) == default_values(gpus, "bf16")
    assert read_config(target).values["mixed_precision"] == "bf16"
    before = target.read_text()
    with pytest.warns(UserWarning, match="already exists"):
        assert utils.write_basic_config("fp16", target) is False
    assert target.read_text() == before  # never overwritten
    with pytest.raises(ValueError, match="expected one of 'no', 'fp16', 'bf16'"):
        utils.write_basic_config("fp8", tmp_path / "other.yaml")
    # default location: where `accel launch` looks ($ACCEL_CONFIG_FILE first)
    with utils.patch_environment(ACCEL_CONFIG_FILE=str(tmp_path / "env.yaml")):
        assert utils.write_basic_config() == tmp_path / "env.yaml"
    assert load_yaml(tmp_path / "env.yaml")["mixed_precision"] == "no"


def test_synchronize_rng_states_on_one_process_checks_its_arguments() -> None:
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    gen = torch.Generator().manual_seed(3)
    utils.synchronize_rng_states(["torch", "generator"], generator=gen)
    assert torch.equal(torch.rand(2), expected)  # one process: states unchanged
    with pytest.raises(ValueError, match="needs the generator"):
        utils.synchronize_rng_states(["generator"])
    with pytest.raises(ValueError, match="unknown rng type 'npu'"):
        utils.synchronize_rng_states(["npu"])
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no cuda device is available"):
            utils.synchronize_rng_state("cuda")


def test_ddp_communication_hook_type_and_kwargs() -> None:
    from accel import DDPCommunicationHookType as Hook

    assert [(m.name, m.value) for m in Hook] == [
        ("NO", "no"), ("FP16", "fp16"), ("BF16", "bf16"), ("POWER_SGD", "power_sgd"),
        ("BATCHED_POWER_SGD", "batched_power_sgd")]
    kw = utils.DistributedDataParallelKwargs(
        comm_hook="power_sgd", comm_wrapper=Hook.FP16,  # type: ignore[arg-type]
        comm_state_option={"matrix_approximation_rank": 2}, static_graph=True)
    assert kw.comm_hook is Hook.POWER_SGD
    assert kw.to_kwargs() == {"static_graph": True}  # the hook never reaches DDP's constructor
    with pytest.raises(ValueError, match="comm_wrapper=.*POWER_SGD.*expected one of"):
        utils.DistributedDataParallelKwargs(comm_wrapper=Hook.POWER_SGD)
    with pytest.raises(ValueError, match="comm_hook='zip'"):
        utils.DistributedDataParallelKwargs(comm_hook="zip")  # type: ignore[arg-type]
    with pytest.warns(UserWarning, match="comm_wrapper=BF16 is ignored without a comm_hook"):
        utils.DistributedDataParallelKwargs(comm_wrapper=Hook.BF16)
    with pytest.warns(UserWarning, match="comm_state_option is used by the PowerSGD hooks"):
        utils.DistributedDataParallelKwargs(comm_hook=Hook.FP16, comm_state_option={"a": 1})


def test_is_compiled_module_and_extract_model_from_parallel() -> None:
    from accel import Accelerator

    net = torch.nn.Linear(2, 1)
    compiled = torch.compile(net)  # wrapping only: nothing is compiled until it runs
    assert not utils.is_compiled_module(net) and utils.is_compiled_module(compiled)
    assert utils.extract_model_from_parallel(compiled) is compiled
    assert utils.extract_model_from_parallel(compiled, keep_torch_compile=False) is net
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    prepared = acc.prepare(torch.nn.Linear(2, 1))
    assert "forward" in vars(prepared)  # the autocast wrapper
    assert utils.extract_model_from_parallel(prepared) is prepared
    assert "forward" in vars(prepared)
    utils.extract_model_from_parallel(prepared, keep_fp32_wrapper=False)
    assert "forward" not in vars(prepared)
    # nn.DataParallel (a CPU-only torch wraps without replicating), also under torch.compile
    parallel = torch.nn.DataParallel(net)
    assert utils.extract_model_from_parallel(parallel) is net
    assert acc.unwrap_model(torch.compile(parallel), keep_torch_compile=False) is net


def test_availability_probes_do_not_import() -> None:
    import sys

    probes = [getattr(utils, name) for name in utils.__all__ if name.startswith("is_")
              and name.endswith("_available")]
    assert len(probes) >= 20
    loaded = set(sys.modules)
    assert all(isinstance(probe(), bool) for probe in probes)
    assert not {"wandb", "mlflow", "comet_ml", "aim", "tensorboard"} & (set(sys.modules) - loaded)
    assert utils.is_tqdm_available()  # a dependency of accel
    with pytest.raises(ValueError, match="cannot both be True"):
        utils.is_torch_xla_available(check_is_tpu=True, check_is_gpu=True)
    from accel._base.optional import is_available

    with utils.patch_environment(PJRT_DEVICE="TPU"):
        assert utils.is_torch_xla_available(check_is_tpu=True) == is_available("torch_xla")
        assert utils.is_torch_xla_available(check_is_gpu=True) is False
        assert utils.is_bf16_available(ignore_tpu=True) is not is_available("torch_xla")
    assert utils.is_cuda_available() == (torch.cuda.device_count() > 0)


def test_local_sgd_on_one_process_and_bad_arguments() -> None:
    from accel import Accelerator
    from accel.local_sgd import LocalSGD

    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(2, 1))
    before = [p.detach().clone() for p in model.parameters()]
    with LocalSGD(acc, model, local_sgd_steps=2) as local_sgd:
        assert not local_sgd.enabled  # one process: nothing to average
        for _ in range(3):
            local_sgd.step()
    assert local_sgd.num_steps == 3
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="local_sgd_steps must be an integer >= 1"):
            LocalSGD(acc, model, local_sgd_steps=bad)  # type: ignore[arg-type]
