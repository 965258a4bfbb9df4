"""``accel launch``'s parser answers with Accelerate's attribute names and defaults, shows each
flag once in ``--help``, and the workers' environment of an explicit ``--cpu`` launch."""

from __future__ import annotations

import pytest

from accel.launch import cli
from accel.launch.settings import resolve_settings
from accel.launch.torchrun import INTEL_OPENMP, worker_env


def test_switches_default_to_false_and_refused_ones_keep_their_value() -> None:
    parser = cli.launch_parser()
    args = parser.parse_args(["t.py"])
    assert (args.multi_gpu, args.tpu, args.use_deepspeed, args.zero_stage) == \
        (False, False, False, None)
    args = parser.parse_args(["--multi-gpu", "--use-deepspeed", "--zero_stage", "2", "t.py"])
    assert (args.multi_gpu, args.use_deepspeed, args.zero_stage) == (True, True, "2")
    assert args.refused_flags == ["--use-deepspeed", "--zero_stage"]


def test_help_shows_each_flag_once_and_says_both_spellings_work() -> None:
    help_text = cli.launch_parser().format_help()
    assert "--num_processes N" in help_text and "--main_process_port PORT" in help_text
    for twin in ("--num-machines", "--main-process-port", "--mixed-precision", "--use-fsdp",
                 "--fsdp-version"):
        assert twin not in help_text
    assert help_text.count("--num-processes") == 1  # the sentence that says so
    args = cli.launch_parser().parse_args(["--num-machines", "1", "--mixed-precision", "bf16",
                                           "t.py"])
    assert (args.num_machines, args.mixed_precision) == (1, "bf16")


@pytest.mark.parametrize("flags,expected", [
    ({"device": "cpu"}, True),  # --cpu, one process
    ({"device": "cpu", "num_processes": 2}, False),  # they would share the same cores
    ({}, False),  # the CPU was detected, not chosen
])
def test_intel_openmp_variables_for_an_explicit_cpu_launch(flags: dict[str, object],
                                                           expected: bool) -> None:
    settings = resolve_settings({"script": "t.py", **flags}, environ={}, config=None,
                                gpu_count=lambda: 0, cpu_count=4, run_id="r")
    env = worker_env(settings)
    assert (INTEL_OPENMP.items() <= env.items()) is expected
    assert env["ACCEL_DEVICE"] == "cpu"
