"""``accel.ps`` end to end: ``accel launch --server_num/--worker_num`` (and fleetrun's
``--servers/--workers`` lists on two "machines", 127.0.0.1 and 127.0.0.2) with real server and
worker processes over torch.distributed.rpc, on CPU.

One launch checks many things (each start of 3-4 processes costs seconds): see
``scripts/ps_job.py`` for what each phase does.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.spawn import clean_env, finish_launch, free_port, torchrun_env

SCRIPTS = Path(__file__).resolve().parent / "scripts"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT = 240
#: async and geo must end within this of sync's held-out loss (measured: about 0.01 apart,
#: from about 0.9 untrained to about 0.44)
LOSS_MARGIN = 0.05

pytestmark = pytest.mark.slow


def launch(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "accel", "launch", "--cpu", *args], cwd=cwd,
                            env=clean_env(cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    return finish_launch(proc, TIMEOUT)


def results(text: str) -> dict[int, dict[str, Any]]:
    rows = [json.loads(m.group(1)) for m in re.finditer(r"RESULT (\{.*\})", text)]
    return {row["worker"]: row for row in rows}


def test_two_servers_on_two_machines_then_one_server_two_workers(tmp_path: Path) -> None:
    job, ckpt = str(SCRIPTS / "ps_job.py"), str(tmp_path / "ckpt")
    port = str(free_port())
    # 2 servers + 2 workers, one of each per machine (fleetrun's lists; both are this host)
    procs = [launch(["--servers", "127.0.0.1:6170,127.0.0.2:6170", "--workers",
                     "127.0.0.1,127.0.0.2", "--machine_rank", str(rank), "--main_process_port",
                     port, job, "save", ckpt], tmp_path) for rank in (0, 1)]
    done = [finish(p) for p in procs]
    for code, out, err in done:
        assert code == 0, out + err
        assert "servers:workers per machine 1:1,1:1" in err
    # worker 1 does not call ps.stop_worker(): it is stopped at exit, and the servers finish
    assert "ended without accel.ps.stop_worker()" in done[1][2]
    saved = {**results(done[0][1]), **results(done[1][1])}
    assert sorted(saved) == [0, 1]
    for row in saved.values():
        # the workers alone form the process group; sync equals one process on the full batch
        assert row["processes"] == 2 and row["servers"] == 2
        assert row["diff"] <= 1e-6, row
    # 1 server + 2 workers: loads the 2-server checkpoint (re-partition 2 -> 1), then more
    code, out, err = finish(launch(["--server_num", "1", "--worker_num", "2", job, "load", ckpt],
                                   tmp_path))
    assert code == 0, out + err
    loaded = results(out)
    assert sorted(loaded) == [0, 1]
    for row in loaded.values():
        assert row["processes"] == 2 and row["servers"] == 1
        assert row["repartitioned"], "rows after loading 2 servers' shards into 1 differ"
        assert row["diff"] <= 1e-6, row
        assert row["changed"] and row["restored"], row
        assert row["shard_files"] and all(f.endswith("-of-00001.safetensors")
                                          for f in row["shard_files"]), row
        losses = row["losses"]
        assert losses["sync"] < losses["initial"] - 0.2, losses  # it learned
        for mode in ("async", "geo"):
            assert abs(losses[mode] - losses["sync"]) <= LOSS_MARGIN, losses
        assert "embedding id 10 is out of range for table 'small' with 10 rows" in row["error"]
    assert loaded[0]["losses"] == loaded[1]["losses"]


@pytest.mark.parametrize("kind", ["drill-worker", "drill-server"])
def test_a_killed_worker_or_server_ends_the_job_with_its_root_cause(tmp_path: Path,
                                                                    kind: str) -> None:
    code, out, err = finish(launch(["--server_num", "1", "--worker_num", "2",
                                    str(SCRIPTS / "ps_job.py"), kind], tmp_path))
    assert code != 0
    assert "survived" not in out  # nobody trained on after the loss
    # the root cause is the killed process, named with its role: worker 1 is rank 2 (servers
    # come first), server 0 is rank 0
    rank, role = (2, "worker 1") if kind == "drill-worker" else (0, "parameter server 0")
    assert re.search(rf"ROOT CAUSE: rank {rank} \(local rank {rank}, {role}\).*SIGKILL",
                     err), err
    if kind == "drill-server":
        # each worker either was stopped by the agent (it polls every 0.1 s, so it often wins
        # the race), or failed first naming the server it lost, or lost the other worker in a
        # collective after that one failed; never anything else
        others = re.search(r"other rank\(s\) stopped as a consequence: (.*)", err)
        assert others is not None, err
        for rank_text in others.group(1).split("; "):
            assert "SIGTERM" in rank_text or \
                "parameter server 0 (server0) went away" in rank_text or \
                "connection closed by peer" in rank_text.lower(), err


def test_a_worker_whose_server_died_raises_an_error_that_names_the_server(
        tmp_path: Path) -> None:
    # two plain processes (server0 and worker0), no agent that could stop the worker first
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, str(SCRIPTS / "ps_job.py"), "lost-server"], cwd=tmp_path,
        env=clean_env(tmp_path, ACCEL_PS_LAYOUT="1:1", **torchrun_env(rank, 2, port)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    (server_code, _, _), (code, out, err) = [finish(p) for p in procs]
    assert server_code == -9  # SIGKILL, by its own hand
    assert code == 0, out + err
    row = results(out)[0]
    assert row["steps"] >= 5 and row["error"].startswith(
        "parameter server 0 (server0) went away: connection closed by peer"), row
    assert "see the server's failure in the launcher's report" in row["error"]


def test_ctr_example_runs_with_one_server_and_two_workers(tmp_path: Path) -> None:
    code, out, err = finish(launch(["--server_num", "1", "--worker_num", "2",
                                    str(EXAMPLES / "ctr_parameter_server.py"), "--rows", "20000",
                                    "--steps", "30", "--project_dir", str(tmp_path / "run")],
                                   tmp_path))
    assert code == 0, out + err
    assert "eval loss" in out
    assert list((tmp_path / "run" / "checkpoints").glob("checkpoint_*/ps/*/shard-*"))


def test_bench_ps_quick_prints_rows_and_samples_per_second_and_records_them(
        tmp_path: Path) -> None:
    records = tmp_path / "records.jsonl"
    done = subprocess.run([sys.executable, str(EXAMPLES.parent / "benchmarks" / "bench_ps.py"),
                           "--quick", "--no-accelerate"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=TIMEOUT * 2,
                          env=clean_env(tmp_path, ACCEL_BENCH_RESULTS=str(records)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rows/s pulled" in done.stdout and "async / sync samples/s" in done.stdout
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert [r["figure"].split(",")[0] for r in rows] == ["samples/s sync", "samples/s async"]
    assert all(r["benchmark"] == "bench_ps" and r["ratio"] > 0 for r in rows), rows
