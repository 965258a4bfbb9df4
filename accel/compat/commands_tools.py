"""Accelerate's ``to-fsdp2``, ``tpu-config`` and ``estimate-memory`` commands
(``accelerate.commands.to_fsdp2``, ``.tpu`` and ``.estimate``), over accel's own pieces.

- ``to-fsdp2`` rewrites a config file's FSDP1 ``fsdp_config`` with FSDP2's keys (the form
  ``accel launch`` and Accelerate's FSDP2 read); the conversion is :func:`convert_config_to_fsdp2`.
- ``tpu-config`` builds the ``gcloud compute tpus tpu-vm ssh`` command that runs set-up commands
  on every host of a TPU pod, and prints it (``--debug``); accel does not run gcloud itself.
- ``estimate-memory``: a local model (``package.module:build_model`` or ``file.py:build_model``)
  is estimated by ``accel estimate-memory``; a Hugging Face Hub repo id is refused with an
  ``OSError`` (accel does not fetch models from the Hub), as Accelerate raises for a repo it
  cannot reach.

Example:
    >>> convert_config_to_fsdp2({"fsdp_config": {"fsdp_sharding_strategy": "SHARD_GRAD_OP"}})
    {'fsdp_config': {'fsdp_reshard_after_forward': False, 'fsdp_version': 2}}
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from ..env.log import get_logger
from .refusals import NotSupportedError

__all__ = ["add_timm_hub_prefix", "convert_config_to_fsdp2", "estimate_command",
           "estimate_command_parser", "to_fsdp2_command", "to_fsdp2_command_parser",
           "tpu_command_launcher", "tpu_command_parser"]

logger = get_logger(__name__)

#: FSDP1 ``fsdp_config`` keys FSDP2 has no use for, and why they are dropped.
_DROPPED = {
    "fsdp_backward_prefetch": "has been removed in FSDP2 (it always prefetches)",
    "fsdp_use_orig_params": "has been removed in FSDP2 (it always trains the original "
                            "parameters)",
    "fsdp_sync_module_states": "has been removed in FSDP2 (fsdp_cpu_ram_efficient_loading "
                               "broadcasts rank 0's weights)",
    "fsdp_forward_prefetch": "is not implemented in FSDP2",
}
#: FSDP1 sharding strategies -> FSDP2's ``fsdp_reshard_after_forward``.
_RESHARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD": True,
            "HYBRID_SHARD_ZERO2": False, "NO_SHARD": False}


def _parser(name: str, description: str, subparsers: Any) -> argparse.ArgumentParser:
    if subparsers is not None:
        parser: argparse.ArgumentParser = subparsers.add_parser(name, description=description,
                                                                help=description)
        return parser
    return argparse.ArgumentParser(prog=f"accel {name}", description=description)


def convert_config_to_fsdp2(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a config file's mapping) with its ``fsdp_config`` in FSDP2's keys:
    ``fsdp_sharding_strategy`` becomes ``fsdp_reshard_after_forward``, FSDP1-only keys are
    dropped (with a warning each), other keys are kept, and ``fsdp_version`` is 2. A config
    without ``fsdp_config``, or already at version 2, comes back unchanged."""
    block = config.get("fsdp_config") or {}
    if not block:
        logger.info("No FSDP config found in the config file, skipping conversion...")
        return config
    if str(block.get("fsdp_version", 1)) == "2":
        logger.warning("Config already specifies FSDP2, skipping conversion...")
        return config
    converted: dict[str, Any] = {}
    for key, value in block.items():
        if key in _DROPPED:
            logger.warning(f"Argument {key} {_DROPPED[key]}, skipping this key...")
        elif key in ("fsdp_sharding_strategy", "fsdp_reshard_after_forward"):
            converted["fsdp_reshard_after_forward"] = _RESHARD.get(str(value).upper(), value) \
                if isinstance(value, str) else value
        else:
            converted[key] = value
    converted["fsdp_version"] = 2
    config["fsdp_config"] = converted
    return config


def to_fsdp2_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``to-fsdp2`` parser (alone or as a sub-command of ``subparsers``)."""
    parser = _parser("to-fsdp2", "Convert a config file's FSDP1 settings to FSDP2's",
                     subparsers)
    parser.add_argument("--config_file", "--config-file", required=True,
                        help="the config file to convert")
    parser.add_argument("--overwrite", action="store_true",
                        help="write the result over --config_file (or over --output_file)")
    parser.add_argument("--output_file", "--output-file", default=None,
                        help="where to write the converted config")
    return parser


def to_fsdp2_command(args: argparse.Namespace) -> None:
    """Convert ``args.config_file`` and write it to ``args.output_file`` (or over itself with
    ``args.overwrite``).

    Raises:
        FileNotFoundError: no such config file.
        ValueError: neither --output_file nor --overwrite, or the file holds no settings.
        FileExistsError: --output_file exists and --overwrite is not set.
    """
    # launch/ is the side layer: imported lazily (tests/unit/test_architecture.py)
    from ..launch.config_file import load_yaml, write_config

    if not os.path.isfile(args.config_file):
        raise FileNotFoundError(f"Config file {args.config_file} not found; pass an existing "
                                "config file with --config_file")
    if not args.overwrite and args.output_file is None:
        raise ValueError("If --overwrite is not set, --output_file must be provided")
    if not args.overwrite and os.path.exists(args.output_file):
        raise FileExistsError(f"Output file {args.output_file} already exists and --overwrite "
                              "is not set; pass --overwrite or another --output_file")
    config = load_yaml(args.config_file)
    write_config(args.output_file or args.config_file, convert_config_to_fsdp2(config))


def tpu_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``tpu-config`` parser (alone or as a sub-command of ``subparsers``)."""
    parser = _parser("tpu-config", "Print the gcloud command that runs set-up commands on "
                     "every host of a TPU pod (accel does not run gcloud: pass --debug)",
                     subparsers)
    parser.add_argument("--config_file", default=None, help="config file with tpu_name, "
                        "tpu_zone, commands or command_file")
    parser.add_argument("--tpu_name", default=None, help="the TPU (default: the config file's)")
    parser.add_argument("--tpu_zone", default=None, help="its zone (default: the config file's)")
    parser.add_argument("--use_alpha", action="store_true", help="use `gcloud alpha`")
    parser.add_argument("--command_file", default=None, help="a file of commands, one a line")
    parser.add_argument("--command", action="append", nargs="+",
                        help="a command to run on every host (repeatable)")
    parser.add_argument("--install_accelerate", action="store_true",
                        help="add `pip install accelerate` to the commands")
    parser.add_argument("--accelerate_version", default="latest",
                        help="with --install_accelerate: latest, dev or a version")
    parser.add_argument("--debug", action="store_true", help="print the command")
    return parser


def _tpu_defaults(args: argparse.Namespace) -> None:
    """Fill what the command line left out from the config file (--config_file, else the
    default one if it exists)."""
    from .commands_config import _path, load_config_from_file

    if args.config_file is None and not os.path.isfile(_path(None)):
        return
    config = load_config_from_file(args.config_file)
    if not args.command_file and not args.command:
        args.command_file = config.command_file
        args.command = config.commands
    args.tpu_name = args.tpu_name or config.tpu_name
    args.tpu_zone = args.tpu_zone or config.tpu_zone


def _pod_commands(args: argparse.Namespace) -> str:
    if args.command_file:
        with open(args.command_file, encoding="utf-8") as fh:
            commands = fh.read().splitlines()
    elif args.command:
        commands = [" ".join(item) if isinstance(item, list) else str(item)
                    for item in args.command]
    else:
        raise ValueError("pass --command (repeatable) or --command_file: the commands to run "
                         "on the pod")
    if args.install_accelerate:
        version = str(args.accelerate_version)
        package = {"latest": "accelerate -U", "dev":
                   "git+https://github.com/huggingface/accelerate.git"}.get(version) or \
            f"accelerate=={version}"
        commands = [f"pip install {package}", *commands]
    return "; ".join(["cd /usr/share", *commands])


def tpu_command_launcher(args: argparse.Namespace) -> None:
    """Print (``--debug``) the ``gcloud compute tpus tpu-vm ssh`` command that runs the
    commands on every host of the pod, in ``/usr/share``.

    Raises:
        ValueError: no command, or no --tpu_name / --tpu_zone.
        NotSupportedError: without --debug (accel does not run gcloud).
    """
    _tpu_defaults(args)
    command = _pod_commands(args)
    if not args.tpu_name or not args.tpu_zone:
        raise ValueError("pass --tpu_name and --tpu_zone (or set tpu_name and tpu_zone in the "
                         "config file)")
    cmd = ["gcloud", *(["alpha"] if args.use_alpha else []), "compute", "tpus", "tpu-vm",
           "ssh", args.tpu_name, "--zone", args.tpu_zone, "--command", command, "--worker",
           "all"]
    if not args.debug:
        raise NotSupportedError("accel does not run gcloud: pass --debug to print the command, "
                                "then run it yourself")
    print(f"Running {' '.join(cmd)}")


_SPEC = re.compile(r"^[\w.\-/\\]+:[A-Za-z_]\w*$")
#: Accelerate's dtype names -> accel estimate-memory's.
_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def add_timm_hub_prefix(model_name: str) -> str:
    """``hf-hub:`` before a Hub repo id (``org/name``), as ``timm.create_model`` needs; a bare
    architecture name or a name that has a source prefix already is returned as it is.

    Example:
        >>> add_timm_hub_prefix("timm/resnet50.a1_in1k"), add_timm_hub_prefix("resnet50")
        ('hf-hub:timm/resnet50.a1_in1k', 'resnet50')
    """
    if ":" in model_name or "/" not in model_name:
        return model_name
    return f"hf-hub:{model_name}"


def estimate_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``estimate-memory`` parser (alone or as a sub-command of ``subparsers``)."""
    parser = _parser("estimate-memory", "Memory a model needs for inference and for training "
                     "with Adam, built on the meta device", subparsers)
    parser.add_argument("model_name", help="package.module:build_model or file.py:build_model "
                        "(a function returning the torch.nn.Module); Hub repo ids are refused")
    parser.add_argument("--library_name", choices=["timm", "transformers"], default=None,
                        help="Accelerate's Hub library; accel does not fetch from the Hub")
    parser.add_argument("--dtypes", nargs="+", default=None, choices=[*_DTYPES, "int8", "int4"],
                        help="dtypes (default: float32 bfloat16 float16)")
    parser.add_argument("--trust_remote_code", action="store_true",
                        help="Accelerate's Hub option; accel does not fetch from the Hub")
    return parser


def estimate_command(args: argparse.Namespace) -> None:
    """Estimate ``args.model_name`` with ``accel estimate-memory`` and print the table.

    Raises:
        OSError: ``model_name`` is a Hub repo id: accel does not download models.
        ValueError: int8/int4 (accel estimates float dtypes), or a spec that does not build.
    """
    name = str(args.model_name)
    if not _SPEC.match(name):
        raise OSError(f"`{name}` is a Hugging Face Hub repo id: accel does not fetch models "
                      "from the Hub; pass package.module:build_model (or file.py:build_model), "
                      "a function that returns the model, to estimate it locally")
    dtypes = list(args.dtypes or _DTYPES)
    quantized = [dtype for dtype in dtypes if dtype not in _DTYPES]
    if quantized:
        raise ValueError(f"--dtypes {' '.join(quantized)}: accel estimates float32, bfloat16 "
                         "and float16 only")
    from ..launch.cli import main

    if main(["estimate-memory", name, "--dtypes", *dtypes]) != 0:
        raise ValueError(f"`{name}` did not build a model (the error is printed above)")
