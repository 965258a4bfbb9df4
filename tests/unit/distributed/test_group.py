"""``accel.distributed.group``: the store a restarted torchrun worker starts its group on."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import torch.distributed as dist

from accel.distributed.group import _attempt_store
from accel.env import LaunchInfo
from tests.spawn import free_port

INFO = LaunchInfo(launcher="torchrun", rank=0, local_rank=0, world_size=2, local_world_size=2,
                  node_rank=0, master_addr="127.0.0.1", master_port=0, use_agent_store=True)


def test_a_restarted_worker_keys_the_agents_store_by_attempt() -> None:
    port = free_port()
    agent = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=10))
    agent.set("rank_0", "dead attempt's address")  # left behind by the failed attempt
    store = _attempt_store(replace(INFO, master_port=port, restart_count=2), 2,
                           timedelta(seconds=10))
    assert store is not None
    assert not store.check(["rank_0"])  # the stale key is invisible to the new attempt
    store.set("rank_0", "new address")
    assert agent.get("accel/attempt_2/rank_0") == b"new address"
    assert agent.get("rank_0") == b"dead attempt's address"


def test_first_attempts_and_rank0_hosted_stores_use_plain_env_init() -> None:
    timeout = timedelta(seconds=1)
    assert _attempt_store(INFO, 2, timeout) is None  # restart_count 0
    assert _attempt_store(replace(INFO, use_agent_store=False, restart_count=1), 2,
                          timeout) is None  # rank 0 hosts a fresh store on every attempt
