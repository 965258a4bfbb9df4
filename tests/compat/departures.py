"""Why each test of Accelerate's suite that accel does not pass fails: a row of README's "What
differs" table (its first cell), matched by test id pattern (``fnmatch``).

``tests/compat/test_accelerate_suite.py`` checks that every known failure
(``accelerate_suite_known.json``) has exactly one reason here, that every reason is a row of the
table, and that no pattern is left without a failure to explain.
"""

from __future__ import annotations

import fnmatch

__all__ = ["DEPARTURES", "reasons"]

_STATE = "state singletons"
_ENV = "settings from the environment"
_NOTICES = "notices"
_INTERNALS = "Accelerate's internals"

#: test id pattern -> README "What differs" row
DEPARTURES: dict[str, str] = {
    "test_accelerator.py::AcceleratorTester::test_can_pickle_dataloader_*":
        "a pickled `Accelerator`",
    # test_script.main under debug_launcher: its test_reinstantiated_state
    "test_cpu.py::MultiCPUTester::test_cpu": "`AcceleratorState._reset_state()`",
    "test_data_loader.py::*::test_dataloader_inheritance": "prepared loaders and `DataLoader`",
    "test_data_loader.py::StatefulDataLoaderTester::test_*stateful_dataloader_adapter_equivalent_"
    "to_torchdata_stateful_dataloader_*": "a prepared loader's `state_dict()`",
    "test_grad_sync.py::SyncScheduler::test_gradient_sync_cpu_multi":
        "the last, short accumulation group",
    "test_accelerator.py::AcceleratorTester::test_*_state_after_reset":
        "`AcceleratorState._reset_state()`",
    "test_accelerator.py::AcceleratorTester::test_mutable_states": _STATE,
    "test_tracking.py::TrackerDeferredInitializationTest::*": _STATE,
    "test_data_loader.py::DataLoaderTester::test_ensure_dataloader_gets_cleaned_up": _STATE,
    "test_accelerator.py::AcceleratorTester::test_env_var_device": _ENV,
    "test_kwargs_handlers.py::KwargsHandlerTester::test_torch_dynamo_plugin": _ENV,
    "test_dataclasses.py::TestParallelismConfig::test_from_env*": _ENV,
    "test_dataclasses.py::TestParallelismConfig::test_cp_torch_handler": _ENV,
    "test_data_loader.py::DataLoaderTester::test_batch_sampler_shards_with_no_splits*":
        "`drop_last=True` with several processes",
    "test_data_loader.py::DataLoaderTester::test_batch_sampler_varying_batch_size_even_batches":
        "`drop_last=True` with several processes",
    "test_tracking.py::RegisterTrackerClassTest::*": "custom trackers",
    "test_modeling_utils.py::ModelingUtilsTester::test_load_checkpoint_in_model_unexpected_keys_*":
        _NOTICES,
    "test_utils.py::UtilsTester::test_convert_dict_to_env_variables": _NOTICES,
    "test_modeling_utils.py::ModelingUtilsTester::test_dtype_byte_size":
        "`dtype_byte_size(torch.bool)`",
    "test_modeling_utils.py::ModelingUtilsTester::test_get_module_size_with_ties": _INTERNALS,
    "test_modeling_utils.py::ModelingUtilsTester::test_set_module_tensor_checks_shape":
        _INTERNALS,
    # it patches accelerate.commands.env.which: Accelerate's module, not accel's
    "test_cli.py::EnvCommandTester::test_executable_not_found": _INTERNALS,
    "test_quantization.py::*": "bitsandbytes quantization",
    "test_sagemaker.py::*": "SageMaker",
}


def reasons(test_id: str) -> list[str]:
    """The "What differs" rows whose patterns match ``test_id`` (one, when all is well)."""
    return [topic for pattern, topic in DEPARTURES.items() if fnmatch.fnmatchcase(test_id, pattern)]
