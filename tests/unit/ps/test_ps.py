"""accel.ps in one process: roles from the environment, launch flags, partitions, sparse
optimizers, server shards (sync rounds, re-partitioning restore) and the tables in local mode
(the process holds the only server). Multi-process behaviour: tests/e2e/test_ps.py."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from accel import Accelerator, ps
from accel.env import LaunchEnvironmentError, detect_launch, parse_ps_layout, ps_role
from accel.launch.cli import build_parser
from accel.launch.errors import CLIError
from accel.launch.ps_launch import ps_flags
from accel.ps.optimizers import optimizer_from_config
from accel.ps.partition import Partition, initial_weight, shard_initial
from accel.ps.server import ServerState, Shard, TableConfig


def _env(layout: str, rank: int, local: int, local_world: int, node: int, world: int
         ) -> dict[str, str]:
    return {"ACCEL_PS_LAYOUT": layout, "RANK": str(rank), "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(local_world), "GROUP_RANK": str(node),
            "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


# -- roles -------------------------------------------------------------------------------------
def test_roles_of_a_two_machine_layout_number_servers_and_workers_machine_by_machine() -> None:
    layout = "1:2,1:2"
    seen = []
    for rank in range(6):
        node, local = divmod(rank, 3)
        role = ps_role(_env(layout, rank, local, 3, node, 6))
        assert role is not None
        seen.append((role.role, role.index, role.local_index, role.local_count))
        assert (role.server_num, role.worker_num, role.world_size) == (2, 4, 6)
    assert seen == [("server", 0, 0, 1), ("worker", 0, 0, 2), ("worker", 1, 1, 2),
                    ("server", 1, 0, 1), ("worker", 2, 0, 2), ("worker", 3, 1, 2)]
    assert ps_role({}) is None


def test_workers_alone_form_the_process_group_and_a_server_is_a_process_of_its_own() -> None:
    worker = detect_launch(_env("1:2", 2, 2, 3, 0, 3))
    assert (worker.launcher, worker.rank, worker.world_size, worker.local_rank,
            worker.local_world_size) == ("torchrun", 1, 2, 1, 2)
    server = detect_launch(_env("1:2", 0, 0, 3, 0, 3))
    assert (server.rank, server.world_size, server.is_distributed) == (0, 1, False)


@pytest.mark.parametrize("layout, match", [("1-2", "servers:workers"), ("0:2", "at least one"),
                                           ("2:0", "at least one")])
def test_a_bad_layout_is_an_error_naming_the_variable(layout: str, match: str) -> None:
    with pytest.raises(LaunchEnvironmentError, match=match):
        parse_ps_layout(layout)


def test_a_layout_that_does_not_match_the_formed_job_is_an_error() -> None:
    with pytest.raises(LaunchEnvironmentError, match="torchrun started 4 processes"):
        ps_role(_env("1:2", 0, 0, 4, 0, 4))
    with pytest.raises(LaunchEnvironmentError, match="describes 1 machine"):
        ps_role(_env("1:2", 3, 0, 3, 1, 6))


# -- launch flags ------------------------------------------------------------------------------
def test_server_and_worker_counts_become_processes_and_the_layout() -> None:
    flags, layout, sources = ps_flags({"server_num": 2, "worker_num": 4, "num_machines": 2,
                                       "script": "t.py"}, lambda host: False)
    assert (flags["num_processes"], layout, "server_num" in flags) == (6, "1:2,1:2", False)
    assert sources == {"num_processes": "flag --server_num 2 + --worker_num 4"}
    assert ps_flags({"script": "t.py"}, lambda host: False) == ({"script": "t.py"}, None, {})
    args = build_parser().parse_args(["launch", "--server_num", "1", "--worker_num", "2",
                                      "--servers", "a:1", "--workers", "a,b", "t.py"])
    assert (args.server_num, args.worker_num, args.servers, args.workers) == (1, 2, "a:1", "a,b")


def test_fleetrun_host_lists_set_machines_main_address_and_this_machines_rank() -> None:
    flags, layout, sources = ps_flags({"servers": "10.0.0.1:6170,10.0.0.2:6170",
                                       "workers": "10.0.0.1,10.0.0.2"},
                                      lambda host: host == "10.0.0.2")
    assert sources["machine_rank"] == sources["num_machines"] == "flag --servers/--workers"
    assert layout == "1:1,1:1"
    assert (flags["num_processes"], flags["num_machines"], flags["main_process_ip"],
            flags["machine_rank"]) == (4, 2, "10.0.0.1", 1)


@pytest.mark.parametrize("flags, match", [
    ({"server_num": 1}, "both --server_num and --worker_num"),
    ({"server_num": 1, "worker_num": 2, "num_processes": 4}, "--num_processes 4 contradicts"),
    ({"server_num": 1, "worker_num": 2, "num_machines": 2}, "divide evenly"),
    ({"servers": "a"}, "go together"),
    ({"servers": "a,b", "workers": "a,a,b"}, "same number of processes"),
    ({"servers": "a,b", "workers": "a,b"}, "say which with --machine_rank"),
    ({"server_num": 1, "worker_num": 1, "mpirun_hostfile": "h"}, "mpirun"),
])
def test_contradicting_ps_flags_are_one_line_errors(flags: dict[str, object], match: str) -> None:
    with pytest.raises(CLIError, match=match):
        ps_flags(flags, lambda host: False)


# -- partitions and initial rows ---------------------------------------------------------------
@pytest.mark.parametrize("kind", ["hash", "range"])
@pytest.mark.parametrize("servers", [1, 2, 3, 7])
def test_every_row_has_exactly_one_server_and_slot(kind: str, servers: int) -> None:
    part = Partition(num_embeddings=20, servers=servers, kind=kind)
    ids = torch.arange(20)
    owner, local = part.owner(ids), part.local(ids)
    for s in range(servers):
        mine = ids[owner == s]
        assert torch.equal(mine, part.global_ids(s)) and len(mine) == part.rows(s)
        assert torch.equal(local[owner == s], torch.arange(part.rows(s)))
    with pytest.raises(ValueError, match="'hash' or 'range'"):
        Partition(num_embeddings=20, servers=2, kind="modulo")


def test_initial_rows_do_not_depend_on_the_server_count() -> None:
    full = initial_weight(70_000, 3, seed=5, scale=0.2)  # more than one generator block
    for servers in (1, 2, 3):
        part = Partition(num_embeddings=70_000, servers=servers, kind="hash")
        for s in range(servers):
            assert torch.equal(shard_initial(part, server=s, dim=3, seed=5, scale=0.2), full[part.global_ids(s)])
    assert float(full.abs().max()) <= 0.2 and not torch.equal(full, initial_weight(70_000, 3, 6,
                                                                                   0.2))


# -- sparse optimizers -------------------------------------------------------------------------
def test_adagrad_rule_equals_torch_adagrad_on_sparse_gradients() -> None:
    weight = torch.randn(6, 3)
    ref = torch.nn.Parameter(weight.clone())
    opt = torch.optim.Adagrad([ref], lr=0.3, eps=1e-10)
    rule = ps.Adagrad(lr=0.3)
    state = rule.init_state(6, 3)
    for rows in ([1, 4], [4, 5]):
        grad = torch.randn(2, 3)
        ref.grad = torch.sparse_coo_tensor(torch.tensor([rows]), grad, (6, 3),
                                           check_invariants=True)
        opt.step()
        rule.apply(weight, state, torch.tensor(rows), grad)
    assert torch.allclose(weight, ref.detach(), atol=1e-6, rtol=0)


def test_adam_counts_steps_per_row_and_leaves_untouched_rows_alone() -> None:
    rule = ps.Adam(lr=0.1)
    weight = torch.zeros(3, 1)
    state = rule.init_state(3, 1)
    rule.apply(weight, state, torch.tensor([0]), torch.ones(1, 1))
    rule.apply(weight, state, torch.tensor([0, 1]), torch.ones(2, 1))
    assert state["step"].flatten().tolist() == [2.0, 1.0, 0.0]
    # a first step of Adam moves by lr (bias-corrected), whatever the gradient's size
    assert weight[1].item() == pytest.approx(-0.1, abs=1e-6) and weight[2].item() == 0.0
    assert optimizer_from_config(rule.config()) == rule
    with pytest.raises(ValueError, match="unknown sparse optimizer"):
        optimizer_from_config({"kind": "Lion", "lr": 0.1})
    with pytest.raises(ValueError, match="positive"):
        optimizer_from_config({"kind": "SGD", "lr": -1})


# -- server shards -----------------------------------------------------------------------------
def _config(mode: str = "sync", workers: int = 2, name: str = "t", opt: ps.SparseOptimizer
            | None = None, partition: str = "hash") -> TableConfig:
    return TableConfig(name=name, num_embeddings=10, dim=2,
                       optimizer=(opt or ps.SGD(lr=1.0)).config(), partition=partition, mode=mode,
                       seed=3, init_scale=0.5, workers=workers)


def test_a_sync_round_is_applied_once_every_worker_pushed_it() -> None:
    shard = Shard(_config(), server=0, servers=1)
    before = shard.pull(torch.tensor([2]))
    first = shard.push(1, seq=0, ids=torch.tensor([2]), grads=torch.ones(1, 2))
    assert not first.done() and torch.equal(shard.pull(torch.tensor([2])), before)
    second = shard.push(0, seq=0, ids=torch.tensor([2, 3]), grads=torch.full((2, 2), 3.0))
    assert first.done() and second.done()
    # the mean over workers of their row gradients: (1 + 3) / 2
    assert torch.allclose(shard.pull(torch.tensor([2])), before - 2.0)
    with pytest.raises(RuntimeError, match="pushed round 1 twice"):
        shard.push(0, seq=1, ids=torch.tensor([2]), grads=torch.ones(1, 2))
        shard.push(0, seq=1, ids=torch.tensor([2]), grads=torch.ones(1, 2))


def test_async_applies_on_arrival_and_ids_are_checked_on_the_server() -> None:
    shard = Shard(_config("async"), server=1, servers=2)
    before = shard.pull(torch.tensor([1]))
    assert shard.push(0, seq=0, ids=torch.tensor([1]), grads=torch.ones(1, 2)).done()
    assert torch.allclose(shard.pull(torch.tensor([1])), before - 0.5)
    with pytest.raises(ValueError, match="another server owns"):
        shard.pull(torch.tensor([2]))
    with pytest.raises(IndexError, match="id 10 is out of range for table 't' with 10 rows"):
        shard.pull(torch.tensor([10]))


def test_restore_takes_each_servers_rows_from_files_of_any_server_count() -> None:
    config = _config(opt=ps.Adagrad(lr=0.1))
    old = [Shard(config, s, 2) for s in range(2)]
    for shard in old:
        shard.weight += 1.0
        shard.state["sum"] += 2.0
    files = [shard.tensors() for shard in old]
    merged = Shard(config, 0, 1)
    merged.restore(files, "ckpt")
    assert torch.equal(merged.weight, initial_weight(10, 2, 3, 0.5) + 1.0)
    assert torch.equal(merged.state["sum"], torch.full((10, 2), 2.0))
    with pytest.raises(ValueError, match="lacks rows"):
        Shard(config, 0, 1).restore(files[:1], "ckpt")
    with pytest.raises(ValueError, match="no optimizer state 'exp_avg'"):
        Shard(_config(opt=ps.Adam()), 0, 1).restore(files, "ckpt")


def test_a_table_name_reused_with_other_arguments_is_an_error() -> None:
    state = ServerState(0, 1, 2)
    state.create(_config())
    state.create(_config())  # the second worker asking for the same table
    with pytest.raises(ValueError, match="same arguments, same order"):
        state.create(_config(mode="async"))
    with pytest.raises(KeyError, match="no table 'other'"):
        state.shard("other")
    assert not state.wait_workers(timeout=0.01)
    state.worker_done(0)
    state.worker_done(1)
    assert state.wait_workers(timeout=0.01)


# -- tables in one process ---------------------------------------------------------------------
def test_one_process_is_the_only_worker_and_holds_the_server() -> None:
    assert ps.is_worker() and not ps.is_server() and ps.is_first_worker()
    assert (ps.worker_index(), ps.worker_num(), ps.server_num()) == (0, 1, 1)
    with pytest.raises(RuntimeError, match="on a worker"):
        ps.server_index()
    with pytest.raises(RuntimeError, match="init_server"):
        ps.init_server()


def test_forward_pulls_rows_and_backward_applies_the_sparse_optimizer() -> None:
    table = ps.ShardedEmbedding(30, 3, ps.SGD(lr=0.5), name="unit_sgd", seed=1, init_scale=0.1)
    start = initial_weight(30, 3, 1, 0.1)
    ids = torch.tensor([[1, 2], [2, 29]])
    out = table(ids)
    assert torch.equal(out, start[ids])
    out.sum().backward()
    expected = start.clone()
    expected[torch.tensor([1, 29])] -= 0.5
    expected[2] -= 1.0  # twice in the batch
    assert torch.allclose(table.pull(torch.arange(30)), expected)
    with torch.no_grad():
        table(ids)  # no gradient: nothing pushed
    assert torch.allclose(table.pull(torch.arange(30)), expected)
    assert ps.server_stats()["unit_sgd"][1] == 3


def test_a_copy_of_a_table_reads_the_same_server_rows() -> None:
    table = ps.ShardedEmbedding(6, 2, ps.SGD(lr=1.0), name="unit_copy")
    table(torch.tensor([1])).sum().backward()  # a push in flight
    twin = copy.deepcopy(table)
    assert torch.equal(twin.pull(torch.arange(6)), table.pull(torch.arange(6)))


def test_out_of_range_ids_raise_at_the_call_site_naming_the_id_and_the_size() -> None:
    table = ps.ShardedEmbedding(5, 2, name="unit_range")
    with pytest.raises(IndexError, match=r"id 5 is out of range for table 'unit_range' with 5"):
        table(torch.tensor([0, 5]))
    with pytest.raises(IndexError, match="id -1"):
        table(torch.tensor([-1]))
    with pytest.raises(TypeError, match="integer ids"):
        table(torch.tensor([0.0]))
    with pytest.raises(ValueError, match="mode='fast'"):
        ps.ShardedEmbedding(5, 2, mode="fast", name="unit_bad")


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_the_bag_equals_embedding_bag_over_the_initial_rows(mode: str) -> None:
    table = ps.ShardedEmbeddingBag(40, 3, mode=mode, name=f"unit_bag_{mode}", seed=2)
    weight = initial_weight(40, 3, 2, table._config.init_scale)
    ids, offsets = torch.tensor([3, 7, 7, 39, 0]), torch.tensor([0, 2])
    assert torch.allclose(table(ids, offsets), F.embedding_bag(ids, weight, offsets, mode=mode))
    assert torch.allclose(table(ids.view(1, 5)), F.embedding_bag(ids.view(1, 5), weight,
                                                                 mode=mode))
    with pytest.raises(ValueError, match="'sum' or 'mean'"):
        ps.ShardedEmbeddingBag(4, 2, mode="max", name="unit_bag_max")


def test_geo_trains_locally_and_pushes_deltas_every_k_steps() -> None:
    table = ps.ShardedEmbedding(8, 2, ps.SGD(lr=1.0), mode="geo", k_steps=2, name="unit_geo")
    start = table.pull(torch.arange(8))
    table(torch.tensor([3])).sum().backward()
    assert torch.equal(table.pull(torch.arange(8)), start)  # trained locally only
    local = table(torch.tensor([3]))
    assert torch.allclose(local, start[3] - 1.0)  # the worker sees its own update
    local.sum().backward()
    assert torch.allclose(table.pull(torch.tensor([3])), start[3] - 2.0)  # k = 2: pushed


def test_async_waits_only_beyond_the_staleness_bound() -> None:
    table = ps.ShardedEmbedding(8, 2, ps.SGD(lr=1.0), mode="async", max_staleness=0,
                                name="unit_async")
    start = table.pull(torch.tensor([1]))
    for _ in range(3):
        table(torch.tensor([1])).sum().backward()
    table.flush()
    assert torch.allclose(table.pull(torch.tensor([1])), start - 3.0)


def test_checkpoint_with_saves_and_restores_the_servers_rows_in_the_manifest() -> None:
    project = Path(tempfile.mkdtemp())
    acc = Accelerator(cpu=True)
    table = ps.ShardedEmbedding(12, 2, ps.Adam(lr=0.1), name="unit_ckpt")
    handles = ps.checkpoint_with(acc)
    table(torch.tensor([1, 5])).sum().backward()
    saved = table.pull(torch.arange(12))
    acc.save_state(str(project / "ckpt"))
    files = json.loads((project / "ckpt" / "manifest.json").read_text())["files"]
    assert "ps/unit_ckpt/shard-00000-of-00001.safetensors" in files
    table(torch.tensor([1])).sum().backward()
    assert not torch.equal(table.pull(torch.arange(12)), saved)
    acc.load_state(str(project / "ckpt"))
    assert torch.equal(table.pull(torch.arange(12)), saved)
    for handle in handles:
        handle.remove()


@pytest.mark.cuda
def test_ids_on_a_gpu_give_rows_on_that_gpu_and_gradients_reach_the_server() -> None:
    table = ps.ShardedEmbeddingBag(16, 4, mode="sum", sparse_optimizer=ps.SGD(lr=1.0),
                                   name="unit_cuda")
    start = table.pull(torch.arange(16))
    out = table(torch.tensor([[2, 3]], device="cuda"))
    assert out.device.type == "cuda"
    out.sum().backward()
    assert torch.allclose(table.pull(torch.tensor([2, 3])), start[2:4] - 1.0)
