"""accel.logging and accel.run.progress in one process: main-only, rank prefix, level, turns."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from accel.env import LaunchInfo
from accel.env.log import (
    MultiProcessAdapter,
    _Turn,
    _turn_directory,
    get_logger,
    main_print,
    resolve_level,
)
from accel.run.progress import tqdm
from tests.spawn import LAUNCHER_NAMES, LAUNCHER_PREFIXES

SetRank = Callable[..., None]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def messages(self) -> list[str]:
        return [record.getMessage() for record in self.records]


@pytest.fixture
def as_rank(monkeypatch: pytest.MonkeyPatch) -> SetRank:
    """Describe a torchrun rank in the real environment (what detect_launch reads)."""
    for name in list(os.environ):
        if name in LAUNCHER_NAMES or name.startswith(LAUNCHER_PREFIXES):
            monkeypatch.delenv(name)

    def set_rank(rank: int, world: int = 2) -> None:
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(world))
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", "29999")

    return set_rank


def _logger(level: str | None = "DEBUG") -> tuple[MultiProcessAdapter, _Records]:
    name = f"accel.test.{uuid.uuid4().hex}"
    handler = _Records()
    base = logging.getLogger(name)
    base.addHandler(handler)
    base.propagate = False
    return get_logger(name, log_level=level), handler


def test_main_only_by_default_and_rank_prefix_on_request(as_rank: SetRank) -> None:
    logger, records = _logger()
    as_rank(1)
    logger.info("from main only")
    logger.warning("n=%d", 3)
    assert records.messages == []
    logger.info("everywhere %s", "too", main_process_only=False)
    assert records.messages == ["[rank 1] everywhere too"]
    as_rank(0)
    logger.info("n=%d", 4)
    logger.info("all", main_process_only=False)
    assert records.messages[-2:] == ["n=4", "[rank 0] all"]


def test_without_launcher_the_process_is_main(as_rank: SetRank) -> None:
    logger, records = _logger()
    logger.info("single")
    logger.info("single", main_process_only=False)
    assert records.messages == ["single", "[rank 0] single"]


def test_level_argument_env_variable_and_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    logger, records = _logger("WARNING")
    logger.info("dropped", main_process_only=False)
    logger.debug("dropped", in_order=True)
    logger.warning("kept")
    assert records.messages == ["kept"]
    monkeypatch.setenv("ACCEL_LOG_LEVEL", "error")
    env_logger, env_records = _logger(None)
    assert env_logger.getEffectiveLevel() == logging.ERROR
    env_logger.warning("dropped")
    env_logger.error("kept")
    assert env_records.messages == ["kept"]
    assert _logger("info")[0].getEffectiveLevel() == logging.INFO  # argument beats the env
    monkeypatch.setenv("ACCEL_LOG_LEVEL", "LOUD")
    with pytest.raises(ValueError, match="unknown log level 'LOUD'.*ACCEL_LOG_LEVEL"):
        get_logger("accel.test.bad")
    assert resolve_level("warn") == logging.WARNING
    assert resolve_level("15") == 15


def test_record_points_at_the_caller_and_warning_once() -> None:
    logger, records = _logger()
    logger.info("here")
    logger.warning_once("once")
    logger.warning_once("once")
    assert [r.funcName for r in records.records] == [sys._getframe().f_code.co_name] * 2
    assert all(r.pathname == __file__ for r in records.records)
    assert records.messages == ["here", "once"]


def test_given_stacklevel_counts_the_adapter_frame_as_in_accelerate() -> None:
    logger, records = _logger()

    class Wrapper(logging.LoggerAdapter):  # type: ignore[type-arg]
        def log(self, level: int, msg: object, *args: object, **kwargs: object) -> None:
            kwargs["stacklevel"] = 3  # 1: the adapter's log, 2: this method, 3: its caller
            self.logger.log(level, msg, *args, **kwargs)

    Wrapper(logger, {}).warning("wrapped")
    line = sys._getframe().f_lineno - 1
    logger.warning("direct", stacklevel=2)
    logger.warning_once("direct once", stacklevel=2)
    assert [r.lineno for r in records.records] == [line, line + 2, line + 3]
    assert {r.funcName for r in records.records} == {sys._getframe().f_code.co_name}


def test_main_print(capsys: pytest.CaptureFixture[str]) -> None:
    main_print(True, "a", 1, sep="-")
    main_print(False, "hidden")
    assert capsys.readouterr().out == "a-1\n"


def test_tqdm_disabled_off_main(as_rank: SetRank) -> None:
    assert tqdm(range(2), is_main=False).disable is True
    assert list(tqdm(range(3), is_main=False)) == [0, 1, 2]
    assert tqdm(range(2), is_main=True, disable=False).disable is False
    assert tqdm(range(2), is_main=True, disable=True).disable is True
    as_rank(1)
    assert tqdm(range(2)).disable is True
    assert tqdm(range(2), main_process_only=False, disable=False).disable is False
    as_rank(0)
    assert tqdm(range(2), disable=False).disable is False


# --- in-order turns ---------------------------------------------------------------------------

def test_turns_follow_local_rank_order(tmp_path: Path) -> None:
    first = _Turn(directory=tmp_path, local_rank=0, timeout=0.0)
    second = _Turn(directory=tmp_path, local_rank=1, timeout=0.0)
    assert second.wait() is False  # local rank 0 has not logged message 1 yet
    assert first.wait() is True
    first.done()
    assert second.wait() is True
    second.done()
    assert second.wait() is False  # message 2: rank 0 has logged only 1
    assert (tmp_path / "local-1").read_text() == f"{os.getpid()} 1"


def test_waiting_rank_logs_after_its_predecessor(tmp_path: Path) -> None:
    order: list[int] = []

    def rank(local_rank: int, delay: float) -> None:
        for _ in range(3):
            time.sleep(delay)  # perturbation: without the turn files rank 1 would go first
            turn = _Turn(directory=tmp_path, local_rank=local_rank, timeout=30.0)
            assert turn.wait()
            order.append(local_rank)
            turn.done()

    threads = [threading.Thread(target=rank, args=(1, 0.0)),
               threading.Thread(target=rank, args=(0, 0.1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert order == [0, 1, 0, 1, 0, 1]


def test_stale_turn_files_from_an_earlier_job_are_ignored(tmp_path: Path) -> None:
    dead = 2**22 + 1  # above Linux's PID_MAX_LIMIT: never a live process (a unit test starts none)
    (tmp_path / "local-0").write_text(f"{dead} 5")
    (tmp_path / "local-1").write_text(f"{dead} 5")
    old = time.time() - 3600  # written before this process started: an earlier job
    os.utime(tmp_path / "local-0", (old, old))
    turn = _Turn(directory=tmp_path, local_rank=1, timeout=0.0)
    assert turn.wait() is False  # the stale count 5 does not let message 1 through
    assert turn.previous == 0  # own stale file ignored too
    os.utime(tmp_path / "local-0", None)  # now: a predecessor that finished and exited
    assert _Turn(directory=tmp_path, local_rank=1, timeout=0.0).wait() is True


def test_in_order_timeout_warns_and_still_logs() -> None:
    info = LaunchInfo(launcher="torchrun", rank=1, local_rank=1, world_size=2, local_world_size=2,
                      node_rank=0, master_addr="127.0.0.1", master_port=40000 + os.getpid() % 20000)
    name = f"accel.test.{uuid.uuid4().hex}"
    handler = _Records()
    logging.getLogger(name).addHandler(handler)
    logging.getLogger(name).propagate = False
    logger = MultiProcessAdapter(logging.getLogger(name), in_order_timeout=0.0,
                                 launch_info=lambda: info)
    directory = _turn_directory(info)
    try:
        logger.warning("late", in_order=True)
    finally:
        shutil.rmtree(directory)
    assert handler.messages[0].startswith("[rank 1] in_order: local rank 0 had not logged")
    assert handler.messages[1] == "[rank 1] late"
    with pytest.raises(ValueError, match="in_order_timeout"):
        MultiProcessAdapter(logging.getLogger(name), in_order_timeout=-1)
