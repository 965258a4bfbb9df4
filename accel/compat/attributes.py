"""Attributes of Accelerate's ``Accelerator`` that scripts read, as a mixin of the public class.

They report accel's configuration in Accelerate's terms: the data-loader settings, the project
directories, and the parallelism queries of the features accel does not have (DeepSpeed,
tensor/context/pipeline parallelism), which answer what Accelerate answers when those features
are off. Nothing here changes how accel runs.

Example:
    >>> from accel import Accelerator
    >>> accelerator = Accelerator(cpu=True)
    >>> accelerator.even_batches, accelerator.split_batches, accelerator.data_parallel_rank
    (True, False, 0)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torch import nn

from ..run.connector import Options, Runtime
from ..run.state import RunState
from .state import AcceleratorState

__all__ = ["AccelerateAttributes"]


class AccelerateAttributes:
    """Accelerate's read-only ``Accelerator`` attributes that have an answer in accel."""

    _rt: Runtime
    _options: Options
    _run: RunState

    if TYPE_CHECKING:  # the Accelerator's (this is a mixin of accel.compat.accelerator)
        @property
        def state(self) -> AcceleratorState: ...

    # -- what was prepared (Accelerate's lists, as read-only snapshots) --------------------------
    # Scripts and libraries written for Accelerate read these; ``free_memory()`` empties them.
    @property
    def _models(self) -> tuple[nn.Module, ...]:
        return tuple(self._run.models)

    @property
    def _optimizers(self) -> tuple[Any, ...]:
        return tuple(self._run.optimizers)

    @property
    def _schedulers(self) -> tuple[Any, ...]:
        return tuple(self._run.schedulers)

    @property
    def _dataloaders(self) -> tuple[Any, ...]:
        return tuple(self._run.dataloaders)

    # -- data-loader settings (DataLoaderConfiguration) -------------------------------------------
    @property
    def split_batches(self) -> bool:
        return self._options.dataloader_config.split_batches

    @property
    def even_batches(self) -> bool:
        return self._options.dataloader_config.even_batches

    @property
    def dispatch_batches(self) -> bool:
        """True when rank 0 reads the data and sends each rank its batches
        (``DataLoaderConfiguration(dispatch_batches=True)``); else every rank reads its own."""
        return bool(self._options.dataloader_config.dispatch_batches)

    @property
    def use_seedable_sampler(self) -> bool:
        return self._options.dataloader_config.use_seedable_sampler

    @property
    def use_stateful_dataloader(self) -> bool:
        return self._options.dataloader_config.use_stateful_dataloader

    @property
    def non_blocking(self) -> bool:
        return self._options.dataloader_config.non_blocking

    # -- project directories (ProjectConfiguration) ---------------------------------------------
    @property
    def project_dir(self) -> str | None:
        return self._options.project.project_dir

    @property
    def logging_dir(self) -> str | None:
        return self._options.project.logging_dir

    @property
    def save_iteration(self) -> int:
        """The number the next automatically named checkpoint gets (``checkpoint_<n>``)."""
        return self._options.project.iteration

    # -- parallelism queries: data parallelism, replicated (DDP) or sharded (FSDP) --------------
    @property
    def multi_device(self) -> bool:
        """More than one process in the job (Accelerate: a multi-device distributed type)."""
        return self._rt.context.world_size > 1

    @property
    def should_save_model(self) -> bool:
        """True: with data parallelism every rank holds the whole model."""
        return True

    @property
    def data_parallel_rank(self) -> int:
        return self._rt.context.rank

    @property
    def data_parallel_shard_rank(self) -> int:
        """This rank's place among the ranks that shard the model (FSDP), else 0."""
        mesh = self.state.device_mesh if self.state.is_fsdp2 else None
        if mesh is None:
            return 0
        return int(mesh.get_local_rank(mesh.ndim - 1))

    @property
    def tensor_parallel_rank(self) -> int:
        return 0

    @property
    def context_parallel_rank(self) -> int:
        return 0

    @property
    def pipeline_parallel_rank(self) -> int:
        return 0

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        return False

    # The integrations accel does not offer answer through the state, where they are declared.
    @property
    def is_fsdp2(self) -> bool:
        return self.state.is_fsdp2

    @property
    def deepspeed_plugin(self) -> None:
        return self.state.deepspeed_plugin

    @property
    def parallelism_config(self) -> Any:
        """The ``ParallelismConfig`` of an FSDP run (the device mesh's shape), else None."""
        return self.state.parallelism_config

    @property
    def torch_device_mesh(self) -> Any:
        """The FSDP run's ``DeviceMesh``, else None."""
        return self.state.device_mesh

    @property
    def fp8_backend(self) -> None:
        """None: fp8 training is not supported."""
        return None

    @contextlib.contextmanager
    def maybe_context_parallel(self, buffers: Any = None, buffer_seq_dims: Any = None,
                               no_restore_buffers: Any = None) -> Iterator[None]:
        """A no-op, as in Accelerate without context parallelism."""
        yield

    def verify_device_map(self, model: nn.Module) -> bool:
        """True when ``model`` was dispatched over several devices by a ``device_map`` (such a
        model cannot be trained with data parallelism), as Accelerate checks."""
        for module in model.modules():
            device_map = getattr(module, "hf_device_map", None)
            if isinstance(device_map, dict) and len(device_map) > 1:
                return True
        return False
