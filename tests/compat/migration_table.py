"""The README's table of Hugging Face Accelerate names: which accel accepts, which it does not
and why. Generated from the installed ``accelerate`` (1.15.0, the test extra's pin) and accel's
own code; tests/compat/test_migration_table.py checks that README.md holds exactly this text.

    python -m tests.compat.migration_table --write    # regenerate the block in README.md
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType

import accel
import accel.utils
from accel import Accelerator
from accel.run.connector import UNSUPPORTED_ARGUMENTS

README = Path(__file__).resolve().parents[2] / "README.md"
BEGIN, END = "<!-- accelerate-names -->", "<!-- /accelerate-names -->"

_FSDP = ("Accelerate's FSDP internals (accel's FSDP2 runs through `prepare()` with `fsdp_plugin=`; "
         "`accel merge-weights` consolidates sharded checkpoints), or tensor / context "
         "parallelism (not supported)")
_DS = "DeepSpeed is not supported (use DDP, the default)"
_MEGATRON = "Megatron-LM is not supported"
_FP8 = "fp8 training and bitsandbytes / torchao quantisation are not supported"
_LAUNCH = "internal to `accelerate launch`; `accel launch` does this itself"
_FILES = ("Accelerate's checkpoint file names and I/O; accel checkpoints are one manifest-checked "
          "directory (`save_state`, `accelerator.save`; `accel convert-checkpoint` reads "
          "Accelerate's)")
_TREE = ("Accelerate's internal nested-tensor helpers; accel's collectives take nested "
         "structures directly")
_PROFILE = "use `torch.profiler` directly"

#: Names accel does not provide, by pattern (first match wins), for every namespace below.
NOT_PROVIDED: list[tuple[str, str]] = [
    (r"(?i)deepspeed|GatheredParameters|ulysses", _DS),
    (r"(?i)megatron|TrainStep$|avg_losses_across_data_parallel_group", _MEGATRON),
    (r"(?i)fsdp|FullyShardedDataParallel|ParallelismConfig|parallelism_config|TensorParallel|"
     r"ContextParallel|model_has_dtensor|get_model_tp_size", _FSDP),
    (r"(?i)fp8|TERecipe|MSAMP|AORecipe|_ao$|ao_layers|torchao|transformer_engine|bnb|"
     r"quantiz|filter_first_and_last_linear_layers|CustomDtype|^convert_model$", _FP8),
    (r"(?i)lomo", "the LOMO optimizer integration is not supported"),
    (r"(?i)pippy|^inference$", "pipeline-parallel inference is not supported"),
    (r"(?i)profil", _PROFILE),
    (r"(?i)^prepare_.*(env|args|inputs|tpu)|PrepareForLaunch|LAUNCH_PARAMS|ComputeEnvironment|"
     r"SageMaker|install_xla|numa_affinity|is_port_in_use|environment$|env_variables|"
     r"distributed_information|p2p_ib|os_kernel|gpu_info|_from_env$|str_to_bool|"
     r"libraries_initialized|gaudi|^commands$|^launchers$|^debug_launcher$", _LAUNCH),
    (r"_NAME$|WEIGHTS|^load$|^save$|^checkpointing$", _FILES),
    (r"(?i)recursively_apply|honor_type|is_torch_tensor|is_namedtuple|data_structure|"
     r"TensorInformation|tensor_information|initialize_tensors|slice_tensors|^concatenate$|"
     r"find_batch_size|^listify$|convert_(outputs_)?to_fp32|pad_input_tensors|"
     r"CannotPadNestedTensor|OPERATION_TYPES|^find_device$|^merge_dicts$|recursive_getattr",
     _TREE),
    (r"^KwargsHandler$", "accel's kwargs handlers are plain dataclasses with no common base"),
    (r"^RNGType$", "rng types are the strings \"torch\", \"cuda\", \"xla\", \"generator\""),
    (r"^(compare_versions|is_torch_version|get_pretty_name|is_peft_model|"
     r"get_current_device_type)$", "Accelerate's internal utility; not part of accel's API"),
    (r"^(get_mixed_precision_context_manager|get_grad_scaler)$",
     "use `accelerator.autocast()` and `accelerator.scaler`"),
    (r"^PrefixedDataset$", "Accelerate's internal dataset wrapper"),
    (r"^(data_loader|optimizer|scheduler)$",
     "module path: accel has `accel.data_loader`, `accel.run.wrappers` (optimizer and scheduler "
     "wrappers)"),
]


def _public(obj: object) -> list[str]:
    return sorted(n for n in dir(obj) if not n.startswith("_"))


def _reason(name: str) -> str:
    for pattern, reason in NOT_PROVIDED:
        if re.search(pattern, name):
            return reason
    raise KeyError(f"{name}: accel neither provides it nor says why; add it to accel or give a "
                   "reason in tests/compat/migration_table.py NOT_PROVIDED")


def _has(owner: object, name: str) -> bool:
    """``owner`` has ``name``, or (for a package) a submodule of that name can be imported."""
    if hasattr(owner, name):
        return True
    if isinstance(owner, ModuleType) and hasattr(owner, "__path__"):
        return importlib.util.find_spec(f"{owner.__name__}.{name}") is not None
    return False


def classify(names: list[str], has: object) -> tuple[list[str], dict[str, list[str]]]:
    """(names accel has, {reason: names it does not have})."""
    accepted: list[str] = []
    refused: dict[str, list[str]] = {}
    for name in names:
        if _has(has, name):
            accepted.append(name)
        else:
            refused.setdefault(_reason(name), []).append(name)
    return accepted, refused


def namespaces() -> list[tuple[str, list[str], object]]:
    """(title, Accelerate's names, what in accel should have them)."""
    import accelerate
    import accelerate.utils

    from_acc = accelerate.Accelerator
    top = [n for n in _public(accelerate)
           if not isinstance(getattr(accelerate, n), ModuleType) or hasattr(accel, n)
           or n in ("big_modeling", "hooks", "inference", "commands", "launchers",
                    "checkpointing", "data_loader", "optimizer", "scheduler", "logging", "state")]
    utils = [n for n in _public(accelerate.utils)
             if not isinstance(getattr(accelerate.utils, n), ModuleType)]
    return [("`accelerate` (top level)", top, accel),
            ("`Accelerator` attributes and methods", _public(from_acc), Accelerator),
            ("`accelerate.utils`", utils, accel.utils)]


def _codes(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def render() -> str:
    import accelerate

    lines = [BEGIN, "", f"Generated from Accelerate {accelerate.__version__} and this accel "
             "(`python -m tests.compat.migration_table --write`; a test keeps it true).", ""]
    params = list(inspect.signature(__import__("accelerate").Accelerator).parameters)
    ours = inspect.signature(Accelerator).parameters
    accepted = [p for p in params if p in ours and p not in UNSUPPORTED_ARGUMENTS]
    lines += [f"**`Accelerator(...)` arguments.** Accepted: {_codes(accepted)}. Refused with a "
              "`TypeError` that says what to do instead:", "", "| argument | what to do |",
              "|---|---|"]
    for name in params:
        if name not in accepted:
            lines.append(f"| `{name}` | {UNSUPPORTED_ARGUMENTS[name]} |")
    for title, names, has in namespaces():
        got, refused = classify(names, has)
        lines += ["", f"**{title}.** Accepted ({len(got)} of {len(names)}): {_codes(got)}.", ""]
        if refused:
            lines += ["| not provided | why |", "|---|---|"]
            lines += [f"| {_codes(ns)} | {reason} |" for reason, ns in refused.items()]
    lines += ["", END]
    return "\n".join(lines)


def readme_block(text: str) -> str:
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the README's Accelerate name table")
    parser.add_argument("--write", action="store_true", help="rewrite the block in README.md")
    args = parser.parse_args(argv)
    table = render()
    if args.write:
        text = README.read_text()
        README.write_text(text.replace(readme_block(text), table))
    else:
        sys.stdout.write(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
