"""Accelerate's ``accelerate.commands.*`` paths over accel's CLI (issue 28). Launching real
processes is covered by Accelerate's own test_cli.py in tests/compat (the ported suite)."""

from __future__ import annotations

import argparse

import pytest

from accel.compat.refusals import NotSupportedError, is_stand_in


def test_launch_command_parser_is_accel_launch_alone_or_as_a_subcommand() -> None:
    from accel.commands.launch import launch_command_parser

    args = launch_command_parser().parse_args(["--cpu", "--num-processes", "2", "--mixed_precision",
                                               "bf16", "train.py", "--lr", "1"])
    assert (args.device, args.num_processes, args.mixed_precision) == ("cpu", 2, "bf16")
    assert (args.script, args.script_args) == ("train.py", ["--lr", "1"])
    top = argparse.ArgumentParser(prog="trl")
    launch_command_parser(top.add_subparsers(dest="command"))
    assert top.parse_args(["launch", "-n", "3", "x.py"]).num_processes == 3


def test_launch_command_raises_before_starting_anything_on_bad_input(tmp_path: object) -> None:
    from accel.commands.launch import launch_command, launch_command_parser

    parser = launch_command_parser()
    with pytest.raises(ValueError, match="does not exist"):
        launch_command(parser.parse_args(["--cpu", "no_such_script.py"]))
    with pytest.raises(ValueError, match="use_deepspeed"):
        launch_command(parser.parse_args(["--use_deepspeed", "no_such_script.py"]))


def test_env_command_returns_the_report_as_items(capsys: pytest.CaptureFixture[str]) -> None:
    import accel.commands.env as env_cmd

    info = env_cmd.env_command(env_cmd.env_command_parser().parse_args([]))
    assert info["accel"] and info["CPU cores usable"].isdigit()
    import platform

    import torch

    assert (info["Python version"], info["PyTorch version"]) == (platform.python_version(),
                                                                 torch.__version__)
    assert info["`accel` bash location"].endswith("accel") or \
        info["`accel` bash location"] == "Not found"
    assert "- accel: " in capsys.readouterr().out


def test_other_commands_import_and_say_what_to_use() -> None:
    from accel.commands.config.config_args import SageMakerConfig
    from accel.commands.estimate import estimate_command_parser, gather_data

    for stand_in, hint in ((SageMakerConfig, "SageMaker"), (gather_data, "accel estimate-memory")):
        assert is_stand_in(stand_in)
        with pytest.raises(NotSupportedError, match=hint):
            stand_in()
    # estimate-memory's parser is Accelerate's (a model name and its options)
    args = estimate_command_parser().parse_args(["bert-base-cased", "--library_name", "timm"])
    assert (args.model_name, args.library_name, args.dtypes) == ("bert-base-cased", "timm", None)
    import accel.commands

    assert {"launch", "test", "env"} <= set(dir(accel.commands))
