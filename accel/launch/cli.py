"""The ``accel`` command line: ``launch``, ``config``, ``env``, ``test``, ``convert-checkpoint``,
``merge-weights``, ``estimate-memory``.

Importing this module (and ``accel --help`` / ``accel launch --help``) never imports torch; torch
is imported only after the arguments are parsed, by the command that needs it.

Errors in the command line or the configuration print one line and exit with status 2.

Example:
    >>> main(["launch", "--cpu", "-n", "2", "train.py"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from .._base.parse import parse_float, parse_int
from ..env.ps_layout import PS_LAYOUT_VARIABLE
from ..env.settings import FSDP_VARIABLES
from . import core
from .config_file import ConfigFile, default_config_path, read_config
from .errors import CLIError
from .ps_launch import ps_flags
from .refused import add_refused_flags, refusals

if TYPE_CHECKING:
    from .settings import LaunchSettings

__all__ = ["build_parser", "free_port", "launch_parser", "main", "resolve_launch",
           "run_launch"]

_EPILOG_LAUNCH = """\
precedence: flag > environment (ACCEL_*) > config file > default; the settings table printed
before the start says where each value came from. -n/--num_processes is the total over all
machines (Accelerate's meaning). Config file: --config_file, else $ACCEL_CONFIG_FILE, else
~/.config/accel/default_config.yaml if it exists. Examples:
  accel launch --cpu -n 4 train.py --lr 0.1
  accel launch -m mypackage.train
  accel launch --num_machines 2 --machine_rank 0 --main_process_ip 10.0.0.1 \\
      --main_process_port 29500 train.py
  accel launch -np 8 -H node1:4,node2:4 train.py    (horovodrun's flags; on each host)
"""


_DESCRIPTION = ("Start a script in N processes with torchrun's agent. Every flag may be spelled "
                "with hyphens or underscores (--num-processes 2 is --num_processes 2).")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows each flag once: ``--num_processes``, not also its hyphen twin ``--num-processes``
    (both are accepted; the description says so)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        strings = action.option_strings
        twins = {s for s in strings if s.startswith("--") and "-" in s[2:]
                 and "--" + s[2:].replace("-", "_") in strings}
        if twins:
            action = copy.copy(action)
            action.option_strings = [s for s in strings if s not in twins]
        return super()._format_action_invocation(action)


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _argument(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type``: argparse shows ``ArgumentTypeError``'s text (not ``ValueError``'s)."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


# The name is "": argparse prefixes the flag ("argument -n/--num_processes: must be ...").
_positive = _argument(lambda text: parse_int(text, name="", minimum=1))
_non_negative = _argument(lambda text: parse_int(text, name="", minimum=0))
_port = _argument(lambda text: parse_int(text, name="", minimum=0, maximum=65535, what="a port"))
_seconds = _argument(lambda text: parse_float(text, name="", above=0, what="a number of seconds"))


def _flag(parser: argparse.ArgumentParser, name: str, *extra: str, **kwargs: Any) -> None:
    spellings = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    parser.add_argument(*extra, *spellings, dest=name, **kwargs)


def _switch(parser: argparse.ArgumentParser, name: str, text: str) -> None:
    """A flag without a value; None when absent, so the environment or config file may set it."""
    _flag(parser, name, action="store_const", const=True, default=None, help=text)


def _add_launch_args(p: argparse.ArgumentParser) -> None:
    _flag(p, "num_processes", "-n", type=_positive, metavar="N",
          help="total processes over all machines (default: one per visible GPU, else 1)")
    _flag(p, "num_machines", type=_positive, metavar="N", help="number of machines (default 1)")
    _flag(p, "machine_rank", type=_non_negative, metavar="R", help="rank of this machine")
    _flag(p, "main_process_ip", metavar="IP", help="address of machine rank 0 (multi-node)")
    _flag(p, "main_process_port", type=_port, metavar="PORT",
          help="rendezvous port on machine rank 0 (multi-node; single node: a free port)")
    p.add_argument("--cpu", dest="device", action="store_const", const="cpu", default=None,
                   help="run on the CPU with gloo even if GPUs are visible")
    _flag(p, "multi_gpu", action="store_true", help="one process per GPU (Accelerate's flag; "
          "the default when 2+ GPUs are visible): an error with fewer than 2 processes")
    _flag(p, "tpu", action="store_true", help="run on XLA devices (as distributed_type: XLA)")
    _flag(p, "gpu_ids", metavar="IDS", help="GPU indices to use, e.g. 0,1 (default: all)")
    _flag(p, "mixed_precision", choices=["no", "fp16", "bf16"], help="no | fp16 | bf16")
    _flag(p, "gradient_accumulation_steps", type=_positive, metavar="N")
    _flag(p, "num_cpu_threads_per_process", type=_positive, metavar="N",
          help="OMP_NUM_THREADS of each worker (default: cores / processes per machine)")
    _flag(p, "max_restarts", type=_non_negative, metavar="N", help="restarts of the worker "
          "group before the job fails (default 0)")
    _flag(p, "monitor_interval", type=_seconds, metavar="S", help="seconds between health "
          "checks of the workers (default 0.1)")
    _flag(p, "rdzv_backend", choices=["static", "c10d", "etcd", "etcd-v2"],
          help="rendezvous backend (default: c10d on one machine, static on several)")
    _flag(p, "rdzv_conf", metavar="K=V,...", help="extra rendezvous options, as torchrun's")
    _flag(p, "rdzv_endpoint", metavar="HOST:PORT", help="rendezvous endpoint: the same as "
          "--main_process_ip HOST --main_process_port PORT")
    _switch(p, "same_network", "accepted for Accelerate's sake; accel's multi-node rendezvous "
            "is the same either way")
    _flag(p, "role", metavar="NAME", help="torchrun's --role: a label of the workers")
    _add_log_args(p)
    _switch(p, "enable_cpu_affinity", "bind each GPU worker to the CPUs of its GPU's NUMA "
            "node (torchrun's --numa-binding node)")
    _flag(p, "dynamo_backend", metavar="BACKEND", help="torch.compile backend for the workers "
          "(ACCEL_DYNAMO_BACKEND): no, eager, aot_eager, inductor, cudagraphs, ...")
    _flag(p, "dynamo_mode", metavar="MODE", help="default | reduce-overhead | max-autotune | "
          "max-autotune-no-cudagraphs")
    _switch(p, "dynamo_use_fullgraph", "compile the whole model as one graph")
    _switch(p, "dynamo_use_dynamic", "trace dynamic shapes")
    _switch(p, "dynamo_use_regional_compilation", "compile repeated blocks once each")
    _add_horovod_paddle_args(p.add_argument_group("horovodrun / Paddle fleetrun spellings"))
    _add_fsdp_args(p.add_argument_group("FSDP2 (Accelerate's flags; values as `accelerate "
                                        "launch` takes them)"))
    _flag(p, "mpirun_hostfile", metavar="PATH", help="start CPU workers with mpirun (Open MPI, "
          "MPICH, Intel MPI, MVAPICH2) on the hosts of this file instead of torchrun's agent")
    _flag(p, "config_file", metavar="PATH", help="YAML config (must exist)")
    p.add_argument("--quiet", "-q", action="store_true", help="do not print the settings table")
    p.add_argument("--debug", action="store_const", const=True, default=None,
                   help="ACCEL_DEBUG=1 (check collectives across ranks) and verbose torchrun")
    p.add_argument("--module", "-m", action="store_true",
                   help="the target is a module name (like python -m)")
    _flag(p, "no_python", action="store_true",
          help="run the target as an executable (on PATH or a path), not with Python")
    add_refused_flags(p)
    p.add_argument("script", metavar="script.py", nargs="?",
                   help="the training script (or module with -m)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments of the script")


def _add_log_args(p: Any) -> None:
    _flag(p, "tee", "-t", metavar="STD", help="copy worker stdout/stderr to --log_dir "
          "(torchrun's --tee: 1 stdout, 2 stderr, 3 both)")
    _flag(p, "log_dir", metavar="DIR", help="directory for worker logs: DIR/workerlog.<rank> "
          "(stdout) and DIR/workerlog.<rank>.err (stderr) link to torchrun's files under "
          "DIR/<run id>_*/attempt_<n>/<local rank>/; the console still shows the output "
          "(--tee 3 unless --tee is given)")


def _add_horovod_paddle_args(p: Any) -> None:
    p.add_argument("-np", dest="np", type=_positive, metavar="N", default=None,
                   help="horovodrun's spelling of -n/--num_processes (the total)")
    _flag(p, "hosts", "-H", metavar="HOST:N,...", help="horovodrun's host list, e.g. "
          "node1:4,node2:4 (N processes on each; the first host runs rank 0 and the "
          "rendezvous): sets the machines, this machine's rank and -np")
    _flag(p, "hostfile", metavar="PATH", help="horovodrun's host file: one 'host slots=N' "
          "(or host:N) line per machine, # comments; as -H")
    _flag(p, "gpus", metavar="IDS", help="fleetrun's spelling of --gpu_ids")
    _flag(p, "ips", metavar="IP1,IP2", help="Paddle-style machine list: sets --num_machines, "
          "--main_process_ip (the first) and --machine_rank (this machine's position)")
    _flag(p, "server_num", type=_positive, metavar="S", help="parameter-server job (accel.ps):"
          " S servers, with --worker_num W workers (S + W processes, one rendezvous)")
    _flag(p, "worker_num", type=_positive, metavar="W", help="workers of a parameter-server job")
    _flag(p, "servers", metavar="HOST[:PORT],...", help="fleetrun's list: one server per entry, "
          "on that host (with --workers; the hosts become the machines)")
    _flag(p, "workers", metavar="HOST[:PORT],...", help="fleetrun's list: one worker per entry")


def _add_fsdp_args(p: Any) -> None:
    _switch(p, "use_fsdp", "shard models with FSDP2 (ACCEL_USE_FSDP; with --cpu or on GPUs)")
    for name, text in FSDP_VARIABLES:
        _flag(p, name, metavar="V", help=text)
    _switch(p, "use_parallelism_config", "accepted for Accelerate's sake: the sizes below "
            "apply whenever given")
    _flag(p, "parallelism_config_dp_replicate_size", type=_positive, metavar="N",
          help="replicated groups of the device mesh (HSDP)")
    _flag(p, "parallelism_config_dp_shard_size", type=_positive, metavar="N",
          help="processes that shard the model in each group")
    for name in ("tp_size", "cp_size", "sp_size"):
        _flag(p, f"parallelism_config_{name}", type=_positive, metavar="1",
              help=argparse.SUPPRESS)  # accel has none: only 1 is accepted


def launch_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``accel launch`` parser: a sub-command of ``subparsers`` (an argparse
    ``add_subparsers()`` result), or a parser of its own."""
    options: dict[str, Any] = {"epilog": _EPILOG_LAUNCH, "allow_abbrev": False,
                               "description": _DESCRIPTION, "formatter_class": _HelpFormatter}
    launch = subparsers.add_parser("launch", help="start a script in N processes (torchrun's "
                                   "agent)", **options) if subparsers is not None else \
        _Parser(prog="accel launch", **options)
    _add_launch_args(launch)
    _flag(launch, "sync_batchnorm", choices=["global", "node"], help="BatchNorm layers become "
          "SyncBatchNorm at prepare(): over all processes, or over each machine's "
          "(ACCEL_SYNC_BATCHNORM)")
    return launch


def run_launch(args: argparse.Namespace) -> int:
    """Run ``accel launch`` with arguments parsed by :func:`launch_parser`; the exit status.

    Raises:
        CLIError: a refused flag, a missing script, or settings that contradict each other.
    """
    return _launch(args)


def build_parser() -> argparse.ArgumentParser:
    """The ``accel`` parser with its subcommands."""
    parser = _Parser(prog="accel", description="Run PyTorch training loops on CPU, CUDA or XLA, "
                     "in one process or many.", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    launch_parser(sub)
    config = sub.add_parser("config", help="write the default config file (asks questions; "
                            "`accel config default` asks none)", allow_abbrev=False)
    config.add_argument("action", nargs="?", choices=["default"], help="write defaults")
    _flag(config, "config_file", metavar="PATH", help="where to write (default: "
          "$ACCEL_CONFIG_FILE or ~/.config/accel/default_config.yaml)")
    _flag(config, "mixed_precision", choices=["no", "fp16", "bf16"],
          help="for `default`: the mixed precision to write")
    config.add_argument("--force", action="store_true",
                        help="for `default`: overwrite an existing file")
    sub.add_parser("env", help="what accel detects here (paste it into bug reports)")
    sub.add_parser("test", help="2-process CPU self-check of collectives and a DDP step")
    _add_convert_parser(sub)
    _add_merge_parser(sub)
    _add_estimate_parser(sub)
    return parser


_DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16",
                "bf16": "bfloat16", "float16": "float16", "fp16": "float16"}


def _estimate_dtype(text: str) -> str:
    if text.lower() not in _DTYPE_NAMES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; choose from float32, "
                                         "bfloat16, float16 (or fp32, bf16, fp16)")
    return _DTYPE_NAMES[text.lower()]


def _add_estimate_parser(sub: Any) -> None:
    estimate = sub.add_parser(
        "estimate-memory", allow_abbrev=False,
        help="memory a model needs for inference and for training with Adam",
        description="Build the model on the meta device (nothing is allocated) and print, per "
        "dtype: its largest layer, its total size, the memory for inference (the weights) and "
        "for training with Adam (weights + gradients + Adam's two fp32 moments, plus fp32 "
        "master weights for bfloat16/float16 mixed precision: 16 bytes per parameter). "
        "Activations are NOT included. Exit status: 0 printed, 2 the model spec cannot be "
        "imported or built.")
    estimate.add_argument("model", metavar="MODEL_SPEC", help="package.module:function or "
                          "path/to/file.py:function; the function takes no argument and "
                          "returns the torch.nn.Module")
    estimate.add_argument("--dtypes", nargs="+", type=_estimate_dtype, metavar="DTYPE",
                          default=["float32", "bfloat16", "float16"],
                          help="dtypes to estimate at (default: float32 bfloat16 float16)")
    estimate.add_argument("--json", dest="as_json", action="store_true",
                          help="print JSON (bytes) for scripts")


def _add_merge_parser(sub: Any) -> None:
    merge = sub.add_parser(
        "merge-weights", allow_abbrev=False,
        help="consolidate a sharded (FSDP) checkpoint's model into safetensors",
        description="Write the model(s) of a checkpoint saved by an FSDP run with "
        "SHARDED_STATE_DICT as consolidated safetensors with Hugging Face names "
        "(model.safetensors, or model-0000i-of-0000n.safetensors + model.safetensors.index.json"
        "; several models go to OUTPUT_DIR/model_<i>). One process, no process group; every "
        "shard is verified against the checkpoint's manifest. Exit status: 0 merged, 1 damaged "
        "checkpoint or failed write, 2 usage error.")
    merge.add_argument("checkpoint", metavar="CHECKPOINT_DIR",
                       help="a complete accel checkpoint (checkpoint_<n>)")
    merge.add_argument("output", metavar="OUTPUT_DIR", help="where the safetensors files go")
    merge.add_argument("--max_shard_size", "--max-shard-size", default="10GB",
                       help="largest file, e.g. 5GB or 500MB (default 10GB)")
    merge.add_argument("--no_progress", "--no-progress", action="store_true",
                       help="no progress bar")


def _add_convert_parser(sub: Any) -> None:
    convert = sub.add_parser(
        "convert-checkpoint", allow_abbrev=False,
        help="convert an Accelerate save_state directory into an accel checkpoint",
        description="Convert a directory written by Accelerate's accelerator.save_state() into "
        "an accel checkpoint that accelerator.load_state(OUT_DIR) loads. Pickled files are "
        "read with torch.load(weights_only=True) only; a file that needs a full unpickler is "
        "listed with what it needs and skipped, never loaded. Exit status: 0 converted, 1 "
        "refused (--strict) or not written, 2 usage error.")
    convert.add_argument("source", metavar="ACCELERATE_DIR", help="the save_state directory")
    convert.add_argument("output", metavar="OUT_DIR", help="the accel checkpoint to write")
    convert.add_argument("--strict", action="store_true", help="refuse (write nothing) if any "
                         "file cannot be converted")
    convert.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")
    convert.add_argument("--json", dest="as_json", action="store_true",
                         help="print the report as JSON (for scripts)")


def _locate_config(flag: str | None) -> tuple[ConfigFile | None, str]:
    """The config file to use and how it was found; a missing explicit file is an error."""
    if flag:
        return read_config(flag), "flag --config_file"
    path, how = default_config_path()
    if how != "default location":
        return read_config(path), how
    if path.is_file():
        return read_config(path), "default location (used because it exists)"
    return None, f"none (no file at {path})"


_is_local_address = core.is_local_address


def free_port() -> int:
    """A TCP port free on this machine now (bound and released)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _check_target(args: argparse.Namespace) -> None:
    """Refused Accelerate flags, and a target that cannot run, as one-line errors."""
    _refuse_flags(args)
    if args.script is None:
        raise CLIError("no script given; usage: accel launch [flags] script.py [args] (or "
                       "-m package.module [args])")
    if args.no_python and not args.module and shutil.which(args.script) is None:
        raise CLIError(f"--no_python: {args.script!r} is not an executable file nor a command "
                       "on PATH; pass an executable (chmod +x), or drop --no_python for a "
                       "Python script")
    if not args.module and not args.no_python and not os.path.isfile(args.script):
        raise CLIError(f"script {args.script!r} does not exist (cwd {os.getcwd()}); pass a "
                       "Python file, or -m package.module for a module")


def _refuse_flags(args: argparse.Namespace) -> None:
    refused = refusals(getattr(args, "refused_flags", None))
    if refused:
        raise CLIError("; ".join(refused) if len(refused) == 1 else
                       "these Accelerate flags are not supported:\n  " + "\n  ".join(refused))


def _resolve(args: argparse.Namespace) -> tuple[LaunchSettings, ConfigFile | None, str,
                                                str | None]:
    """(settings, config file, how it was found, parameter-server layout) of ``args``."""
    from ..env import cpu_count
    from .settings import resolve_settings

    config, config_note = _locate_config(args.config_file)
    flags, ps_layout, ps_sources = ps_flags({key: value for key, value in vars(args).items()
                                 if key not in ("command", "refused_flags")}, _is_local_address)
    settings = resolve_settings(flags, environ=None, config=config, gpu_count=core.gpu_count,
                                cpu_count=cpu_count(), run_id=uuid.uuid4().hex,
                                is_local_address=_is_local_address, free_port=free_port)
    if ps_sources:
        settings = dataclasses.replace(settings, sources={**settings.sources, **ps_sources})
    return settings, config, config_note, ps_layout


def resolve_launch(args: argparse.Namespace,
                   ) -> tuple[LaunchSettings, ConfigFile | None, dict[str, str]]:
    """The settings ``accel launch`` runs ``args`` (from :func:`launch_parser`) with (flag >
    environment > config file > default), the config file used, and the variables the
    workers get (``worker_env``, and the parameter-server layout). Starts nothing and does not
    check that the script exists.

    Raises:
        CLIError: a refused flag, a bad value, or settings that contradict each other.
    """
    from .torchrun import worker_env

    _refuse_flags(args)
    settings, config, _, ps_layout = _resolve(args)
    env = worker_env(settings)
    if ps_layout is not None:
        env[PS_LAYOUT_VARIABLE] = ps_layout
    return settings, config, env


def _launch(args: argparse.Namespace) -> int:
    from .settings import settings_table
    from .torchrun import build_torchrun_argv, run_torchrun, worker_env

    _check_target(args)
    settings, config, config_note, ps_layout = _resolve(args)
    if config is not None and config.ignored:
        print(f"accel launch: warning: config file {config.path}: ignoring keys accel does not "
              f"use: {', '.join(config.ignored)}", file=sys.stderr)
    for warning in settings.warnings:
        print(f"accel launch: warning: {warning}", file=sys.stderr)
    if not args.quiet:
        print(settings_table(settings, config_note), file=sys.stderr, flush=True)
    env = worker_env(settings)
    if ps_layout is not None:
        env[PS_LAYOUT_VARIABLE] = ps_layout
        if not args.quiet:
            print(f"parameter server: servers:workers per machine {ps_layout} "
                  f"({PS_LAYOUT_VARIABLE})", file=sys.stderr, flush=True)
    if settings.mpirun_hostfile is not None:
        from .mpirun import run_mpirun

        return run_mpirun(settings, env)
    if settings.num_machines > 1:
        from .preflight import preflight

        env.update(preflight(settings, None))
    return run_torchrun(build_torchrun_argv(settings), env=env, debug=settings.debug)


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "launch":
        return _launch(args)
    if args.command == "config":
        from .config_cmd import run_config

        return run_config(args)
    if args.command == "env":
        from .info import print_env

        return print_env()
    if args.command == "test":
        from .selftest import run_selftest

        return run_selftest()
    if args.command == "convert-checkpoint":
        # the one lazy use of a library layer by launch/ (tests/unit/test_architecture.py,
        # LAUNCH_LAZY_USES): the converter needs torch and the checkpoint storage
        from ..checkpoint.convert.command import run_command

        return run_command(args.source, output=args.output, strict=args.strict,
                           overwrite=args.overwrite, as_json=args.as_json)
    if args.command == "merge-weights":
        # lazy, as above (LAUNCH_LAZY_USES): the merge needs torch and the checkpoint storage
        from ..checkpoint.sharded.command import run_merge

        return run_merge(args.checkpoint, output=args.output, max_shard_size=args.max_shard_size,
                         progress=not args.no_progress)
    if args.command == "estimate-memory":
        # lazy, as above (LAUNCH_LAZY_USES): building a model needs torch
        from ..big_modeling.estimate import run_estimate

        return run_estimate(args.model, dtypes=args.dtypes, as_json=args.as_json)
    parser.print_help()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``accel`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        return _dispatch(parser, args)
    except CLIError as exc:
        print(f"accel {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if "pip install" not in str(exc):  # not one of accel's "install the extra" messages
            raise
        print(f"accel {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"accel {args.command}: interrupted", file=sys.stderr)
        return 130
