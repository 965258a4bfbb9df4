"""``accel.horovod.elastic`` in one process: commits on disk, restore, resume, the sampler.

Multi-process behaviour (a killed worker, a resume from another machine's commit, the union of
recorded indices) is in tests/e2e/test_horovod_elastic.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import accel.horovod as hvd
from accel.env import EnvSettings, LaunchInfo, detect_launch, read_settings
from accel.horovod._session import current
from accel.horovod.elastic import sampler as sampler_module
from accel.horovod.elastic.store import commit_root


@pytest.fixture
def session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An hvd session whose commits go under ``tmp_path / "commits"`` (returned)."""
    monkeypatch.setenv("ACCEL_ELASTIC_DIR", str(tmp_path / "commits"))
    hvd.init()
    yield tmp_path / "commits"
    hvd.shutdown()


def _training(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.ones(2, 3)).pow(2).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _checkpoints(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("checkpoint_*") if p.is_dir())


def test_commit_writes_one_atomic_pickle_free_checkpoint_and_restore_reads_it_back(
        session: Path) -> None:
    model, optimizer = _training()
    sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, history=[1.5])
    _step(model, optimizer)
    sampler.record_batch(0, 2)
    state.epoch = 1
    state.history.append(2.5)
    state.commit()
    state.commit()  # the newest commit replaces the previous one (removed in the background)
    state.commit_store().settle()
    (ckpt,) = _checkpoints(session)
    assert ckpt.name == "checkpoint_1" and (ckpt / "manifest.json").is_file()
    assert {p.suffix for p in ckpt.iterdir()} == {".json", ".safetensors"}  # no pickle
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    adam = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    # change everything, then roll back
    _step(model, optimizer)
    sampler.record_batch(1, 2)
    state.epoch, state.history = 5, [0.0]
    state.restore()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], adam)
    assert float(optimizer.state_dict()["state"][0]["step"]) == 1.0
    assert (state.epoch, state.history, sampler.processed_num) == (1, [1.5, 2.5], 2)
    assert list(sampler) == list(range(2, 10))


def test_restore_before_any_commit_returns_to_the_state_at_construction(session: Path) -> None:
    model, optimizer = _training()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    state = hvd.elastic.TorchState(model, optimizer, batch=0)
    _step(model, optimizer)
    state.batch = 7
    state.restore()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in initial.items())
    assert optimizer.state_dict()["state"] == {} and state.batch == 0
    assert _checkpoints(session) == []


def test_commit_refuses_a_value_that_would_need_pickle(session: Path) -> None:
    state = hvd.elastic.ObjectState(epoch=0, thing=object())
    with pytest.raises(TypeError, match=r"\['thing'\].*never pickle"):
        state.commit()
    assert _checkpoints(session) == []  # nothing half-written is left as a commit


def test_commit_and_check_host_updates_run_no_collective(session: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("a collective was called")

    comm = current().comm
    for name in ("broadcast", "broadcast_object_list", "gather_object", "reduce", "barrier"):
        monkeypatch.setattr(comm, name, refuse)
    model, optimizer = _training()
    state = hvd.elastic.TorchState(model, optimizer, epoch=0)
    state.check_host_updates()
    state.commit()
    assert len(_checkpoints(session)) == 1


def test_run_resumes_from_the_newest_commit_and_removes_the_commits_at_the_end(
        session: Path) -> None:
    model, optimizer = _training(seed=1)
    earlier = hvd.elastic.TorchState(model, optimizer, epoch=0)
    _step(model, optimizer)
    earlier.epoch = 3
    earlier.commit()
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    # as a restarted worker would: new objects, the same job
    model, optimizer = _training(seed=2)
    state = hvd.elastic.TorchState(model, optimizer, epoch=0)
    resets: list[int] = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    seen: list[Any] = []

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState, extra: int, *, key: str) -> str:
        seen.append((state.epoch, float(optimizer.state_dict()["state"][0]["step"]), extra))
        assert all(torch.equal(model.state_dict()[k], v) for k, v in committed.items())
        state.epoch += 1
        state.commit()  # numbered after the resumed commit
        state.commit_store().settle()  # the previous commit is removed in the background
        assert [p.name for p in _checkpoints(session)] == ["checkpoint_1"]
        return key

    assert train(state, 9, key="done") == "done"
    assert seen == [(3, 1.0, 9)] and resets == [1]
    assert not session.exists() or list(session.iterdir()) == []


def test_run_without_a_commit_syncs_and_does_not_reset(session: Path) -> None:
    state = hvd.elastic.ObjectState(epoch=4)
    resets: list[int] = []
    state.register_reset_callbacks([lambda: resets.append(1)])
    assert hvd.elastic.run(lambda s: s.epoch)(state) == 4
    assert resets == []


@pytest.mark.parametrize("error", [hvd.HorovodInternalError("peer lost"),
                                   dist.DistError("connection closed by peer")])
def test_run_lets_a_failed_collective_end_the_process(session: Path, error: Exception,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def train(state: Any) -> None:
        calls.append(1)
        raise error

    with pytest.raises(type(error)):
        hvd.elastic.run(train)(hvd.elastic.ObjectState(epoch=0))
    assert calls == [1]  # not retried in-process: torchrun restarts the group
    assert "restarts the workers from the last commit" in caplog.text


def test_hosts_updated_interrupt_resets_and_runs_again(session: Path) -> None:
    state = hvd.elastic.ObjectState(epoch=0)
    resets: list[int] = []
    state.register_reset_callbacks([lambda: resets.append(1)])
    calls: list[int] = []

    def train(state: Any) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise hvd.HostsUpdatedInterrupt(skip_sync=False)
        return len(calls)

    assert hvd.elastic.run(train)(state) == 2 and resets == [1]


# ----------------------------------------------------------------------------- sampler


def _as_rank(monkeypatch: pytest.MonkeyPatch, rank: int, size: int) -> None:
    monkeypatch.setattr(sampler_module, "rank", lambda: rank)
    monkeypatch.setattr(sampler_module, "size", lambda: size)


def test_sampler_partitions_the_remaining_samples_after_a_reset(
        session: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = list(range(10))
    shards = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank, 2)
        sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=3)
        shards.append(list(sampler))
    assert sorted(shards[0] + shards[1]) == data and len(sampler) == 5
    order = shards  # interleaved: step k holds shards[0][k] and shards[1][k]
    sampler.record_batch(0, 2)  # 2 per rank, 2 ranks: the first 4 of the epoch's order
    done = {order[r][k] for r in (0, 1) for k in (0, 1)}
    state = sampler.state_dict()
    # the job restarts with 3 workers: the 6 samples left, each once, 2 per worker
    left = []
    for rank in (0, 1, 2):
        _as_rank(monkeypatch, rank, 3)
        resumed = hvd.elastic.ElasticSampler(data, shuffle=True, seed=3)
        resumed.load_state_dict(state)
        left += list(resumed)
    assert sorted(left) == sorted(set(data) - done)


def test_sampler_epochs_indices_and_padding(session: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    sampler = hvd.elastic.ElasticSampler(list(range(6)), shuffle=True, seed=0)
    first = list(sampler)
    sampler.set_epoch(1)
    assert sorted(list(sampler)) == list(range(6)) and list(sampler) != first
    sampler.set_epoch(0)
    assert list(sampler) == first  # seeded by seed + epoch
    sampler.record_indices([first[0], first[1]])
    assert sampler.get_indices(0, 2) == first[:2]
    sampler.load_state_dict(sampler.state_dict())
    assert list(sampler) == first[2:]
    sampler.set_epoch(2)  # the end of an epoch clears what was processed
    assert sampler.state_dict() == {"epoch": 2, "processed_num": 0, "processed_indices": []}
    _as_rank(monkeypatch, 1, 4)
    padded = hvd.elastic.ElasticSampler(list(range(6)), shuffle=False)
    assert (len(padded), list(padded)) == (2, [1, 5])  # 6 over 4 ranks: 8 slots, 0 and 1 again
    _as_rank(monkeypatch, 0, 4)
    padded.load_state_dict({"epoch": 0, "processed_num": 4})
    assert list(padded) == [4]


# ----------------------------------------------------------------------------- where


def test_commit_directory_is_keyed_by_the_torchrun_run_id() -> None:
    info = LaunchInfo(launcher="torchrun", rank=1, local_rank=1, world_size=2, local_world_size=2,
                      node_rank=0, master_addr="127.0.0.1", master_port=29500, run_id="abc/../x")
    root = commit_root(EnvSettings(elastic_dir="/data/el"), info)
    assert root == Path("/data/el/run-abc_.._x")  # no path separators from the run id
    alone = commit_root(EnvSettings(), LaunchInfo(
        launcher="none", rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
        master_addr="127.0.0.1", master_port=29500))
    assert alone.parent.name.startswith("accel-elastic-") and alone.name.startswith("none-")
    assert alone.name.endswith(f"-{__import__('os').getpid()}")  # private: nobody restarts it
    env = {"RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "job7",
           "TORCHELASTIC_RESTART_COUNT": "2"}
    assert (detect_launch(env).run_id, detect_launch(env).restart_count) == ("job7", 2)
    assert read_settings({"ACCEL_ELASTIC_DIR": "/x"}).elastic_dir == "/x"


def test_names_match_horovod() -> None:
    assert hvd.elastic.HorovodInternalError is hvd.HorovodInternalError
    assert issubclass(hvd.elastic.TorchState, hvd.elastic.ObjectState)
    assert issubclass(hvd.elastic.ObjectState, hvd.elastic.State)
    assert hvd.HostsUpdatedInterrupt(skip_sync=True).skip_sync is True
