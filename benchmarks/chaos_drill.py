"""Chaos drill: kill random ranks of a checkpointing 2-process job until it finishes anyway.

    python benchmarks/chaos_drill.py --kills 20 --seed 7

Runs ``benchmarks/_chaos_train.py`` under ``accel launch --cpu -n 2 --max_restarts K`` and,
``K`` times, SIGKILLs one rank (picked at random) at a random moment of the current attempt:
while it is inside ``save_state()`` (aimed with the status file each rank writes), while it
starts or loads the newest checkpoint, or at a random step of its training. The job restarts
and resumes from its newest complete checkpoint each time. The same job also runs once
without kills. Checked at the end, and printed:

- the job exits 0 after exactly ``K`` restarts, and its final parameters and optimizer state
  are bit-identical (``torch.equal`` on every tensor) to those of the uninterrupted run;
- no process of either job is left (workers, DataLoader workers, launcher);
- the checkpoint directory holds only complete ``checkpoint_<n>`` directories (at most
  ``total_limit``): leftovers of interrupted saves were cleaned by later saves, as documented;
- kills survived, kills that landed inside a save, restarts, lost work (steps executed in
  all attempts minus steps needed) and wall time (against the uninterrupted run).

``tests/e2e/test_chaos.py`` runs the short form (``run_drill`` with 3 kills).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKER = HERE / "_chaos_train.py"
SEED_ENV = "ACCEL_CHAOS_SEED"  # read by tests/e2e/test_chaos.py (a test's own override)
_CKPT = re.compile(r"checkpoint_\d+")
#: how a kill is aimed, and how often each is picked
MODES = {"save": 0.45, "step": 0.35, "start": 0.1, "load": 0.1}

__all__ = ["MODES", "SEED_ENV", "DrillResult", "Job", "Kill", "main", "run_drill"]


def job_env() -> dict[str, str]:
    """This checkout first on the path; nothing inherited that a launcher would read."""
    drop = ("ACCEL_", "TORCHELASTIC_", "PET_", "OMPI_", "PMI_", "SLURM_")
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
             "MASTER_PORT", "OMP_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and k not in names}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    return env


class Job:
    """``accel launch`` of the chaos worker, its output collected by threads."""

    def __init__(self, run_dir: Path, max_restarts: int, worker_args: list[str]) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "accel", "launch", "-q", "--cpu", "-n", "2",
                "--max_restarts", str(max_restarts), str(WORKER), str(run_dir), *worker_args]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, cwd=run_dir, env=job_env(), text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(s, lines), daemon=True)
                         for s, lines in ((self.proc.stdout, self.out),
                                          (self.proc.stderr, self.err))]
        self.ended: float | None = None
        self._waiter = threading.Thread(target=self._wait_exit, daemon=True)
        for thread in [*self._readers, self._waiter]:
            thread.start()

    def _wait_exit(self) -> None:
        self.proc.wait()
        self.ended = time.monotonic()

    @staticmethod
    def _read(stream: Any, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    def status(self, attempt: int, rank: int) -> dict[str, Any] | None:
        try:
            text = (self.run_dir / "status" / f"attempt_{attempt}_rank_{rank}.json").read_text()
            return dict(json.loads(text))
        except (OSError, ValueError):
            return None

    def step(self, attempt: int, rank: int) -> int:
        """The last step the rank finished in ``attempt`` (from its step log), else -1."""
        try:
            with open(self.run_dir / "steps" / f"rank_{rank}.log", "rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - 32))
                last = fh.read().decode().splitlines()[-1].split()
        except (OSError, IndexError):
            return -1
        return int(last[1]) if len(last) == 2 and int(last[0]) == attempt else -1

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise TimeoutError(f"the job in {self.run_dir} did not finish within {timeout:.0f} "
                               f"s:\n{self.text()}") from None
        for thread in [*self._readers, self._waiter]:
            thread.join(timeout=10)
        return code

    def wall(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def text(self) -> str:
        return "".join(self.out) + "".join(self.err)

    def kill_all(self) -> None:
        """Last resort (a hung job): the launcher and every process of this job."""
        for pid in [self.proc.pid, *processes_mentioning(str(self.run_dir))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def processes_mentioning(marker: str) -> list[int]:
    """Live processes (not zombies, not this one) whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if marker.encode() not in fh.read():
                    continue
            with open(f"/proc/{entry}/stat") as fh:
                if fh.read().rpartition(")")[2].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


@dataclass
class Kill:
    """One SIGKILL: how it was aimed, and where the rank was when it landed."""

    attempt: int
    rank: int
    mode: str
    phase: str = ""
    step: int = -1
    at: float = 0.0  # seconds since the job started

    def line(self) -> str:
        return (f"attempt {self.attempt}: rank {self.rank} killed at {self.at:6.2f} s, aimed at "
                f"{self.mode:5s}, landed in {self.phase:5s} (step {self.step})")


@dataclass
class DrillResult:
    seed: int
    planned: int
    kills: list[Kill] = field(default_factory=list)
    code: int = -1
    restarts: int = 0
    steps_needed: int = 0
    steps_executed: int = 0
    wall: float = 0.0
    wall_uninterrupted: float = 0.0
    identical: bool = False
    differences: list[str] = field(default_factory=list)
    leftover_processes: list[int] = field(default_factory=list)
    stray_entries: list[str] = field(default_factory=list)
    output: str = ""

    @property
    def lost_steps(self) -> int:
        return self.steps_executed - self.steps_needed

    @property
    def kills_in_save(self) -> int:
        return sum(k.phase == "save" for k in self.kills)

    @property
    def ok(self) -> bool:
        return (self.code == 0 and self.identical and len(self.kills) == self.planned
                and self.restarts == len(self.kills) and not self.leftover_processes
                and not self.stray_entries)

    def report(self, with_kills: bool = True) -> str:
        lines = [*(k.line() for k in self.kills if with_kills),
                 f"seed {self.seed}: kills survived {len(self.kills)} of {self.planned} "
                 f"({self.kills_in_save} inside save_state), restarts {self.restarts}, exit code "
                 f"{self.code}",
                 f"lost work: {self.lost_steps} steps redone ({self.steps_executed} executed, "
                 f"{self.steps_needed} needed, "
                 f"{self.lost_steps / max(1, len(self.kills)):.1f} per kill)",
                 f"wall time: {self.wall:.1f} s with kills, {self.wall_uninterrupted:.1f} s "
                 f"uninterrupted",
                 f"final parameters and optimizer state bit-identical to the uninterrupted run: "
                 f"{self.identical}" + (f" ({'; '.join(self.differences[:5])})"
                                        if self.differences else ""),
                 f"processes left behind: {self.leftover_processes or 'none'}; stray checkpoint "
                 f"entries: {self.stray_entries or 'none'}",
                 "CHAOS DRILL " + ("PASSED" if self.ok else "FAILED")]
        return "\n".join(lines)


class Controller:
    """Aims and fires the kills at one job, one per attempt."""

    def __init__(self, job: Job, rng: random.Random, steps: int, save_every: int,
                 deadline: float, modes: list[str] | None = None) -> None:
        self.job, self.rng, self.steps, self.save_every = job, rng, steps, save_every
        self.deadline, self.modes = deadline, modes

    def _poll(self, attempt: int, rank: int, until: Any) -> dict[str, Any] | None:
        """Poll the rank's status of ``attempt`` until ``until(status)``; None if the job ended
        (or the attempt was overtaken) first."""
        while self.job.running() and time.monotonic() < self.deadline:
            status = self.job.status(attempt, rank)
            if status is not None and until(status):
                return status
            if self.job.status(attempt + 1, 0) or self.job.status(attempt + 1, 1):
                return None
            time.sleep(0.003)
        return None

    def _aim(self, attempt: int, rank: int, mode: str, kills_left: int
             ) -> dict[str, Any] | None:
        rng = self.rng
        if mode == "start":
            found = self._poll(attempt, rank, lambda s: True)
            time.sleep(rng.uniform(0.0, 1.5))  # somewhere in start-up: imports, rendezvous
            return found
        if mode == "load":
            return self._poll(attempt, rank, lambda s: s["phase"] in ("load", "train", "save"))
        first = self._poll(attempt, rank, lambda s: s["phase"] in ("train", "save", "done"))
        if first is None:
            return None
        resumed = max(0, int(first["step"]))
        # spread the kills over the run: aim within the share of the remaining steps
        span = max(self.save_every, (self.steps - resumed) // kills_left)
        if mode == "save":  # one of the saves in that span (the last step always saves)
            saves = [s for s in range(resumed + 1, min(self.steps, resumed + span) + 1)
                     if s % self.save_every == 0 or s == self.steps] or [self.steps]
            target = rng.choice(saves)
            found = self._poll(attempt, rank, lambda s: s["phase"] == "save"
                               and s["step"] >= target or s["phase"] == "done")
            time.sleep(rng.uniform(0.0, 0.03))  # a save takes some 20-80 ms here
            return found
        target = resumed + rng.randint(1, max(1, min(span, self.steps - 1 - resumed)))
        found = self._poll(attempt, rank, lambda s: s["phase"] == "done"
                           or self.job.step(attempt, rank) >= target)
        time.sleep(rng.uniform(0.0, 0.002))  # inside a step, or just after one
        return found

    def fire(self, attempt: int, kills_left: int) -> Kill | None:
        rank = self.rng.randrange(2)
        mode = (self.modes.pop() if self.modes else
                self.rng.choices(list(MODES), weights=list(MODES.values()))[0])
        if self._aim(attempt, rank, mode, kills_left) is None:
            return None
        status = self.job.status(attempt, rank)
        if status is None or status["phase"] == "done":
            return None
        try:
            os.kill(int(status["pid"]), signal.SIGKILL)
        except ProcessLookupError:
            return None
        return Kill(attempt, rank, mode, status["phase"],
                    max(int(status["step"]), self.job.step(attempt, rank)),
                    time.monotonic() - self.job.started)


def _compare(expected: Path, got: Path) -> list[str]:
    import torch

    if not got.is_file():
        return [f"{got} was not written"]
    ref = torch.load(expected, weights_only=True)
    new = torch.load(got, weights_only=True)
    if sorted(ref) != sorted(new):
        return [f"different tensors: {sorted(set(ref) ^ set(new))}"]
    return [f"{name} differs" for name in sorted(ref)
            if ref[name].dtype != new[name].dtype or not torch.equal(ref[name], new[name])]


def _strays(project: Path, total_limit: int, steps: int, resumed: str) -> list[str]:
    """Entries under the project that are not complete checkpoints: at most ``total_limit``,
    and the one the last attempt resumed from (rotation never deletes it)."""
    sys.path.insert(0, str(ROOT))
    from accel.checkpoint import read_manifest, verify

    root = project / "checkpoints"
    entries = sorted(root.iterdir(), key=lambda p: (len(p.name), p.name)) if root.is_dir() \
        else []
    strays = [p.name for p in project.iterdir() if p.name != "checkpoints"]
    kept = []
    for path in entries:
        if not _CKPT.fullmatch(path.name):
            strays.append(f"checkpoints/{path.name}")
            continue
        try:
            verify(path)
            kept.append(path)
        except Exception as exc:  # noqa: BLE001 - reported as a finding of the drill
            strays.append(f"checkpoints/{path.name} ({exc})")
    if len([p for p in kept if p.name != resumed]) > total_limit:
        strays.append(f"{len(kept)} checkpoints kept, total_limit is {total_limit}")
    if not kept or read_manifest(kept[-1]).meta.get("optimizer_steps") != steps:
        strays.append(f"the newest checkpoint is not the one of step {steps}")
    return strays


def _executed(run_dir: Path) -> int:
    """Steps executed over all attempts (per attempt the ranks' maximum)."""
    per_attempt: dict[int, int] = {}
    for log in (run_dir / "steps").glob("rank_*.log"):
        counts: dict[int, int] = {}
        for line in log.read_text().splitlines():
            attempt = int(line.split()[0])
            counts[attempt] = counts.get(attempt, 0) + 1
        for attempt, n in counts.items():
            per_attempt[attempt] = max(per_attempt.get(attempt, 0), n)
    return sum(per_attempt.values())


def _wait_gone(marker: str, limit: float = 30.0) -> list[int]:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        left = processes_mentioning(marker)
        if not left:
            return []
        time.sleep(0.1)
    left = processes_mentioning(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)  # not into the rest of the session
    return left


def run_drill(work_dir: Path, kills: int, seed: int, steps: int = 60, save_every: int = 5,
              total_limit: int = 2, workers: int = 0, parallel: bool = False,
              timeout: float = 600.0, log: Any = None,
              modes: tuple[str, ...] = ()) -> DrillResult:
    """The drill; ``parallel`` runs the uninterrupted job at the same time (quicker, but the
    wall times then include each other's load). ``modes``: how to aim the first kills (in
    an order the seed picks; the others are aimed at random, see ``MODES``)."""
    rng = random.Random(seed)
    aims = list(modes)
    rng.shuffle(aims)
    args = ["--steps", str(steps), "--save_every", str(save_every), "--total_limit",
            str(total_limit), "--workers", str(workers)]
    result = DrillResult(seed=seed, planned=kills, steps_needed=steps)
    reference = Job(work_dir / "uninterrupted", 0, args)
    if not parallel and reference.wait(timeout) != 0:
        raise RuntimeError(f"the uninterrupted run failed:\n{reference.text()}")
    job = Job(work_dir / "chaos", kills, args)
    control = Controller(job, rng, steps, save_every, time.monotonic() + timeout, aims)
    for attempt in range(kills):
        kill = control.fire(attempt, kills - attempt)
        if kill is None:
            break
        result.kills.append(kill)
        if log is not None:
            log(kill.line())
    result.code = job.wait(max(1.0, control.deadline - time.monotonic()))
    result.wall = job.wall()
    if parallel and reference.wait(timeout) != 0:
        raise RuntimeError(f"the uninterrupted run failed:\n{reference.text()}")
    result.wall_uninterrupted = reference.wall()
    result.output = job.text()
    result.restarts = len(re.findall(r"restarting all workers after the failure above",
                                     result.output))
    result.differences = _compare(work_dir / "uninterrupted" / "final.pt",
                                  work_dir / "chaos" / "final.pt")
    result.identical = not result.differences
    result.leftover_processes = _wait_gone(str(work_dir))
    last = job.status(len(result.kills), 0) or {}
    result.stray_entries = _strays(work_dir / "chaos" / "project", total_limit, steps,
                                   str(last.get("resumed", "")))
    result.steps_executed = _executed(work_dir / "chaos")
    return result


def main(argv: list[str] | None = None) -> int:
    import tempfile

    sys.path.insert(0, str(HERE))
    import _common

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs (and restarts)")
    parser.add_argument("--seed", type=int, default=None, help="default: random, printed")
    parser.add_argument("--steps", type=int, default=None,
                        help="optimizer steps of the job (default: 40 per kill, at least 60)")
    parser.add_argument("--save_every", type=int, default=5)
    parser.add_argument("--total_limit", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1,
                        help="DataLoader worker processes per rank (default 1)")
    parser.add_argument("--work_dir", type=Path, default=None, help="default: a temp dir")
    parser.add_argument("--quick", action="store_true", help="2 kills, 30 steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.kills, args.steps = 2, 30
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    steps = args.steps or max(60, 40 * args.kills)
    print(f"Chaos drill: {args.kills} SIGKILLs of a random rank of a 2-process job "
          f"({steps} steps, save_state every {args.save_every}, total_limit "
          f"{args.total_limit}, {args.workers} DataLoader worker(s) per rank), seed {seed}",
          flush=True)
    print(_common.machine_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        work = args.work_dir or Path(tmp)
        result = run_drill(work, args.kills, seed, steps, args.save_every, args.total_limit,
                           args.workers, timeout=max(600.0, 30.0 * args.kills),
                           log=lambda line: print(line, flush=True))
    print(result.report(with_kills=False))
    if not result.ok:
        print(result.output[-6000:], file=sys.stderr)
    _common.record("chaos_drill", f"wall time with {len(result.kills)} kills",
                   accel=result.wall, baseline=result.wall_uninterrupted,
                   baseline_name="uninterrupted", unit="s",
                   note=f"seed {seed}; {result.kills_in_save} kills inside save_state; "
                        f"{result.restarts} restarts; {result.lost_steps} steps redone of "
                        f"{steps}; bit-identical: {result.identical}")
    print(_common.machine_line())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
