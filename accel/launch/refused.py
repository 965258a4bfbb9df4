"""Accelerate ``launch`` flags that ``accel launch`` refuses, each with its reason and alternative.

They are registered with the parser (hidden from ``--help``) with the arity Accelerate gives them,
so that ``accel launch --use_deepspeed train.py`` says why in one line instead of argparse's
"unrecognized arguments", and a refused flag's value is never taken for the script.

Example:
    >>> reason_for("use_deepspeed").startswith("accel has no DeepSpeed")
    True
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["REFUSED", "add_refused_flags", "reason_for", "refusals"]

_DDP = "drop it to train with DDP (every process holds the whole model)"

#: (reason and alternative, {flag name (underscores): takes a value}), one row per topic.
REFUSED: tuple[tuple[str, dict[str, bool]], ...] = (
    (f"accel has no DeepSpeed integration; {_DDP}, or keep `accelerate launch` for DeepSpeed",
     {"use_deepspeed": False, "deepspeed_config_file": True, "zero_stage": True,
      "offload_optimizer_device": True, "offload_param_device": True,
      "offload_optimizer_nvme_path": True, "offload_param_nvme_path": True,
      "zero3_init_flag": True, "zero3_save_16bit_model": True, "deepspeed_hostfile": True,
      "deepspeed_exclusion_filter": True, "deepspeed_inclusion_filter": True,
      "deepspeed_multinode_launcher": True, "deepspeed_moe_layer_cls_names": True}),
    ("is DeepSpeed's gradient clipping; call accelerator.clip_grad_norm_(...) in the loop "
     "instead", {"gradient_clipping": True}),
    (f"accel has no Megatron-LM integration; {_DDP}",
     {"use_megatron_lm": False, **{f"megatron_lm_{name}": True for name in (
         "tp_degree", "use_custom_fsdp", "no_load_optim", "eod_mask_loss",
         "overlap_cpu_optimizer_d2h_h2d", "no_save_optim", "optimizer_cpu_offload",
         "use_precision_aware_optimizer", "decoder_last_pipeline_num_layers", "pp_degree",
         "num_micro_batches", "sequence_parallelism", "recompute_activations",
         "use_distributed_optimizer", "gradient_clipping", "recompute_granularity",
         "recompute_method", "recompute_num_layers", "attention_backend",
         "expert_model_parallel_size", "context_parallel_size", "attention_dropout",
         "hidden_dropout", "attention_softmax_in_fp32", "expert_tensor_parallel_size",
         "calculate_per_token_loss", "use_rotary_position_embeddings")}}),
    ("accel has no context or sequence parallelism; drop it (the device mesh of FSDP is "
     "--parallelism_config_dp_replicate_size and --parallelism_config_dp_shard_size)",
     {f"parallelism_config_{name}": True for name in (
         "cp_backend", "cp_comm_strategy", "sp_backend", "sp_seq_length",
         "sp_seq_length_is_variable", "sp_attn_implementation")}),
    ("accel has no FP8 training; use --mixed_precision bf16 (or fp16)",
     {"fp8_use_autocast_during_eval": False, **{f"fp8_{name}": True for name in (
         "backend", "margin", "interval", "format", "amax_history_len", "amax_compute_algo",
         "override_linear_precision", "opt_level", "enable_fsdp_float8_all_gather",
         "pad_inner_dim")}}),
    ("accel does not start TPU pod workers over gcloud/ssh; run `accel launch --tpu` on each "
     "TPU VM host with --num_machines, --machine_rank and --main_process_ip",
     {"tpu_cluster": False, "no_tpu_cluster": False, "tpu_use_sudo": False, "vm": True,
      "env": True}),
    ("accel runs the script itself as __main__ on every device (Accelerate needs it only to "
     "spawn TPU processes); drop it", {"main_training_function": True}),
    ("is a TPU-only XLA downcasting switch; use --mixed_precision bf16",
     {"downcast_bf16": False}),
    ("accel does not submit Amazon SageMaker jobs; run `accel launch` inside the job",
     {"aws_access_key_id": True, "aws_secret_access_key": True}),
    ("sets oneCCL worker threads, but accel's CPU processes communicate with gloo, not oneCCL "
     "(Accelerate 1.x dropped it too); drop it", {"mpirun_ccl": True}),
)

_DEST = "refused_flags"


def reason_for(name: str) -> str:
    """The reason and alternative for refused flag ``name`` (underscores, no dashes)."""
    for reason, flags in REFUSED:
        if name in flags:
            return reason
    raise KeyError(name)


class _Refuse(argparse.Action):
    """Records the flag in ``refused_flags`` (the launch refuses it) and, as Accelerate's parser
    does, its value under its own name (True for a switch), so code that reads
    ``args.use_deepspeed`` sees what was asked for."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        seen = list(getattr(namespace, _DEST, None) or [])
        seen.append(option_string or self.dest)
        setattr(namespace, _DEST, seen)
        setattr(namespace, self.dest, values[0] if self.nargs == 1 else True)


def add_refused_flags(parser: argparse.ArgumentParser) -> None:
    """Register every refused flag (both spellings), hidden from ``--help``; each reads as
    Accelerate's default when absent (False for a switch, None for a value)."""
    parser.set_defaults(**{_DEST: None})
    for _, flags in REFUSED:
        for name, takes_value in flags.items():
            spellings = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
            parser.add_argument(*spellings, dest=name, action=_Refuse,
                                nargs=1 if takes_value else 0,
                                default=None if takes_value else False, help=argparse.SUPPRESS)


def refusals(given: list[str] | None) -> list[str]:
    """One line per refused flag that was given (in the order given, each once)."""
    lines: list[str] = []
    for flag in dict.fromkeys(given or []):
        lines.append(f"{flag}: {reason_for(flag.lstrip('-').replace('-', '_'))}")
    return lines
