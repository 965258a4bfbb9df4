"""Two "machines" on one host: network namespaces joined by a veth pair (root and ``ip`` needed).

Each namespace runs ``accel launch --num_machines 2 --machine_rank R`` with one process; the
machines reach each other only over the private 10.x addresses the test creates. The test
skips, saying why, when namespaces cannot be created; namespaces are always removed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_failures import Job, alive, drill

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "fail_node.py")
PORT = "29500"  # each namespace has its own network stack: no clash with the host

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux namespaces")]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _remove(namespace: str) -> None:
    listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True,
                            check=False)
    for pid in listed.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            continue
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)


@pytest.fixture
def machines() -> Iterator[list[tuple[str, str, str]]]:
    """[(namespace, address, interface) of machine 0, the same for machine 1]."""
    if shutil.which("ip") is None:
        pytest.skip("the `ip` tool (iproute2) is not installed")
    if os.geteuid() != 0:
        pytest.skip("creating network namespaces needs root")
    tag = f"{os.getpid() % 100000}"
    spaces, links = (f"accel{tag}m0", f"accel{tag}m1"), (f"av{tag}a", f"av{tag}b")
    addresses = ("10.231.7.1", "10.231.7.2")
    try:
        for space in spaces:
            _ip("netns", "add", space)
        _ip("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        for space, link, address in zip(spaces, links, addresses):
            _ip("link", "set", link, "netns", space)
            _ip("-n", space, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", space, "link", "set", link, "up")
            _ip("-n", space, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as exc:
        for space in spaces:
            _remove(space)
        pytest.skip(f"cannot create network namespaces here: {' '.join(exc.cmd)}: "
                    f"{exc.stderr.strip()}")
    try:
        yield list(zip(spaces, addresses, links))
    finally:
        for space in spaces:
            _remove(space)
        subprocess.run(["ip", "link", "del", links[0]], capture_output=True, check=False)


def _start(tmp_path: Path, machine: tuple[str, str, str], rank: int, main_ip: str,
           mode: str) -> Job:
    return Job(["--cpu", "-n", "2", "--num_machines", "2", "--machine_rank", str(rank),
                "--main_process_ip", main_ip, "--main_process_port", PORT, SCRIPT, mode],
               tmp_path, prefix=("ip", "netns", "exec", machine[0]))


def _results(job: Job) -> list[dict[str, object]]:
    return [json.loads(line[len("RESULT "):]) for line in job.text("out").splitlines()
            if line.startswith("RESULT ")]


def test_two_machines_train_over_a_veth_pair(tmp_path: Path,
                                             machines: list[tuple[str, str, str]]) -> None:
    main_ip = machines[0][1]
    jobs = [_start(tmp_path, machines[rank], rank, main_ip, "train") for rank in (1, 0)]
    done = [job.finish() for job in jobs]
    for (code, _), job, rank in zip(done, jobs, (1, 0)):
        err = job.text("err")
        assert code == 0, err
        rows = _results(job)
        assert [row["rank"] for row in rows] == [rank], job.text("out") + err
        assert rows[0]["world"] == 2 and rows[0]["same_weights"] is True
        assert rows[0]["gloo_if"] == machines[rank][2], rows  # the veth, chosen by preflight
        assert f"machine {rank} of 2: " in err, err
    assert f"hosting the rendezvous on {main_ip}:{PORT}" in jobs[1].text("err")
    assert f"machine rank 0 at {main_ip}:{PORT} reached from {machines[1][1]}" in \
        jobs[0].text("err")
    drill("two-machine namespace run (start to both exits)",
          max(ended for _, ended in done) - min(job.started for job in jobs))


def test_killing_machine_1s_worker_ends_machine_0s_job(tmp_path: Path,
                                                      machines: list[tuple[str, str, str]]
                                                      ) -> None:
    main_ip = machines[0][1]
    node0 = _start(tmp_path, machines[0], 0, main_ip, "wait")
    node1 = _start(tmp_path, machines[1], 1, main_ip, "wait")
    node1.wait_for("READY")
    node0.wait_for("READY")
    victim = int(next(line.split()[2] for line in node1.text("out").splitlines()
                      if line.startswith("READY")))
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    code0, ended0 = node0.finish()
    code1, _ = node1.finish()
    err0, err1 = node0.text("err"), node1.text("err")
    assert code0 != 0 and code1 != 0, err0 + err1
    assert err0.count("ROOT CAUSE") == 1, err0
    root0 = err0.split("ROOT CAUSE", 1)[1]
    assert root0.startswith(": rank 0 (local rank 0)"), err0
    assert machines[1][1] in root0, err0  # the error names the peer machine's address
    assert "the real failure is probably on another\nmachine" in root0, err0
    assert err1.count("ROOT CAUSE") == 1 and "SIGKILL" in err1.split("ROOT CAUSE", 1)[1], err1
    assert not alive(victim)
    drill("machine 1's worker SIGKILLed -> machine 0's launcher exit", ended0 - killed)
