"""``accel.spawn`` scenarios run by tests/e2e/test_spawn.py; prints ``RESULT <json>`` lines.

``python spawn_scenarios.py main``: join=True (start_method spawn), join=False (fork) with
``join(timeout)``, ``processes`` and ``results``, a raising worker, nprocs=-1 on CPU with
``gpus``, and refused arguments. ``python spawn_scenarios.py daemon MARKER_DIR 0|1``: a parent
that returns from ``spawn(join=False, daemon=...)`` and exits while its workers sleep.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from typing import Any

import accel


def emit(name: str, value: Any) -> None:
    print("RESULT " + json.dumps({"name": name, "value": value}), flush=True)


def train(scale: float) -> dict[str, Any]:
    import torch

    from accel import Accelerator

    accelerator = Accelerator()
    total = accelerator.reduce(torch.tensor([float(accelerator.process_index + 1)])).item()
    out = {"rank": accelerator.process_index, "world": accelerator.num_processes,
           "total": total * scale, "device": accelerator.device.type}
    accelerator.end_training()
    return out


def slow(marker: str, seconds: float) -> int:
    time.sleep(seconds)
    with open(os.path.join(marker, f"done{os.environ['RANK']}"), "w") as fh:
        fh.write("done")
    return int(os.environ["RANK"])


def fails() -> None:
    if os.environ["RANK"] == "1":
        raise KeyError("worker 1 says no")
    time.sleep(60)  # stopped when rank 1 fails


def main() -> None:
    context = accel.spawn(train, (10.0,), nprocs=2)  # Paddle's default start method: spawn
    emit("join_true", {"joined": context.join(), "results": context.results,
                       "pids": [p.pid for p in context.processes]})

    marker = sys.argv[2]
    context = accel.spawn(slow, (marker, 2.0), nprocs=2, join=False, start_method="fork")
    early = context.join(timeout=0.05)
    started = time.monotonic()
    while len(context.processes) < 2 and time.monotonic() - started < 60:
        time.sleep(0.05)
    alive = [p.is_alive() for p in context.processes]
    joined = context.join()
    emit("join_false", {"early": early, "alive_while_running": alive, "joined": joined,
                        "alive_after": [p.is_alive() for p in context.processes],
                        "ranks": [p.rank for p in context.processes],
                        "results": context.results})

    try:
        accel.spawn(fails, nprocs=2, start_method="fork")
        emit("raised", None)
    except KeyError as exc:
        emit("raised", {"type": type(exc).__name__, "notes": getattr(exc, "__notes__", []),
                        "cause": str(exc.__cause__)})

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        context = accel.spawn(train, (1.0,), start_method="fork", gpus="0,1")
    emit("cpu_default", {"results": context.results,
                         "warnings": [str(w.message) for w in caught]})

    refusals = []
    for call in (lambda: accel.spawn(lambda: None, nprocs=2),
                 lambda: accel.spawn(train, nprocs=2, xpus="0"),
                 lambda: accel.spawn(train, nprocs=0)):
        try:
            call()
            refusals.append("accepted")
        except (TypeError, ValueError) as exc:
            refusals.append(f"{type(exc).__name__}: {exc}")
    emit("refused", refusals)


def daemon(marker: str, flag: str) -> None:
    context = accel.spawn(slow, (marker, 4.0), nprocs=2, join=False, daemon=flag == "1",
                          start_method="fork")
    started = time.monotonic()
    while len(context.processes) < 2 and time.monotonic() - started < 60:
        time.sleep(0.05)
    emit("pids", [p.pid for p in context.processes])


if __name__ == "__main__":
    if sys.argv[1] == "main":
        main()
    else:
        daemon(sys.argv[2], sys.argv[3])
