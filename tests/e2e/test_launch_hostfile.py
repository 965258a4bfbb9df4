"""``accel launch`` with horovodrun's ``-np``/``-H``/``--hostfile`` and Paddle's ``--gpus`` and
per-rank ``--log_dir`` files, as real subprocesses over gloo."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.spawn import clean_env, finish_launch, free_port

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TIMEOUT = 180

pytestmark = pytest.mark.slow


def launch(args: list[str], tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "accel", "launch", *args], cwd=tmp_path,
                            env=clean_env(tmp_path, **env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    return finish_launch(proc, TIMEOUT)


def results(text: str) -> dict[int, dict[str, Any]]:
    """RESULT lines, also behind torchrun's ``[default0]:`` tee prefix."""
    rows = [json.loads(match.group(1)) for match in re.finditer(r"RESULT (\{.*\})", text)]
    return {row["rank"]: row for row in rows}


def test_np_and_h_start_cooperating_processes_and_log_dir_has_a_file_per_rank(
        tmp_path: Path) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text((SCRIPTS / "allreduce.py").read_text())
    code, out, err = finish(launch(["-np", "2", "-H", "localhost:2", "--gpus", "0,1",
                                    "--log_dir", "logs", "allreduce.py"], tmp_path,
                                   TEST_PRINT_LINES="2", CUDA_VISIBLE_DEVICES=""))
    assert code == 0, out + err
    got = results(out)
    assert sorted(got) == [0, 1]
    assert all(r["world"] == 2 and r["sum"] == 3.0 and r["device"] == "cpu"
               for r in got.values())
    # The table names the sources; --gpus on CPU warns as --gpu_ids does.
    assert re.search(r"num_processes\s+2\s+flag -np", err)
    assert re.search(r"hosts\s+localhost:2\s+flag -H", err)
    assert "warning: gpu_ids 0,1 (flag --gpus) is ignored: the device is cpu" in err
    # One stdout and one stderr file per rank under Paddle's name, with that rank's lines only.
    logs = tmp_path / "logs"
    names = sorted(name for name in os.listdir(logs) if name.startswith("workerlog"))
    assert names == ["workerlog.0", "workerlog.0.err", "workerlog.1", "workerlog.1.err"]
    for rank in (0, 1):
        stdout = (logs / f"workerlog.{rank}").read_text()
        stderr = (logs / f"workerlog.{rank}.err").read_text()
        assert results(stdout)[rank]["rank"] == rank and len(results(stdout)) == 1
        assert f"LINE {rank} 1 " in stdout and f"LINE {1 - rank} " not in stdout
        assert f"ERRLINE {rank} 1 " in stderr and f"ERRLINE {1 - rank} " not in stderr
        assert not os.path.isabs(os.readlink(logs / f"workerlog.{rank}"))  # DIR can move
    assert "RESULT" in out  # the console still shows the output (--tee 3)


def test_hostfile_with_two_hosts_forms_one_job_of_two_machines(tmp_path: Path) -> None:
    # Both "machines" are this one (127.0.0.1 and 127.0.0.2 are loopback addresses), so each
    # accel launch says which host it is with --machine_rank.
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# horovodrun hostfile\n127.0.0.1 slots=1\n127.0.0.2 slots=1\n")
    script = tmp_path / "allreduce.py"
    script.write_text((SCRIPTS / "allreduce.py").read_text())
    port = str(free_port())
    procs = [launch(["--cpu", "--hostfile", str(hostfile), "-np", "2", "--machine_rank",
                     str(rank), "--main_process_port", port, "allreduce.py"], tmp_path)
             for rank in (0, 1)]
    done = [finish(proc) for proc in procs]
    for code, out, err in done:
        assert code == 0, out + err
        assert re.search(rf"num_machines\s+2\s+hostfile {re.escape(str(hostfile))}", err)
        assert re.search(r"main_process_ip\s+127\.0\.0\.1\s+hostfile", err)
    got = {**results(done[0][1]), **results(done[1][1])}
    assert sorted(got) == [0, 1]
    assert all(r["world"] == 2 and r["sum"] == 3.0 for r in got.values())
