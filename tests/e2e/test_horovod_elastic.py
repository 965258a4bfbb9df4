"""``hvd.elastic`` on torchrun's restarts: a killed worker, a restart, a resume from the commit.

The drill: ``accel launch --max_restarts 1`` runs tests/e2e/scripts/hvd_elastic.py on 2 CPU
processes; rank 1 SIGKILLs itself right after the commit of step 12 (mid-epoch). The agent
restarts both workers, ``@hvd.elastic.run`` resumes them from that commit, and the job ends
with the parameters of an uninterrupted run, bit for bit (the training is deterministic on CPU:
fixed data and seeds, a seeded sampler order, a sum of 2 gradients is the same in any order,
and the commit stores exact tensors). The resume itself (which rank's commit, what is sent,
the sampler's union of recorded indices) is checked with 2 ranks as 2 "machines" with
node-local commit directories.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.spawn import clean_env, run_workers, torchrun_env

SCRIPT = Path(__file__).resolve().parent / "scripts" / "hvd_elastic.py"
KILL_STEP = 12  # after the 4th commit (every 3 steps): epoch 1, its 4th of 8 steps

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the drill kills a worker with SIGKILL")


def _launch(tmp_path: Path, name: str, kill_step: int) -> tuple[subprocess.Popen[str], Path]:
    elastic_dir = tmp_path / f"{name}-commits"
    proc = subprocess.Popen(
        [sys.executable, "-m", "accel", "launch", "-q", "--cpu", "-n", "2", "--max_restarts",
         "1", str(SCRIPT), str(kill_step)], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=clean_env(tmp_path, ACCEL_ELASTIC_DIR=str(elastic_dir)))
    return proc, elastic_dir


def _rows(out: str, tag: str) -> list[dict[str, Any]]:
    return [json.loads(line[len(tag) + 1:]) for line in out.splitlines()
            if line.startswith(tag + " ")]


@pytest.mark.slow
def test_a_killed_worker_rolls_back_to_the_last_commit_and_the_job_finishes(
        tmp_path: Path) -> None:
    plain, plain_dir = _launch(tmp_path, "plain", -1)
    killed, killed_dir = _launch(tmp_path, "killed", KILL_STEP)
    plain_out, plain_err = plain.communicate(timeout=300)
    out, err = killed.communicate(timeout=300)
    assert plain.returncode == 0, plain_err
    assert killed.returncode == 0, err
    assert "SIGKILL" in err and "restart 1 of 1" in err, err
    assert "hvd.elastic: resuming from commit 3" in err, err  # commits 0..3 at steps 3..12
    # the restarted workers start at the commit, call the reset callbacks, and finish
    enters = {(r["attempt"], r["rank"]): r for r in _rows(out, "ENTER")}
    for rank in (0, 1):
        assert enters[(0, rank)]["step"] == 0
        assert enters[(1, rank)]["step"] == KILL_STEP and enters[(1, rank)]["epoch"] == 1
        assert enters[(1, rank)]["remaining"] == 32  # half of epoch 1 was committed
    assert sorted((r["attempt"], r["rank"]) for r in _rows(out, "RESET")) == [(1, 0), (1, 1)]
    assert _rows(plain_out, "RESET") == []  # a first start is not a reset
    # bit for bit the parameters of the uninterrupted run
    (expected,), (resumed,) = _rows(plain_out, "RESULT"), _rows(out, "RESULT")
    assert (expected["step"], resumed["step"], resumed["attempt"]) == (24, 24, 1)
    assert resumed["params"] == expected["params"]
    # the sampler: in the epoch of the failure, the committed samples plus those of the
    # restarted attempt are the whole dataset, each once; later epochs are whole too
    seen = _rows(out, "SEEN")
    epoch1 = [i for r in seen if r["epoch"] == 1 and (r["attempt"] == 1 or r["step"] <= KILL_STEP)
              for i in r["indices"]]
    assert Counter(epoch1) == Counter(range(64))
    epoch2 = [i for r in seen if r["epoch"] == 2 for i in r["indices"]]
    assert Counter(epoch2) == Counter(range(64))
    # the commits are removed when the training function returns everywhere
    assert list(killed_dir.iterdir()) == [] and list(plain_dir.iterdir()) == []


# ------------------------------------------------------------- the resume, rank by rank


def _node_env(tmp: str) -> Any:
    def make(rank: int, world: int, port: int) -> dict[str, str]:
        # every rank its own "machine", with node-local commit storage
        return {**torchrun_env(rank, world, port), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                "GROUP_RANK": str(rank), "TORCHELASTIC_RUN_ID": "drill",
                "TORCHELASTIC_RESTART_COUNT": "1", "ACCEL_ELASTIC_DIR": f"{tmp}/node{rank}"}
    return make


def _objects(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    import accel.horovod as hvd

    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.Adam(model.parameters(), lr=0.1), hvd.elastic.ElasticSampler(
        list(range(20)), shuffle=False)


def _resume_worker(rank: int, tmp: str) -> dict[str, Any]:
    import accel.horovod as hvd

    hvd.init()
    # an earlier attempt: rank 1 committed once more than rank 0 (rank 0 died mid-commit)
    model, opt, sampler = _objects(seed=rank)
    old = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0)
    for number in range(2 + rank):
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        sampler.record_batch(number, 2)  # 4 samples a step (2 per rank)
        old.epoch = 10 * rank + number
        old.commit()
    committed = {k: v.tolist() for k, v in model.state_dict().items()}  # plain values: the
    # result queue cannot carry tensors out of a process that exits
    # the restarted attempt: new objects, decorated function
    model, opt, sampler = _objects(seed=100 + rank)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0)
    resets: list[int] = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state: Any) -> dict[str, Any]:
        weights = {k: v.tolist() for k, v in model.state_dict().items()}
        return {"epoch": state.epoch, "model": weights,
                "adam_step": [float(s["step"]) for s in opt.state_dict()["state"].values()],
                "processed_num": sampler.processed_num, "left": len(sampler.remaining_indices)}

    got = train(state)
    got.update(committed=committed, resets=resets)
    # the sampler's own indices (record_indices) of the ranks that wrote the same commit
    sampler.set_epoch(1)
    union_state = hvd.elastic.TorchState(sampler=sampler, epoch=1)
    sampler.record_indices(range(rank * 5, rank * 5 + 3))
    union_state.commit()
    sampler.record_indices([19])  # after the commit: not kept
    fresh = _objects(seed=0)[2]
    again = hvd.elastic.TorchState(sampler=fresh, epoch=0)
    got["union"] = hvd.elastic.run(lambda s: sorted(s.sampler.processed_indices))(again)
    got["union_epoch"], got["union_remaining"] = again.epoch, list(fresh)
    hvd.shutdown()
    return got


@pytest.mark.slow
def test_resume_takes_the_newest_commit_from_the_rank_that_holds_it(tmp_path: Path) -> None:
    r0, r1 = run_workers(_resume_worker, 2, args=(str(tmp_path),), env=_node_env(str(tmp_path)))
    for got in (r0, r1):
        # rank 1's newest commit (number 2) on every rank: model, optimizer, values, sampler
        assert got["epoch"] == 12
        assert got["model"] == r1["committed"]
        assert got["adam_step"] == [3.0, 3.0]
        assert (got["processed_num"], got["left"]) == (12, 8)
        assert got["resets"] == [2]  # a restarted attempt calls the reset callbacks
        # every rank's own recorded indices of the same commit, sent to all (not 19)
        assert got["union"] == [0, 1, 2, 5, 6, 7] and got["union_epoch"] == 1
    assert sorted(r0["union_remaining"] + r1["union_remaining"]) == [
        3, 4, *range(8, 19), 19]
    assert r0["committed"] != r1["committed"]
    # commits removed when the decorated functions returned (the node directories stay, empty)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["node0", "node1"]


# ----------------------------------------------------------------------------- the example

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "horovod_elastic.py"


@pytest.mark.slow
def test_the_elastic_example_survives_a_lost_worker(tmp_path: Path) -> None:
    runs = {}
    for name, fail in (("plain", "-1"), ("failed", "7")):
        proc = subprocess.run(
            [sys.executable, "-m", "accel", "launch", "-q", "--cpu", "-n", "2", "--max_restarts",
             "1", str(EXAMPLE), "--fail_at_step", fail], cwd=tmp_path, capture_output=True,
            text=True, timeout=300,
            env=clean_env(tmp_path, ACCEL_ELASTIC_DIR=str(tmp_path / name)))
        assert proc.returncode == 0, proc.stderr
        runs[name] = proc
    assert "resuming from commit 0" in runs["failed"].stderr  # commits every 4 steps
    assert "restart" not in runs["plain"].stderr
    results = [[line for line in run.stdout.splitlines() if line.startswith("Test set:")]
               for run in runs.values()]
    assert len(results[0]) == 1 and results[0] == results[1], results  # same model at the end
