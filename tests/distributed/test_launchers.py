"""Each launcher's variables, set in real child processes, give a working 2-process gloo group.

One spawn per launcher flavour (`mpirun` from Open MPI, MPICH/Intel MPI's hydra, Slurm's
`srun`): no RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT at all, so the rendezvous is 127.0.0.1 on the
port every rank derives from the job id. The job id is chosen per test so that its port is free.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import pytest

from accel.env import detect_launch
from tests.spawn import free_port, run_workers

EnvFor = Callable[[int, int, str], dict[str, str]]


def _openmpi_env(rank: int, world: int, job: str) -> dict[str, str]:
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(world),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": str(world),
            "OMPI_COMM_WORLD_NODE_RANK": "0", "PMIX_RANK": str(rank), "PMIX_NAMESPACE": job}


def _mpich_env(rank: int, world: int, job: str) -> dict[str, str]:
    # PMI_ID differs per rank on purpose: it must not be mistaken for the job id
    return {"PMI_RANK": str(rank), "PMI_SIZE": str(world), "PMI_ID": str(rank),
            "MPI_LOCALRANKID": str(rank), "MPI_LOCALNRANKS": str(world), "PMI_JOBID": job}


def _slurm_env(rank: int, world: int, job: str) -> dict[str, str]:
    return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(world),
            "SLURM_STEP_NUM_TASKS": str(world), "SLURM_LOCALID": str(rank),
            "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_STEP_NUM_NODES": "1",
            "SLURM_STEP_TASKS_PER_NODE": str(world), "SLURM_STEP_NODELIST": "localnode",
            "SLURM_JOB_ID": job, "SLURM_STEP_ID": "0"}


FLAVOURS: dict[str, EnvFor] = {"openmpi": _openmpi_env, "mpich": _mpich_env,
                               "slurm": _slurm_env}


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _job_with_free_port(env_for: EnvFor, world: int) -> tuple[str, int]:
    """A job id whose derived rendezvous port is free on this machine, and that port."""
    for _ in range(50):
        job = f"accel-test-{uuid.uuid4().hex[:12]}"
        info = detect_launch(env_for(0, world, job))
        if info.master_addr == "127.0.0.1" and _port_is_free(info.master_port):
            return job, info.master_port
    raise RuntimeError("no job id with a free derived port after 50 tries")


def _launcher_worker(rank: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from accel.device import select_device
    from accel.distributed import build_context, start_process_group

    info = detect_launch()
    device = select_device(cpu=True)
    ctx = build_context(info, device)
    group = start_process_group(ctx, info=info, device=device, timeout=timedelta(seconds=60))
    out: dict[str, Any] = {
        "launcher": ctx.launcher, "rank": ctx.rank, "world": ctx.world_size,
        "local_rank": ctx.local_rank, "local_world": ctx.local_world_size,
        "node_rank": ctx.node_rank, "backend": ctx.backend, "device": str(ctx.device),
        "addr_port": (info.master_addr, info.master_port),
        "dist_rank": dist.get_rank(), "dist_world": dist.get_world_size(),
        "dist_backend": str(dist.get_backend()), "owned": group.owned,
        "has_store": group.store() is not None,
    }
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    out["all_reduce"] = value.item()
    # idempotent: a second start adopts the group and closing that handle destroys nothing
    again = start_process_group(ctx, info=info, device=device)
    out["again"] = (again.owned, again.backend)
    again.close()
    out["alive_after_adopted_close"] = dist.is_initialized()
    value = torch.tensor([10.0 * (rank + 1)])
    dist.all_reduce(value)
    out["all_reduce_again"] = value.item()
    dist.barrier()
    group.close()
    out["closed"] = not dist.is_initialized()
    out["owned_after_close"] = group.owned
    group.close()  # a second close is harmless
    return out


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_launcher_variables_give_a_two_process_gloo_group(flavour: str) -> None:
    env_for, world = FLAVOURS[flavour], 2
    job, port = _job_with_free_port(env_for, world)

    def make_env(rank: int, world_size: int, _free_port: int) -> Mapping[str, str]:
        return env_for(rank, world_size, job)

    results = run_workers(_launcher_worker, world, env=make_env)
    for rank, r in enumerate(results):
        assert r["launcher"] == flavour
        assert (r["rank"], r["world"], r["local_rank"], r["local_world"], r["node_rank"]) == \
            (rank, world, rank, world, 0)
        assert (r["dist_rank"], r["dist_world"]) == (rank, world)
        assert r["backend"] == r["dist_backend"] == "gloo" and r["device"] == "cpu"
        assert r["addr_port"] == ("127.0.0.1", port)
        assert r["owned"] and r["has_store"]
        assert r["all_reduce"] == 3.0 and r["all_reduce_again"] == 30.0
        assert r["again"] == (False, "gloo")
        assert r["alive_after_adopted_close"]
        assert r["closed"] and not r["owned_after_close"]


def _user_group_worker(rank: int, port: int) -> dict[str, Any]:
    """The user started the group (as with mp.spawn) and no launcher variables are set."""
    import torch.distributed as dist

    from accel.device import select_device
    from accel.distributed import build_context, start_process_group

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=60))
    info = detect_launch()
    device = select_device(cpu=True)
    ctx = build_context(info, device)
    group = start_process_group(ctx, info=info, device=device)
    out = {"info": (info.launcher, info.world_size), "ctx": (ctx.rank, ctx.world_size,
           ctx.local_rank, ctx.local_world_size, ctx.node_rank), "owned": group.owned,
           "backend": group.backend}
    group.close()
    out["still_initialized"] = dist.is_initialized()
    dist.destroy_process_group()
    return out


def test_a_group_started_by_the_user_is_adopted_and_left_alone() -> None:
    def no_launcher(rank: int, world: int, port: int) -> Mapping[str, str]:
        return {}

    results = run_workers(_user_group_worker, 2, args=(free_port(),), env=no_launcher)
    for rank, r in enumerate(results):
        assert r["info"] == ("none", 1)
        assert r["ctx"] == (rank, 2, rank, 2, 0)
        assert (r["owned"], r["backend"]) == (False, "gloo")
        assert r["still_initialized"]


def test_build_context_single_process_and_node_rank() -> None:
    from accel.device import select_device
    from accel.distributed import ProcessContext, build_context
    from accel.env import LaunchInfo

    device = select_device(cpu=True)
    single = build_context(detect_launch({}), device)
    assert single == ProcessContext.single(device.torch_device(0))
    assert single.is_main_process and single.is_local_main_process and single.is_last_process
    assert not single.is_distributed and single.num_nodes == 1
    info = LaunchInfo(launcher="slurm", rank=5, local_rank=1, world_size=6, local_world_size=2,
                      node_rank=2, master_addr="n1", master_port=1234)
    ctx = build_context(info, device)
    assert (ctx.rank, ctx.local_rank, ctx.node_rank, ctx.num_nodes) == (5, 1, 2, 3)
    assert ctx.is_last_process and not ctx.is_main_process and not ctx.is_local_main_process


def test_build_context_refuses_a_group_that_contradicts_the_launcher(tmp_path: Any) -> None:
    import torch.distributed as dist

    from accel.device import select_device
    from accel.distributed import build_context
    from accel.env import LaunchInfo

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        info = LaunchInfo(launcher="torchrun", rank=1, local_rank=1, world_size=2,
                          local_world_size=2, node_rank=0, master_addr="127.0.0.1",
                          master_port=29500)
        with pytest.raises(RuntimeError, match="rank 0 of 1 but the launcher environment "
                                               "says rank 1 of 2"):
            build_context(info, select_device(cpu=True))
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------ real GPUs


def _nccl_worker(rank: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from accel.device import select_device
    from accel.distributed import build_context, start_process_group

    info = detect_launch()
    device = select_device("cuda")
    ctx = build_context(info, device)
    group = start_process_group(ctx, info=info, device=device, timeout=timedelta(seconds=120))
    value = torch.tensor([float(rank + 1)], device=ctx.device)
    dist.all_reduce(value)
    out = {"current": torch.cuda.current_device(), "device": str(ctx.device),
           "backend": str(dist.get_backend()), "sum": value.item()}
    group.close()
    return out


@pytest.mark.cuda
def test_nccl_group_binds_each_local_rank_to_its_gpu() -> None:
    from accel.device.cuda import CUDADevice

    world = min(CUDADevice.count(), 2)
    if world < 2:
        pytest.skip(f"a 2-process nccl group needs 2 GPUs; {world} visible (NCCL refuses two "
                    "ranks on one GPU). Single-GPU binding is tests/unit/device/test_device.py")
    results = run_workers(_nccl_worker, world, timeout=180)
    for rank, r in enumerate(results):
        assert r["current"] == rank and r["device"] == f"cuda:{rank}"
        assert r["backend"] == "nccl" and r["sum"] == 3.0
