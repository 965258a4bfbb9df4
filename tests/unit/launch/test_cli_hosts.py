"""horovodrun's and Paddle's ``accel launch`` spellings: ``-np``, ``-H``/``--hosts``,
``--hostfile``, ``--gpus``: parsing, Horovod's placement rules, the mapping onto machines, rank
and rendezvous, the torchrun argv and the settings table's sources; ``--log_dir``'s per-rank
files."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from accel.launch.bootstrap import link_rank_logs
from accel.launch.errors import CLIError
from accel.launch.hosts import Host, assign, host_layout, parse_hosts, read_hostfile
from accel.launch.settings import settings_table
from accel.launch.torchrun import build_torchrun_argv, worker_env
from tests.unit.launch.test_cli import argv, settings


# ---------------------------------------------------------------- parsing
def test_host_lists_parse_slots_default_one_and_ipv6() -> None:
    assert parse_hosts(" a:2, b:4 ,c,[fd00::1]:3,::1") == (
        Host(name="a", slots=2), Host(name="b", slots=4), Host(name="c", slots=1),
        Host(name="fd00::1", slots=3), Host(name="::1", slots=1))
    for bad, match in (("a:0", "not a positive whole number"), ("a:x", "'x'"),
                       (":2", "no host name"), (",", "lists no host"),
                       ("a:1,b,a:2", "lists a more than once")):
        with pytest.raises(CLIError, match=match):
            parse_hosts(bad)


def test_hostfile_formats_comments_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("# Horovod / Open MPI / MPICH lines\n\n"
                    "n1 slots=4 max_slots=8\n"
                    "n2:2   # MPICH style\n"
                    "n3\tslots = 3\n"
                    "n4 max_slots=5\n"
                    "   \n")
    assert read_hostfile(str(path)) == (Host(name="n1", slots=4), Host(name="n2", slots=2),
                                        Host(name="n3", slots=3), Host(name="n4", slots=1))
    path.write_text("n1 slots=\n")
    with pytest.raises(CLIError, match=r"line 1: 'n1 slots=' has no number after slots"):
        read_hostfile(str(path))
    path.write_text("n1 slots=two\n")
    with pytest.raises(CLIError, match=r"line 1: slots 'two' is not a positive whole number"):
        read_hostfile(str(path))
    path.write_text("# nothing\n\n")
    with pytest.raises(CLIError, match="lists no host"):
        read_hostfile(str(path))
    with pytest.raises(CLIError, match="cannot be read"):
        read_hostfile(str(tmp_path / "missing"))


# ---------------------------------------------------------------- Horovod's placement rules
def test_np_fills_hosts_in_order_and_may_not_exceed_the_slots() -> None:
    hosts = parse_hosts("a:2,b:2,c:2")
    assert [(h.name, n) for h, n in assign(hosts, 6)] == [("a", 2), ("b", 2), ("c", 2)]
    assert [(h.name, n) for h, n in assign(hosts, 4)] == [("a", 2), ("b", 2)]  # c unused
    assert [(h.name, n) for h, n in assign(hosts, 3)] == [("a", 2), ("b", 1)]
    with pytest.raises(CLIError, match=r"-np 7 is more than the 6 slot\(s\) .*pass -np 6 or "
                       "fewer"):
        assign(hosts, 7)


def test_uneven_placements_are_refused_with_the_np_that_works() -> None:
    local = "b".__eq__
    with pytest.raises(CLIError, match=r"-np 3 with -H gives the machines different process "
                       r"counts \(a:2,b:1\); .*pass -np 4 or 2"):
        host_layout(parse_hosts("a:2,b:2"), total=3, source="flag -H", is_local=local)
    with pytest.raises(CLIError, match=r"different process counts \(a:4,b:2\)"):
        host_layout(parse_hosts("a:4,b:2"), total=None, source="hostfile f", is_local=local)


def test_this_machine_is_found_from_the_addresses() -> None:
    layout = host_layout(parse_hosts("a:2,b:2"), total=None, source="flag -H", is_local="b".__eq__)
    assert (layout.total, layout.num_machines, layout.machine_rank, layout.local_processes,
            layout.main_host) == (4, 2, 1, 2, "a")
    with pytest.raises(CLIError, match=r"this machine \(c\) gets no process from -H with -np "
                       "4; start accel launch only on a, b, or raise -np"):
        host_layout(parse_hosts("a:2,b:2,c:2"), total=4, source="flag -H", is_local="c".__eq__)
    with pytest.raises(CLIError, match="none of a, b is this machine"):
        host_layout(parse_hosts("a:2,b:2"), total=None, source="flag -H", is_local=lambda host: False)
    # Two listed addresses of this machine (127.0.0.x): --machine_rank chooses, if local.
    both = host_layout(parse_hosts("a:1,b:1"), total=None, source="flag -H", is_local=lambda host: True, machine_rank=1)
    assert both.machine_rank == 1
    with pytest.raises(CLIError, match=r"--machine_rank 0 names a \(-H\), which is not this "
                       "machine"):
        host_layout(parse_hosts("a:1,b:1"), total=None, source="flag -H", is_local="b".__eq__, machine_rank=0)


# ---------------------------------------------------------------- accel launch settings
def test_dash_np_and_dash_h_map_to_machines_rank_and_rendezvous() -> None:
    s = settings(["-np", "4", "-H", "10.255.0.1:2,127.0.0.1:2", "--cpu", "t.py"],
                 local=("127.0.0.1",))
    assert (s.num_processes, s.num_machines, s.machine_rank, s.main_process_ip,
            s.main_process_port, s.nproc_per_node) == (4, 2, 1, "10.255.0.1", 29500, 2)
    assert build_torchrun_argv(s)[:12] == [
        "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "static", "--node-rank", "1",
        "--master-addr", "10.255.0.1", "--master-port", "29500"]
    assert worker_env(s)["ACCEL_NUM_PROCESSES"] == "4"
    assert {name: s.sources[name] for name in ("num_processes", "hosts", "num_machines",
                                              "machine_rank", "main_process_ip")} == {
        "num_processes": "flag -np", "hosts": "flag -H", "num_machines": "flag -H",
        "machine_rank": "flag -H", "main_process_ip": "flag -H"}
    table = settings_table(s)
    assert "hosts " in table and "10.255.0.1:2,127.0.0.1:2  flag -H" in table
    assert "num_processes                4" in table and "flag -np" in table
    # --hosts is -H; an explicit port is honoured; without -np every slot gets a process.
    s = settings(["--hosts", "10.255.0.1:2,127.0.0.1:2", "--main_process_port", "29600",
                  "--cpu", "t.py"], local=("127.0.0.1",))
    assert (s.num_processes, s.main_process_port, s.sources["num_processes"]) == (
        4, 29600, "default (the slots of flag -H)")


def test_one_host_is_a_single_machine_job_on_the_loopback() -> None:
    assert argv("-np", "2", "-H", "localhost:2", "--cpu", "t.py", local=("localhost",)) == \
        argv("-n", "2", "--cpu", "t.py")
    s = settings(["-np", "2", "-H", "localhost:2", "t.py"], local=("localhost",))
    assert (s.num_machines, s.main_process_ip, s.hosts) == (1, "127.0.0.1", "localhost:2")
    s = settings(["-H", "localhost:2", "--main_process_ip", "127.0.0.9", "t.py"],
                 local=("localhost",))
    assert (s.main_process_ip, s.sources["main_process_ip"]) == (
        "127.0.0.9", "flag --main_process_ip")
    with pytest.raises(CLIError, match=r"--main_process_ip 10.0.0.8 contradicts flag -H \(which "
                       r"implies 10.0.0.9\); drop --main_process_ip"):
        settings(["-H", "10.0.0.9:1,localhost:1", "--main_process_ip", "10.0.0.8", "t.py"],
                 local=("localhost",))


def test_hostfile_is_read_and_named_as_the_source(tmp_path: Path) -> None:
    path = tmp_path / "myhosts"
    path.write_text("10.255.0.1 slots=2\n127.0.0.1 slots=2\n10.255.0.3 slots=2\n")
    s = settings(["--hostfile", str(path), "-np", "4", "--cpu", "t.py"], local=("127.0.0.1",))
    assert (s.num_processes, s.num_machines, s.machine_rank, s.hosts) == (
        4, 2, 1, "10.255.0.1:2,127.0.0.1:2")
    assert s.sources["num_machines"] == f"hostfile {path}"
    assert f"hostfile {path}" in settings_table(s)


def test_host_lists_refuse_contradicting_flags(tmp_path: Path) -> None:
    hostfile = tmp_path / "h"
    hostfile.write_text("127.0.0.1 slots=2\n")
    base = ["-H", "127.0.0.1:2", "--cpu"]
    cases = [
        (["--hostfile", str(hostfile)], r"-H and --hostfile both say where the processes run"),
        (["--ips", "127.0.0.1"], r"-H and --ips both say"),
        (["--mpirun_hostfile", str(hostfile)],
         r"-H and --mpirun_hostfile both say .*--mpirun_hostfile F starts them with mpirun"),
        (["--num_machines", "3"], r"--num_machines 3 contradicts flag -H .*drop --num_machines"),
        (["-np", "2", "-n", "3"], r"-np 2 contradicts --num_processes 3"),
    ]
    for extra, match in cases:
        with pytest.raises(CLIError, match=match):
            settings([*base, *extra, "t.py"], local=("127.0.0.1",))
    # The same value twice is not a contradiction.
    assert settings(["-np", "2", "-n", "2", "--cpu", "t.py"]).num_processes == 2


# ---------------------------------------------------------------- --gpus (fleetrun's)
def test_gpus_is_gpu_ids() -> None:
    s = settings(["--gpus", "1,0", "t.py"], gpus=4)
    assert (s.gpu_ids, s.num_processes, s.cuda_visible_devices, s.sources["gpu_ids"]) == (
        "1,0", 2, "1,0", "flag --gpus")
    assert settings(["--gpus", "1,0", "t.py"], gpus=4).gpu_ids == \
        settings(["--gpu_ids", "1,0", "t.py"], gpus=4).gpu_ids
    # On CPU it is ignored with the same warning as --gpu_ids, naming the flag used.
    s = settings(["--gpus", "0,1", "-n", "2", "t.py"], gpus=0)
    assert s.gpu_ids is None
    assert s.warnings == ("gpu_ids 0,1 (flag --gpus) is ignored: the device is cpu",)
    with pytest.raises(CLIError, match=r"--gpus 0 contradicts --gpu_ids 1"):
        settings(["--gpus", "0", "--gpu_ids", "1", "t.py"], gpus=2)


# ---------------------------------------------------------------- --log_dir per rank
def test_log_dir_tees_both_streams_and_tells_the_workers_where_to_link(tmp_path: Path) -> None:
    got = argv("--cpu", "-n", "2", "--log_dir", "logs", "t.py")
    assert got[got.index("--tee"):got.index("--tee") + 4] == ["--tee", "3", "--log-dir", "logs"]
    explicit = argv("--cpu", "-n", "2", "--tee", "1", "--log_dir", "logs", "t.py")
    assert explicit[explicit.index("--tee") + 1] == "1"
    assert "--tee" not in argv("--cpu", "-n", "2", "t.py")
    s = settings(["--cpu", "-n", "2", "--log_dir", "logs", "t.py"])
    assert worker_env(s)["ACCEL_RANK_LOG_DIR"] == os.path.abspath("logs")
    assert "ACCEL_RANK_LOG_DIR" not in worker_env(settings(["--cpu", "t.py"]))
    assert re.search(r"log_dir\s+logs\s+flag --log_dir", settings_table(s))


def test_workers_link_their_torchrun_logs_under_paddles_names(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    rank_dir = logs / "RID_x" / "attempt_0" / "1"
    rank_dir.mkdir(parents=True)
    (rank_dir / "stdout.log").write_text("out of rank 3\n")
    env = {"ACCEL_RANK_LOG_DIR": str(logs), "RANK": "3",
           "TORCHELASTIC_ERROR_FILE": str(rank_dir / "error.json")}
    assert link_rank_logs(env) == [str(logs / "workerlog.3")]  # stderr not teed: no link
    assert (logs / "workerlog.3").read_text() == "out of rank 3\n"
    assert os.readlink(logs / "workerlog.3") == os.path.join("RID_x", "attempt_0", "1",
                                                             "stdout.log")
    # A restart's attempt replaces the links, now with stderr too.
    again = logs / "RID_x" / "attempt_1" / "1"
    again.mkdir(parents=True)
    (again / "stdout.log").write_text("second attempt\n")
    (again / "stderr.log").write_text("errors\n")
    env["TORCHELASTIC_ERROR_FILE"] = str(again / "error.json")
    assert link_rank_logs(env) == [str(logs / "workerlog.3"), str(logs / "workerlog.3.err")]
    assert (logs / "workerlog.3").read_text() == "second attempt\n"
    assert (logs / "workerlog.3.err").read_text() == "errors\n"
    assert sorted(os.listdir(logs)) == ["RID_x", "workerlog.3", "workerlog.3.err"]
    # Outside accel launch --log_dir nothing is linked.
    assert link_rank_logs({k: v for k, v in env.items() if k != "ACCEL_RANK_LOG_DIR"}) == []
