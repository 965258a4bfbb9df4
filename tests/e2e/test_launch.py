"""``accel launch`` as a subprocess: real workers over gloo, failures, leftovers, concurrency."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.procscan import alive, with_marker
from tests.spawn import clean_env, finish_launch

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TIMEOUT = 120

pytestmark = pytest.mark.slow



def launch(args: list[str], tmp_path: Path, cwd: Path | None = None,
           **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "accel", "launch", *args],
                            cwd=cwd or tmp_path, env=clean_env(tmp_path, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    return finish_launch(proc, TIMEOUT)


def results(out: str) -> dict[int, dict[str, Any]]:
    rows = [json.loads(line[len("RESULT "):]) for line in out.splitlines()
            if line.startswith("RESULT ")]
    return {row["rank"]: row for row in rows}


def test_two_concurrent_launches_all_reduce_print_whole_lines_and_the_settings_table(
        tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    script = tmp_path / "job" / "allreduce.py"
    script.write_text((SCRIPTS / "allreduce.py").read_text())
    config = tmp_path / "accelerate.yaml"
    config.write_text("distributed_type: MULTI_CPU\nnum_processes: 2\nmy_key: 1\n")
    chosen = [["--config_file", str(config)], ["--cpu", "-n", "2"]]  # same job, two ways
    procs = [launch([*chosen[i], "job/allreduce.py", f"job{i}", "--flag", "-n", "1"],
                    tmp_path, ACCEL_MIXED_PRECISION="bf16", TEST_PRINT_LINES="3000")
             for i in range(2)]
    done = [finish(proc) for proc in procs]
    ports = set()
    for i, (code, out, err) in enumerate(done):
        assert code == 0, err
        ranks = results(out)
        assert sorted(ranks) == [0, 1], out
        for row in ranks.values():
            assert (row["world"], row["sum"], row["ranks"]) == (2, 3.0, [0, 1])
            assert row["argv"][1:] == [f"job{i}", "--flag", "-n", "1"]
            assert row["argv"][0].endswith("allreduce.py") and row["name"] == "__main__"
            assert row["file"] == str(script) and row["path0"] == str(script.parent)
            assert (row["device"], row["launched"], row["omp"], row["mp"]) == ("cpu", True, "1",
                                                                             "bf16")
        for stream, tag, fill in ((out, "LINE", "x"), (err, "ERRLINE", "y")):
            found = [line for line in stream.splitlines() if tag in line]
            whole = re.compile(rf"{tag} [01] \d+ {fill}{{60}}")
            assert len(found) == 2 * 3000 and all(whole.fullmatch(x) for x in found), \
                [x for x in found if not whole.fullmatch(x)][:5]
        ports.add(ranks[0]["port"])
        table = {line.split()[0]: line for line in err.splitlines() if line.startswith("  ")}
        source = ["config " + str(config), "flag --num_processes"][i]
        assert source in table["num_processes"] and " 2 " in table["num_processes"]
        assert ["config " + str(config), "flag --cpu"][i] in table["device"]
        assert "bf16" in table["mixed_precision"] and "env ACCEL_MIXED_PRECISION" in \
            table["mixed_precision"]
        assert "default" in table["max_restarts"] and "free port" in table["main_process_port"]
        assert [str(config), "none (no file at"][i] in table["config"]
        assert ["flag --config_file", "-"][i] in table["config"]
        assert err.count("ignoring keys accel does not use: my_key") == (1 - i)
    assert len(ports) == 2  # separate rendezvous: each job got its own store port






@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_failing_rank_gives_one_root_cause_and_leaves_no_process(tmp_path: Path) -> None:
    pid_dir = tmp_path / f"pids-{uuid.uuid4().hex}"  # unique marker in every worker's argv
    pid_dir.mkdir()
    code, out, err = finish(launch(["--cpu", "-n", "2", "-q", str(SCRIPTS / "fail.py"),
                                    str(pid_dir)], tmp_path))
    assert code != 0
    assert err.count("ROOT CAUSE") == 1, err
    block = err.split("ROOT CAUSE", 1)[1]
    assert block.startswith(": rank 1 (local rank 1) on host ") and " pid " in block
    assert 'fail.py", line' in block and "in explode" in block
    assert "ValueError: boom from rank 1" in block
    assert "Traceback" not in out and err.count("Traceback (most recent call last)") == 1
    assert "accel launch settings" not in err  # --quiet
    pids = [int(p.read_text()) for p in pid_dir.glob("*.pid")]
    assert len(pids) == 4  # 2 DataLoader workers on each rank did start
    assert [pid for pid in pids if alive(pid)] == []
    assert with_marker(pid_dir.name) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_workers_die_when_the_launcher_is_killed(tmp_path: Path) -> None:
    proc = launch(["--cpu", "-n", "2", "-q", str(SCRIPTS / "sleeper.py")], tmp_path)
    pids = []
    try:
        assert proc.stdout is not None
        while len(pids) < 2:
            line = proc.stdout.readline()
            assert line, "accel launch ended before both workers were ready"
            if line.startswith("READY "):
                pids.append(int(line.split()[2]))
        proc.kill()  # SIGKILL: no cleanup code of the launcher runs
        proc.wait(timeout=TIMEOUT)
        deadline = time.monotonic() + 30
        while [pid for pid in pids if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in pids if alive(pid)] == []
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, 9)
        proc.communicate()


def test_multi_node_static_rendezvous_on_one_machine(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    common = ["--cpu", "-n", "2", "--num_machines", "2", "--main_process_ip", "127.0.0.1",
              "--main_process_port", port, str(SCRIPTS / "allreduce.py")]
    procs = [launch(["--machine_rank", str(rank), *common], tmp_path) for rank in (1, 0)]
    done = [finish(proc) for proc in procs]
    seen = {}
    for code, out, err in done:
        assert code == 0, err
        assert err.count(f"rendezvous port 127.0.0.1:{port} is unauthenticated") == 1
        seen.update(results(out))
    assert sorted(seen) == [0, 1] and all(row["sum"] == 3.0 for row in seen.values())


def test_accelerator_gets_the_launch_settings(tmp_path: Path) -> None:
    code, out, err = finish(launch(["--cpu", "-n", "2", "--gradient_accumulation_steps", "2",
                                    str(SCRIPTS / "accel_train.py")], tmp_path))
    assert code == 0, err
    ranks = results(out)
    assert sorted(ranks) == [0, 1], out + err
    for row in ranks.values():
        assert (row["world"], row["steps"], row["mp"], row["device"]) == (2, 2, "no", "cpu")
        assert row["same_weights"] is True


def test_accel_test_self_check(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "accel", "test"], cwd=tmp_path,
                          env=clean_env(tmp_path), capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)
    assert done.returncode == 0 and "accel test: OK" in done.stdout, done.stdout + done.stderr


# ---------------------------------------------------------------- bootstrap alone (no torch)
def test_bootstrap_runs_scripts_and_modules_like_python(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "show.py").write_text(textwrap.dedent("""\
        import sys
        print(__name__, sys.argv[1:], sys.path[0], __file__)
        if "--exit" in sys.argv:
            sys.exit(3)
        """))
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "tool.py").write_text("import sys\nprint(__name__, sys.argv)\n")
    env = clean_env(tmp_path)
    boot = [sys.executable, "-m", "accel.launch.bootstrap"]
    out = subprocess.run([*boot, "sub/show.py", "a", "-b"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["__main__", "['a',", "'-b']", str(tmp_path / "sub"),
                   str(tmp_path / "sub" / "show.py")]
    out = subprocess.run([*boot, "-m", "mypkg.tool", "x"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("__main__ [") and "tool.py', 'x']" in out
    done = subprocess.run([*boot, "sub/show.py", "--exit"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 3


def test_bootstrap_writes_the_error_file(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("def f():\n    raise KeyError('nope')\nf()\n")
    error_file = tmp_path / "error.json"
    env = clean_env(tmp_path, TORCHELASTIC_ERROR_FILE=str(error_file), RANK="3", LOCAL_RANK="1")
    start = time.time_ns()
    done = subprocess.run([sys.executable, "-m", "accel.launch.bootstrap", "bad.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "[accel] rank 3 failed: KeyError: 'nope' (full traceback in the launcher's report)"]
    data = json.loads(error_file.read_text())["message"]
    info = data["extraInfo"]
    assert data["message"] == "KeyError: 'nope'"
    assert info["py_callstack"].startswith("Traceback (most recent call last):\n  File \"")
    assert "runpy" not in info["py_callstack"] and "launch/bootstrap.py" not in \
        info["py_callstack"] and "line 2, in f" in info["py_callstack"]
    assert info["accel"]["rank"] == "3" and info["accel"]["time_ns"] >= start
    # without torchelastic the traceback goes to stderr, like plain python
    env.pop("TORCHELASTIC_ERROR_FILE")
    done = subprocess.run([sys.executable, "-m", "accel.launch.bootstrap", "bad.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 1 and done.stderr.startswith("Traceback") and "KeyError" in \
        done.stderr


def test_accel_env_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from accel.launch.info import env_report

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("num_processes: 2\nuse_cpu: true\nodd_key: 1\n")
    for name in list(os.environ):
        if name.startswith("ACCEL_") or name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ACCEL_CONFIG_FILE", str(cfg))
    text = env_report()
    for needle in ("- accel: ", "- torch: ", "CUDA GPUs visible: ", "- launcher: none",
                   f"- config file: {cfg} (env ACCEL_CONFIG_FILE)", "  num_processes: 2",
                   "  device: cpu", "ignored keys: odd_key", f"ACCEL_CONFIG_FILE={cfg}"):
        assert needle in text, (needle, text)
