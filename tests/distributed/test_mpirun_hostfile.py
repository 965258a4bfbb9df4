"""``mpirun -np 4 -hostfile F -x MASTER_ADDR -x MASTER_PORT python train.py`` with F listing two
hosts of two slots each: the variables Open MPI sets for that layout, in 4 real processes on this
machine (2 "nodes" x 2), give the job accel and ``accel.horovod`` expect, unchanged.

Open MPI is not installed here (and CI has no apt step), so the layout is simulated: what a
hostfile changes is only which rank lands on which node (``OMPI_COMM_WORLD_LOCAL_*``,
``OMPI_COMM_WORLD_NODE_RANK``); the rendezvous is MASTER_ADDR/MASTER_PORT, as a multi-node MPI
job needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accel.launch.hosts import assign, read_hostfile
from accel.launch.mpirun import first_host
from tests.spawn import run_workers

HOSTFILE = "# two machines, two slots each\nnode-a slots=2\nnode-b slots=2\n"


def _openmpi_layout(placed: list[tuple[str, int]], job: str) -> Any:
    """Open MPI's per-rank variables for ranks placed by slot, host after host (--map-by slot,
    its default with a hostfile)."""
    nodes = [node for node, (_, count) in enumerate(placed) for _ in range(count)]
    world = len(nodes)

    def env(rank: int, world_size: int, port: int) -> Mapping[str, str]:
        assert world_size == world
        node = nodes[rank]
        local = nodes[:rank].count(node)
        return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(world),
                "OMPI_COMM_WORLD_LOCAL_RANK": str(local),
                "OMPI_COMM_WORLD_LOCAL_SIZE": str(nodes.count(node)),
                "OMPI_COMM_WORLD_NODE_RANK": str(node), "PMIX_RANK": str(rank),
                "PMIX_NAMESPACE": job,
                # -x MASTER_ADDR=node-a -x MASTER_PORT=...: node-a is this machine here
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    return env


def _train(rank: int) -> dict[str, Any]:
    """What a Horovod-style script asks (with only its import line changed)."""
    import torch
    import torch.distributed as dist

    import accel.horovod as hvd
    from accel.env import detect_launch

    hvd.init()
    info = detect_launch()
    total = torch.tensor([float(hvd.rank() + 1)])
    dist.all_reduce(total)
    out = {"launcher": info.launcher, "rank": hvd.rank(), "size": hvd.size(),
           "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
           "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
           "homogeneous": hvd.is_homogeneous(), "node_rank": info.node_rank,
           "num_nodes": info.num_nodes, "sum": total.item()}
    hvd.shutdown()
    return out


def test_mpirun_with_a_two_host_hostfile_needs_no_change(tmp_path: Any) -> None:
    path = tmp_path / "hostfile"
    path.write_text(HOSTFILE)
    assert first_host(str(path)) == ("node-a", 2)  # where rank 0 (and MASTER_ADDR) lives
    placed = [(host.name, count) for host, count in assign(read_hostfile(str(path)), 4)]
    assert placed == [("node-a", 2), ("node-b", 2)]
    results = run_workers(_train, 4, env=_openmpi_layout(placed, "accel-mpirun-hostfile"))
    for rank, r in enumerate(results):
        assert r == {"launcher": "openmpi", "rank": rank, "size": 4, "local_rank": rank % 2,
                     "local_size": 2, "cross_rank": rank // 2, "cross_size": 2,
                     "homogeneous": True, "node_rank": rank // 2, "num_nodes": 2,
                     "sum": 10.0}
