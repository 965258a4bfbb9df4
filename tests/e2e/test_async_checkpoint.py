"""Kill drill for ``save_state(blocking=False)`` under ``accel launch --max_restarts``.

Rank 1 is SIGKILLed while a non-blocking save is in flight (its files written, the checkpoint
not sealed): the killed save leaves only a temporary directory, the restarted job's
``load_state()`` picks the previous complete checkpoint, and training ends with parameters
bit-identical to an uninterrupted run that saved blocking.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.e2e.test_failures import SCRIPTS, Job, _result, drill

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the drill uses Linux signals")


@pytest.mark.slow
def test_kill_during_a_background_write_resumes_from_the_previous_checkpoint(
        tmp_path: Path) -> None:
    script = str(SCRIPTS / "async_restart.py")
    plain = Job(["--cpu", "-n", "2", script, str(tmp_path / "plain"), "blocking", "-1"],
                tmp_path)
    assert plain.finish()[0] == 0, plain.text("err")
    killed = Job(["--cpu", "-n", "2", "--max_restarts", "1", script, str(tmp_path / "killed"),
                  "non_blocking", "2"], tmp_path)
    code, ended = killed.finish()
    assert code == 0, killed.text("err")
    expected, resumed = _result(plain), _result(killed)
    assert (expected["attempt"], resumed["attempt"]) == (0, 1)
    # saves at steps 4, 8, 12 (killed in flight), ...: the restart found checkpoints 0 and 1
    # complete and the third only as a temporary directory, and resumed from checkpoint_1
    assert resumed["found"][-2:] == ["checkpoint_0", "checkpoint_1"], resumed["found"]
    assert [n for n in resumed["found"] if n.startswith(".tmp-checkpoint_2-")], resumed["found"]
    assert resumed["resumed"] == "checkpoint_1", resumed
    assert resumed["steps"] == expected["steps"] == 18
    assert resumed["params"] == expected["params"]  # bit for bit
    root = tmp_path / "killed" / "checkpoints"
    # total_limit=2: the newest and the one loaded (never rotated away); the leftover of the
    # killed save was cleaned up by the first rotation after the restart
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_1", "checkpoint_3"]
    drill("non-blocking save killed in flight + restart + resume", ended - killed.started)
