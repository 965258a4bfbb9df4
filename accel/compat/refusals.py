"""What accel does not provide of Accelerate's names, and what to use instead (DESIGN.md §6).

- :data:`UNSUPPORTED_ARGUMENTS`: ``Accelerator(...)`` arguments accel refuses, with the fix.
- :data:`REFUSED`: for each of Accelerate's module paths (spelled as accel's: ``accel.utils``
  for ``accelerate.utils``; ``accel`` for the top level; ``accel.Accelerator`` for the class's
  attributes), the names accel does not provide and why. A path under ``accel.utils`` also
  refuses what ``accel.utils`` refuses. README's migration table is generated from these
  reasons (``python -m tests.compat.migration_table --write``).
- :func:`stand_in`: what a module path gives for a refused name, so that importing it works
  (scripts and test files import names they use only on some machines) and *using* it raises
  with the reason: calling or instantiating it raises :class:`NotSupportedError` (a
  ``NotImplementedError``), reading an attribute of it raises :class:`NotProvidedError`.
  ``isinstance(x, stand_in)`` is False for everything. :func:`is_stand_in` tells one apart.
- :func:`refusal`: the error for a refused ``Accelerator`` attribute (reading it is the use):
  :class:`NotProvidedError`, an ``AttributeError``, so ``hasattr(accelerator, name)`` is False.

This module imports neither torch nor the engine: ``accel/__init__`` consults it for names the
package does not have, and ``import accel`` stays cheap.

Example:
    >>> from accel.utils import DeepSpeedPlugin  # importing works
    >>> DeepSpeedPlugin(zero_stage=2)
    Traceback (most recent call last):
    ...
    accel.compat.refusals.NotSupportedError: accel.utils.DeepSpeedPlugin is not supported: ...
"""

from __future__ import annotations

import dis
import sys
from types import FrameType
from typing import Any

__all__ = ["LEGACY_ARGUMENTS", "REFUSED", "REFUSED_COMMANDS", "UNSUPPORTED_ARGUMENTS",
           "NotProvidedError", "NotProvidedImportError", "NotSupportedError", "is_stand_in",
           "not_provided", "refusal", "refused_reason", "stand_in"]

#: Accelerate's older constructor arguments that accel takes and translates (with a warning).
LEGACY_ARGUMENTS = {
    "split_batches": "becomes dataloader_config=DataLoaderConfiguration(split_batches=...), "
                     "with a FutureWarning (Accelerate 1.x accepts it and ignores it)",
}

#: Accelerate's commands accel does not run: name -> what to use instead
REFUSED_COMMANDS = {
    "estimate": "`accel estimate-memory package.module:build_model` builds the model locally on "
                "the meta device (nothing is downloaded from the Hugging Face Hub at run time)",
    "merge": "use `accel merge-weights CHECKPOINT OUTPUT`",
    "config": "`accel launch --config_file` reads Accelerate's YAML config; write one with "
              "`accel config` (or `accel.utils.write_basic_config()`)",
}

#: Accelerate constructor arguments that accel does not implement, and what to do instead.
UNSUPPORTED_ARGUMENTS = {
    "deepspeed_plugin": "DeepSpeed is not supported; use DDP (the default)",
    "deepspeed_plugins": "DeepSpeed is not supported; use DDP (the default)",
    "megatron_lm_plugin": "Megatron-LM is not supported",
    "torch_tp_plugin": "tensor parallelism is not supported",
    "dispatch_batches": "pass dataloader_config=DataLoaderConfiguration(dispatch_batches=...)",
    "even_batches": "pass dataloader_config=DataLoaderConfiguration(even_batches=...)",
    "use_seedable_sampler": "pass dataloader_config=DataLoaderConfiguration(...)",
}

_FSDP = ("Accelerate's FSDP internals (accel's FSDP2 runs through `prepare()` with `fsdp_plugin=`; "
         "`accel merge-weights` consolidates sharded checkpoints), or tensor / context "
         "parallelism (not supported)")
_DS = "DeepSpeed is not supported (use DDP, the default)"
_MEGATRON = "Megatron-LM is not supported"
_FP8 = "fp8 training and bitsandbytes / torchao quantisation are not supported"
_LOMO = "the LOMO optimizer integration is not supported"
_PIPPY = "pipeline-parallel inference is not supported"
_PROFILE = "use `torch.profiler` directly"
_LAUNCH = "internal to `accelerate launch`; `accel launch` does this itself"
_FILES = ("Accelerate's checkpoint file names and I/O; accel checkpoints are one manifest-checked "
          "directory (`save_state`, `accelerator.save`; `accel convert-checkpoint` reads "
          "Accelerate's)")
_TREE = ("Accelerate's internal nested-tensor helpers; accel's collectives take nested "
         "structures directly")
_INTERNAL = "Accelerate's internal utility; not part of accel's API"
_SHARED = ("Accelerate's shared-state internals; accel's states are views of one process or "
           "one Accelerator, with nothing shared: use `PartialState()` or `accelerator.state`")


def _by_name(*groups: tuple[str, tuple[str, ...]]) -> dict[str, str]:
    return {name: reason for reason, names in groups for name in names}


#: Accelerate module path (accel's spelling) -> {name accel does not provide: why, and what to
#: use instead}.
REFUSED: dict[str, dict[str, str]] = {
    "accel": _by_name(
        (_DS, ("DeepSpeedPlugin",)),
        (_PROFILE, ("ProfileKwargs",)),
        (_LAUNCH, ("launchers",)),
        (_PIPPY, ("inference", "prepare_pippy")),
        ("module path: accel has `accel.data_loader`, `accel.run.wrappers` (optimizer and "
         "scheduler wrappers)", ("optimizer", "scheduler")),
    ),
    "accel.Accelerator": _by_name(
        (_DS, ("deepspeed_ulysses_dl_adapter",)),
        (_LOMO, ("lomo_backward",)),
        (_PROFILE, ("profile",)),
    ),
    "accel.utils": _by_name(
        (_FP8, ("AORecipeKwargs", "BnbQuantizationConfig", "CustomDtype", "FP8RecipeKwargs",
                "MSAMPRecipeKwargs", "TERecipeKwargs", "apply_fp8_autowrap",
                "check_cuda_fp8_capability", "contextual_fp8_autocast", "convert_model",
                "convert_model_to_fp8_ao", "filter_first_and_last_linear_layers",
                "has_4bit_bnb_layers", "has_ao_layers", "has_transformer_engine_layers",
                "load_and_quantize_model", "torchao_required", "FP8BackendType")),
        (_MEGATRON, ("AbstractTrainStep", "BertTrainStep", "GPTTrainStep",
                     "MegatronLMDummyDataLoader", "MegatronLMDummyScheduler", "MegatronLMPlugin",
                     "T5TrainStep", "add_model_config_to_megatron_parser",
                     "avg_losses_across_data_parallel_group", "parse_bert_config",
                     "parse_gpt2_config", "parse_llama_config", "parse_t5_config",
                     "parse_glm4_moe_config")),
        (_TREE, ("TORCH_DISTRIBUTED_OPERATION_TYPES",
                 "TensorInformation", "find_batch_size", "get_data_structure", "honor_type",
                 "ignorant_find_batch_size", "initialize_tensors", "is_tensor_information",
                 "is_torch_tensor", "merge_dicts", "recursive_getattr", "slice_tensors")),
        (_LAUNCH, ("ComputeEnvironment", "PrepareForLaunch", "SageMakerDistributedType",
                   "TORCH_LAUNCH_PARAMS", "are_libraries_initialized", "check_cuda_p2p_ib_support",
                   "get_cpu_distributed_information", "get_gpu_info", "get_int_from_env",
                   "install_xla", "is_habana_gaudi1", "is_port_in_use", "parse_choice_from_env",
                   "parse_flag_from_env", "prepare_sagemager_args_inputs", "prepare_tpu",
                   "set_numa_affinity", "str_to_bool",
                   "get_free_port")),
        (_DS, ("DeepSpeedPlugin", "DeepSpeedSequenceParallelConfig", "GatheredParameters",
               "compile_regions_deepspeed", "deepspeed_required", "prepare_deepspeed_cmd_env")),
        (_PROFILE, ("MITA_PROFILING_AVAILABLE_PYTORCH_VERSION", "PROFILE_PATTERN_NAME",
                    "ProfileKwargs", "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION")),
        (_FILES, ("MODEL_NAME", "OPTIMIZER_NAME", "RNG_STATE_NAME", "SAFE_MODEL_NAME",
                  "SAFE_WEIGHTS_INDEX_NAME", "SAFE_WEIGHTS_NAME", "SAFE_WEIGHTS_PATTERN_NAME",
                  "SAMPLER_NAME", "SCALER_NAME", "SCHEDULER_NAME", "WEIGHTS_INDEX_NAME",
                  "WEIGHTS_NAME", "WEIGHTS_PATTERN_NAME", "load")),
        ('rng types are the strings "torch", "cuda", "xla", "generator"', ("RNGType",)),
        (_FSDP, ("TorchTensorParallelPlugin", "compile_regions_fsdp2",
                 "disable_fsdp_ram_efficient_loading", "enable_fsdp_ram_efficient_loading",
                 "fsdp2_apply_ac", "fsdp2_canonicalize_names", "fsdp2_load_full_state_dict",
                 "fsdp2_prepare_model", "fsdp2_switch_optimizer_parameters",
                 "get_fsdp2_grad_scaler", "load_fsdp_model",
                 "load_fsdp_optimizer", "merge_fsdp_weights", "model_has_dtensor",
                 "save_fsdp_model", "save_fsdp_optimizer")),
        (_INTERNAL, ("get_current_device_type", "get_pretty_name",
                     "is_peft_model", "BaseEnum", "EnumWithContains",
                     "get_module_class_from_name", "has_repeated_blocks", "is_repeated_blocks",
                     "is_numpy_available", "is_torch_distributed_available")),
        ("use `accelerator.autocast()` and `accelerator.scaler`",
         ("get_grad_scaler", "get_mixed_precision_context_manager")),
    ),
    "accel.state": _by_name(
        (_SHARED, ("SharedDict", "ThreadLocalSharedDict", "do_nothing")),
        ("use `PartialState().initialized` (always True: a state exists once its process is "
         "set up) or `torch.distributed.is_initialized()`", ("is_initialized",)),
    ),
    "accel.data_loader": _by_name(
        ("accel's prepared loader is one class, `DataLoaderShard` (the loader `prepare()` and "
         "`prepare_data_loader()` return); it is not built from adapters or mixins",
         ("DataLoaderAdapter", "DataLoaderStateMixin")),
        ("read the prepared loader's `batch_sampler` (a `BatchSamplerShard`) or `sampler`",
         ("get_sampler",)),
    ),
    "accel.utils.bnb": _by_name(
        (_FP8, ("load_and_quantize_model", "quantize_and_offload_8bit", "get_keys_to_not_convert",
                "has_4bit_bnb_layers", "replace_with_bnb_layers")),
    ),
    "accel.utils.modeling": _by_name(
        ("a step of Accelerate's own placement algorithm; accel.big_modeling places with its "
         "own (`infer_auto_device_map`, `get_balanced_memory`, `compute_module_sizes`)",
         ("check_device_same", "fallback_allocate", "get_module_leaves",
          "get_module_size_with_ties")),
        ("not provided yet: read an offloaded model's weights with "
         "`get_state_dict_offloaded_model` or `load_offloaded_weights`/`OffloadedWeightsLoader`",
         ("get_state_dict_from_offload",)),
    ),
    "accel.commands.estimate": _by_name((REFUSED_COMMANDS["estimate"], ("gather_data",))),
    "accel.commands.merge": _by_name((REFUSED_COMMANDS["merge"], ("merge_command",))),
    **dict.fromkeys(("accel.commands.config", "accel.commands.config.config_args"), _by_name(
        (REFUSED_COMMANDS["config"], ("config_command", "default_command_parser",
                                      "default_config_file")),
        ("accel does not submit Amazon SageMaker jobs; run `accel launch` inside the job with "
         "a LOCAL_MACHINE config (`ClusterConfig`)", ("SageMakerConfig",)))),
    "accel.checkpointing": _by_name(
        ("register the object with `accelerator.register_for_checkpointing(obj)`: "
         "`save_state()`/`load_state()` then save and restore it (as JSON, without pickle)",
         ("save_custom_state", "load_custom_state")),
    ),
    "accel.tracking": _by_name(
        ("pass tracker names or `GeneralTracker` instances in `Accelerator(log_with=...)`: "
         "accel checks them there", ("filter_trackers", "get_available_trackers")),
        ("accel keeps no process-wide tracker registry (`LOGGER_TYPE_TO_CLASS` is read-only): "
         "pass an instance of your `GeneralTracker` subclass in `Accelerator(log_with=[...])`",
         ("register_tracker_class",)),
    ),
}


class NotProvidedError(AttributeError):
    """An Accelerate name accel does not provide, read as an attribute; says why and what to use
    instead (an ``AttributeError``, so ``hasattr`` is False)."""


class NotSupportedError(NotImplementedError):
    """A refused Accelerate name was used (called or instantiated); says why and what to use
    instead."""


class _Refused(type):
    """The metaclass of :func:`stand_in` classes: every use raises with the reason."""

    _accel_message: str

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise NotSupportedError(cls._accel_message)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):  # protocols probe these: plain miss
            raise AttributeError(name)
        raise NotProvidedError(cls._accel_message, name=name)

    def __repr__(cls) -> str:
        return f"<{cls.__module__}.{cls.__qualname__}: not supported by accel>"


def stand_in(path: str, *, name: str, reason: str) -> type:
    """What ``path.name`` is when accel refuses it for ``reason`` (see the module docstring).

    Example:
        >>> Plugin = stand_in("accel.utils", name="DeepSpeedPlugin", reason="use DDP")
        >>> is_stand_in(Plugin), isinstance(object(), Plugin)
        (True, False)
        >>> Plugin.from_config
        Traceback (most recent call last):
        ...
        accel.compat.refusals.NotProvidedError: accel.utils.DeepSpeedPlugin is not supported: ...
    """
    message = f"{path}.{name} is not supported: {reason}"
    return _Refused(name, (), {"__module__": path, "__qualname__": name, "__doc__": message,
                               "_accel_message": message})


def is_stand_in(obj: object) -> bool:
    """Whether ``obj`` is a refused name's :func:`stand_in`."""
    return isinstance(obj, _Refused)


class NotProvidedImportError(ImportError):
    """An Accelerate name accel does not provide, imported with ``from path import name``; says
    why and what to use instead."""


def refused_reason(path: str, name: str) -> str | None:
    """Why ``path.name`` is not provided (and the alternative), or None when it is not refused.

    Example:
        >>> refused_reason("accel.utils.dataclasses", "DeepSpeedPlugin")
        'DeepSpeed is not supported (use DDP, the default)'
        >>> refused_reason("accel.utils", "gather") is None
        True
    """
    reason = REFUSED.get(path, {}).get(name)
    if reason is None and path.startswith("accel.utils."):
        reason = REFUSED["accel.utils"].get(name)
    return reason


def _asked_by_import() -> bool:
    """Whether the frame that asked for the attribute runs ``from module import name``.

    Frames of accel's shims and of this package (``__getattr__`` and the lookup) are skipped;
    the first other frame is the one that wants the name.
    """
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and (frame.f_code.co_name == "__getattr__"
                                 or frame.f_globals.get("__name__", "").startswith("accel.compat")):
        frame = frame.f_back
    if frame is None:
        return False
    code, at = frame.f_code.co_code, frame.f_lasti
    return 0 <= at < len(code) and code[at] == dis.opmap["IMPORT_FROM"]


def not_provided(name: str, message: str) -> AttributeError | ImportError:
    """The error to raise for a ``name`` accel does not provide where it was asked for:
    :class:`NotProvidedImportError` in ``from ... import name``, else :class:`NotProvidedError`
    (see the module docstring)."""
    if _asked_by_import():
        return NotProvidedImportError(message, name=name, path=None)
    return NotProvidedError(message, name=name)


def refusal(path: str, *, name: str, reason: str, where: str = "") -> AttributeError | ImportError:
    """The error to raise for ``path.name``, refused for ``reason``.

    ``where`` overrides how the name is shown (e.g. ``"Accelerator.profile"``).
    """
    return not_provided(name, f"{where or f'{path}.{name}'} is not supported: {reason}")
