"""Logging, print and progress bars in two real processes (one spawn checks everything)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from tests.spawn import run_workers

ROUNDS = 3


def _capture(name: str, level: str | None) -> tuple[Any, io.StringIO]:
    from accel.logging import get_logger

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    base = logging.getLogger(name)
    base.addHandler(handler)
    base.propagate = False
    return get_logger(name, log_level=level), stream


def _worker(rank: int, shared: str) -> dict[str, Any]:
    from accel.logging import main_print
    from accel.run.progress import tqdm

    # Created like a module-level logger in a user script: no Accelerator, no process group.
    logger, out = _capture("dist.explicit", "INFO")
    env_logger, env_out = _capture("dist.env", None)  # level from ACCEL_LOG_LEVEL=WARNING
    logger.info("main only %d", 1)
    logger.info("everyone", main_process_only=False)
    logger.debug("below level", main_process_only=False)
    env_logger.info("below env level", main_process_only=False)
    env_logger.warning("env warning", main_process_only=False)
    env_logger.error("env main only")

    ordered = logging.getLogger("dist.ordered")
    handler = logging.FileHandler(shared)  # both ranks append to one file
    handler.setFormatter(logging.Formatter("%(message)s"))
    ordered.addHandler(handler)
    ordered.propagate = False
    from accel.logging import get_logger

    ordered_logger = get_logger("dist.ordered", log_level="INFO")
    for round_ in range(ROUNDS):
        if rank == 0:
            time.sleep(0.3)  # rank 0 arrives late: without turn-taking rank 1 would write first
        ordered_logger.info("round %d", round_, in_order=True)
    handler.close()
    from accel.env import detect_launch
    from accel.env.log import _turn_directory

    turn_dir = str(_turn_directory(detect_launch()))

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main_print(rank == 0, "accuracy", 0.5)
    bar_out = io.StringIO()
    bar = tqdm(range(4), file=bar_out, disable=False, desc="steps")
    disabled = bar.disable  # read before iterating: tqdm sets disable=True when it closes
    items = list(bar)
    return {"log": out.getvalue(), "env_log": env_out.getvalue(), "print": printed.getvalue(),
            "bar_disabled": disabled, "bar": bar_out.getvalue(), "items": items,
            "turn_dir": turn_dir}


def test_logging_print_and_progress_across_two_processes(tmp_path: Path) -> None:
    shared = tmp_path / "ordered.log"
    rank0, rank1 = run_workers(_worker, 2, args=(str(shared),),
                               extra_env={"ACCEL_LOG_LEVEL": "WARNING"})
    assert rank0["turn_dir"] == rank1["turn_dir"]  # both ranks derived the same directory
    shutil.rmtree(rank0["turn_dir"])
    assert rank0["log"] == "INFO main only 1\nINFO [rank 0] everyone\n"
    assert rank1["log"] == "INFO [rank 1] everyone\n"
    assert rank0["env_log"] == "WARNING [rank 0] env warning\nERROR env main only\n"
    assert rank1["env_log"] == "WARNING [rank 1] env warning\n"
    assert shared.read_text().splitlines() == [
        f"[rank {rank}] round {round_}" for round_ in range(ROUNDS) for rank in (0, 1)]
    assert (rank0["print"], rank1["print"]) == ("accuracy 0.5\n", "")
    assert (rank0["bar_disabled"], rank1["bar_disabled"]) == (False, True)
    assert "steps: 100%" in rank0["bar"] and rank1["bar"] == ""
    assert rank0["items"] == rank1["items"] == [0, 1, 2, 3]


def _tracker_worker(rank: int, project: str) -> dict[str, Any]:
    """The diffusers pattern: trackers started on the main process only, log on every rank."""
    import warnings

    from accel import Accelerator

    accelerator = Accelerator(cpu=True, log_with="jsonl", project_dir=project)
    if accelerator.is_main_process:
        accelerator.init_trackers("run", config={"lr": 0.1})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            accelerator.log({"loss": float(step)}, step=step)
        accelerator.get_tracker("jsonl", unwrap=True)  # a stand-in where no tracker runs
    trackers = [t.name for t in accelerator.trackers]
    accelerator.end_training()
    return {"warnings": [str(w.message) for w in caught], "trackers": trackers}


def test_trackers_started_on_the_main_process_only(tmp_path: Path) -> None:
    rank0, rank1 = run_workers(_tracker_worker, 2, args=(str(tmp_path),))
    assert rank0 == {"warnings": [], "trackers": ["jsonl"]}
    assert rank1 == {"warnings": [], "trackers": []}  # a no-op there, as in Accelerate
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["loss"] for line in lines] == [0.0, 1.0, 2.0]
