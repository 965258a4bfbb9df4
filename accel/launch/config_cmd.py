"""``accel config`` (questions on stdin) and ``accel config default`` (no questions).

The file goes to ``--config_file``, else ``$ACCEL_CONFIG_FILE``, else
``~/.config/accel/default_config.yaml`` (``$XDG_CONFIG_HOME`` respected), in Accelerate's format.

Example:
    >>> answers = iter(["1", "yes", "4", "no", "bf16"])
    >>> ask_config(lambda prompt: next(answers), gpu_count=0)["num_processes"]
    4
    >>> answers = iter(["1", "yes", "2", "yes", "", "Block", "no", "", "no"])
    >>> block = ask_config(lambda prompt: next(answers), gpu_count=0)["fsdp_config"]
    >>> block["fsdp_transformer_layer_cls_to_wrap"], block["fsdp_reshard_after_forward"]
    ('Block', False)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from .._base.parse import parse_bool, parse_choice, parse_gpu_ids, parse_int
from . import core
from .config_file import config_to_yaml_dict, default_config_path, write_config
from .errors import CLIError

__all__ = ["ask_config", "default_values", "run_config"]

_ATTEMPTS = 5


def _ask(ask: Callable[[str], str], *, question: str, default: Any,
         parse: Callable[[str], Any]) -> Any:
    shown = "" if default is None else f" [{default}]"
    for _ in range(_ATTEMPTS):
        try:
            answer = ask(f"{question}{shown}: ").strip()
        except EOFError:
            raise CLIError(f"no answer for {question!r} (end of input); run `accel config` in a "
                           "terminal or use `accel config default`") from None
        if not answer and default is not None:
            answer = str(default)
        try:
            return parse(answer)
        except ValueError as exc:
            print(f"  {exc}; please try again")
    raise CLIError(f"no valid answer for {question!r} after {_ATTEMPTS} attempts")


#: The subject of the validators' messages, printed before "; please try again".
_ANSWER = "the answer"


def _int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    return lambda text: parse_int(text, name=_ANSWER, minimum=low, maximum=high)


def _yes_no(text: str) -> bool:
    short = {"y": "yes", "n": "no"}.get(text.strip().lower(), text)  # as terminals ask
    return parse_bool(short, name=_ANSWER, hint="answer yes or no")


def _one_of(choices: Sequence[str]) -> Callable[[str], str]:
    return lambda text: parse_choice(text, name=_ANSWER, choices=choices)


def _upper_choice(choices: Sequence[str]) -> Callable[[str], str]:
    """One of upper-case ``choices``, answered in any case."""
    lower = tuple(choice.lower() for choice in choices)
    return lambda text: parse_choice(text, name=_ANSWER, choices=lower).upper()


def _gpu_ids(per_machine: int) -> Callable[[str], str | None]:
    def parse(text: str) -> str | None:
        ids = parse_gpu_ids(text, _ANSWER)
        count = len(ids.split(",")) if ids else per_machine  # "all": every visible GPU
        if count < per_machine:
            raise ValueError(f"{per_machine} processes per machine need at least {per_machine} "
                             f"GPU ids, got {count}")
        return ids
    return parse


def _nonempty(text: str) -> str:
    if not text:
        raise ValueError("an answer is required")
    return text


def ask_config(ask: Callable[[str], str], gpu_count: int) -> dict[str, Any]:
    """Ask the questions (machines, rank, address/port, CPU, processes, GPU ids, precision)."""
    machines = _ask(ask, question="How many machines will run the job", default=1, parse=_int_in(1))
    rank, ip, port = 0, None, None
    if machines > 1:
        rank = _ask(ask, question="Rank of this machine (0 = the main machine)", default=0,
                    parse=_int_in(0, machines - 1))
        ip = _ask(ask, question="IP address of the main machine (rank 0)", default=None,
                  parse=_nonempty)
        port = _ask(ask, question="Rendezvous port on the main machine", default=29500,
                    parse=_int_in(1, 65535))
    use_cpu = _ask(ask, question="Run on the CPU only (yes/no)",
                   default="no" if gpu_count else "yes", parse=_yes_no)
    default_n = gpu_count * machines if gpu_count and not use_cpu else machines
    processes = _ask(ask, question="How many processes in total (all machines)", default=default_n,
                     parse=_int_in(1))
    gpu_ids = None
    if not use_cpu:
        gpu_ids = _ask(ask, question="Which GPU ids (comma-separated, or all)", default="all",
                       parse=_gpu_ids(-(-processes // machines)))
    fsdp = _ask_fsdp(ask) if processes > 1 else None
    precision = _ask(ask, question="Mixed precision (no/fp16/bf16)", default="no",
                     parse=_one_of(("no", "fp16", "bf16")))
    return config_to_yaml_dict(num_machines=machines, machine_rank=rank, main_process_ip=ip,
                               main_process_port=port, use_cpu=use_cpu, num_processes=processes,
                               gpu_ids=gpu_ids, mixed_precision=precision, fsdp=fsdp)


def _ask_fsdp(ask: Callable[[str], str]) -> dict[str, Any] | None:
    """The ``fsdp_config`` block (Accelerate's FSDP2 keys), or None for DDP."""
    if not _ask(ask,
                question="Shard the model with FSDP2 instead of replicating it with DDP (yes/no)",
                default="no", parse=_yes_no):
        return None
    policies = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
    block: dict[str, Any] = {"fsdp_version": 2, "fsdp_auto_wrap_policy": _ask(
        ask, question="Auto wrap policy (TRANSFORMER_BASED_WRAP/SIZE_BASED_WRAP/NO_WRAP)",
        default=policies[0],
        parse=_upper_choice(policies))}
    if block["fsdp_auto_wrap_policy"] == policies[0]:
        names = _ask(ask, question="Layer classes to shard as units, comma-separated (empty: the "
                     "model's _no_split_modules)", default=None, parse=str.strip)
        if names:
            block["fsdp_transformer_layer_cls_to_wrap"] = names
    elif block["fsdp_auto_wrap_policy"] == policies[1]:
        block["fsdp_min_num_params"] = _ask(ask, question="Minimum parameters of a unit",
                                            default=100_000_000,
                                            parse=_int_in(1))
    block["fsdp_reshard_after_forward"] = _ask(
        ask, question="Free gathered parameters after forward (yes: ZeRO-3, no: ZeRO-2)",
        default="yes", parse=_yes_no)
    block["fsdp_state_dict_type"] = _ask(
        ask, question="Checkpoints (SHARDED_STATE_DICT/FULL_STATE_DICT)",
        default="SHARDED_STATE_DICT",
        parse=_upper_choice(("SHARDED_STATE_DICT", "FULL_STATE_DICT")))
    return block


def default_values(gpu_count: int, mixed_precision: str = "no") -> dict[str, Any]:
    """What ``accel config default`` writes: one machine, every visible GPU (or 1 CPU process)."""
    return config_to_yaml_dict(num_machines=1, machine_rank=0, main_process_ip=None,
                               main_process_port=None, use_cpu=gpu_count == 0,
                               num_processes=max(gpu_count, 1), gpu_ids=None,
                               mixed_precision=mixed_precision)


def run_config(args: argparse.Namespace) -> int:
    """``accel config [default]``."""
    path = args.config_file or default_config_path()[0]
    if args.action == "default":
        from pathlib import Path

        if Path(path).exists() and not args.force:
            raise CLIError(f"{path} already exists; pass --force to overwrite it")
        data = default_values(core.gpu_count(), args.mixed_precision or "no")
    else:
        print(f"accel config: answers go to {path} (press Enter for the [default])")
        data = ask_config(input, core.gpu_count())
    written = write_config(path, data)
    print(f"accel config: wrote {written}")
    return 0
