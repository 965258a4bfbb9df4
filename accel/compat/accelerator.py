"""The public ``Accelerator``: the engine's facade plus what only Accelerate has.

:class:`accel.accelerator.facade.Accelerator` is the engine's API (prepare, backward,
accumulate, collectives, checkpoints, ...). This subclass adds Accelerate's members:

- ``state`` (an ``AcceleratorState`` view of the runtime), ``gradient_state`` (a
  ``GradientState`` view of the run state) and ``distributed_type`` (derived from the strategy;
  a script may set ``accelerator.state.distributed_type``, as Accelerate's own tests do, and
  ``join_uneven_inputs`` then answers for that type);
- Accelerate's read-only attributes (:class:`~accel.compat.attributes.AccelerateAttributes`),
  among them ``_models``/``_optimizers``/``_schedulers``/``_dataloaders`` (snapshots of what
  was prepared), and the ``_is_accelerate_prepared = True`` mark ``prepare()`` leaves on what
  it prepared;
- the refusals: an Accelerate argument accel does not take raises a ``TypeError`` saying what to
  do instead, and an Accelerate attribute accel does not have raises
  :class:`~accel.compat.refusals.NotProvidedError` with the reason.

Example:
    >>> from accel import Accelerator
    >>> accelerator = Accelerator(cpu=True)
    >>> accelerator.distributed_type.value, accelerator.state.num_processes
    ('NO', 1)
    >>> Accelerator(cpu=True, even_batches=False)
    Traceback (most recent call last):
    ...
    TypeError: Accelerator() got an unsupported argument 'even_batches': pass dataloader_config=...
"""

from __future__ import annotations

import contextlib
import inspect
from typing import TYPE_CHECKING, Any

from .._base.warn import warn_user
from ..accelerator import facade as _facade
from ..config import DataLoaderConfiguration
from ..strategy import no_join
from .attributes import AccelerateAttributes
from .distributed_type import DistributedType, distributed_type_of
from .refusals import LEGACY_ARGUMENTS, UNSUPPORTED_ARGUMENTS, refusal, refused_reason
from .state import AcceleratorState, GradientState, bind_accelerator_state, bind_gradient_state

__all__ = ["Accelerator"]

#: the engine's constructor parameters (every other keyword is refused with a reason)
_ACCEPTED = frozenset(inspect.signature(_facade.Accelerator.__init__).parameters) - {"self"}


def refuse_arguments(given: dict[str, Any]) -> None:
    """Raise for the first keyword ``Accelerator(...)`` does not take, saying what to do instead.

    Raises:
        TypeError: an argument of Accelerate's that accel does not take, or no argument at all.
    """
    for name in given:
        if name not in _ACCEPTED and name not in LEGACY_ARGUMENTS:
            hint = UNSUPPORTED_ARGUMENTS.get(name, "it is not an Accelerator argument")
            raise TypeError(f"Accelerator() got an unsupported argument {name!r}: {hint}")


def legacy_arguments(given: dict[str, Any]) -> dict[str, Any]:
    """``given`` with Accelerate's older arguments moved where the engine takes them.

    ``split_batches=`` (Accelerate 1.x still accepts it, and ignores it) is honoured: it becomes
    ``dataloader_config=DataLoaderConfiguration(split_batches=...)``, with a ``FutureWarning``.

    Raises:
        ValueError: ``split_batches`` disagrees with the ``dataloader_config`` also given.
    """
    if "split_batches" not in given:
        return given
    kwargs = dict(given)
    split = bool(kwargs.pop("split_batches"))
    config = kwargs.get("dataloader_config")
    if config is None:
        kwargs["dataloader_config"] = DataLoaderConfiguration(split_batches=split)
    elif bool(config.split_batches) != split:
        raise ValueError(f"Accelerator(split_batches={split}) disagrees with dataloader_config="
                         f"DataLoaderConfiguration(split_batches={config.split_batches}); "
                         "pass it in the dataloader_config only")
    warn_user("Accelerator(split_batches=...) is deprecated (as in Accelerate); pass "
              f"dataloader_config=DataLoaderConfiguration(split_batches={split}) instead",
              category=FutureWarning)
    return kwargs


class Accelerator(AccelerateAttributes, _facade.Accelerator):
    """Run one training loop on CPU, CUDA or XLA, in one process or many.

    The engine's :class:`accel.accelerator.facade.Accelerator` (see there for the arguments),
    with Accelerate's ``state``, ``gradient_state``, ``distributed_type`` and read-only
    attributes, and Accelerate's arguments that accel does not take refused with the fix.
    """

    # Type checkers see the engine's signature (a refused argument is a type error there) and
    # no __getattr__ (a misspelt attribute stays a type error).
    if not TYPE_CHECKING:

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            refuse_arguments(kwargs)
            super().__init__(*args, **legacy_arguments(kwargs))

        __init__.__wrapped__ = _facade.Accelerator.__init__  # inspect.signature: the engine's

        def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
            out = super().prepare(*args, device_placement=device_placement)
            self._mark_prepared(out if len(args) != 1 else (out,))
            return out

        prepare.__doc__ = _facade.Accelerator.prepare.__doc__

        def prepare_model(self, model: Any, device_placement: bool | None = None,
                          evaluation_mode: bool = False) -> Any:
            wrapped = super().prepare_model(model, device_placement, evaluation_mode)
            self._mark_prepared((wrapped,))
            return wrapped

        prepare_model.__doc__ = _facade.Accelerator.prepare_model.__doc__

        def prepare_data_loader(self, data_loader: Any, device_placement: bool | None = None
                                ) -> Any:
            loader = super().prepare_data_loader(data_loader, device_placement)
            self._mark_prepared((loader,))
            return loader

        prepare_data_loader.__doc__ = _facade.Accelerator.prepare_data_loader.__doc__

        def __getattr__(self, name: str) -> Any:
            # Only called for names the object does not have: Accelerate's that accel refuses
            # say why; any other name is the usual AttributeError.
            reason = refused_reason("accel.Accelerator", name)
            if reason is not None:
                raise refusal("accel.Accelerator", name=name, reason=reason,
                              where=f"Accelerator.{name}")
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _mark_prepared(self, objects: tuple[Any, ...]) -> None:
        """Set Accelerate's ``_is_accelerate_prepared = True`` on each object this Accelerator
        prepared (libraries written for Accelerate test it); objects passed through unchanged
        are left alone."""
        prepared = {id(obj) for obj in self._models + self._optimizers + self._schedulers
                    + self._dataloaders}
        for obj in objects:
            if id(obj) in prepared:
                obj._is_accelerate_prepared = True

    @property
    def state(self) -> AcceleratorState:
        """This Accelerator's process and settings, as Accelerate's ``AcceleratorState``."""
        state: AcceleratorState | None = self.__dict__.get("_state")
        if state is None:  # bound on first use, then kept (a script may set its fields)
            state = self.__dict__["_state"] = bind_accelerator_state(
                self._rt, self._options.dynamo_plugin, distributed_type_of(self._rt.strategy))
        return state

    @property
    def gradient_state(self) -> GradientState:
        """This Accelerator's accumulation and loader state (``GradientState``), live."""
        state: GradientState | None = self.__dict__.get("_gradient_state")
        if state is None:
            state = self.__dict__["_gradient_state"] = bind_gradient_state(self._run)
        return state

    @property
    def distributed_type(self) -> DistributedType:
        """Accelerate's name for the job (``NO``, ``MULTI_CPU``, ``MULTI_GPU``, ``FSDP``,
        ``XLA``); ``accelerator.state.distributed_type = ...`` changes what is reported."""
        return self.state.distributed_type

    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None
                           ) -> contextlib.AbstractContextManager[Any]:
        """As the engine's; when a script set ``state.distributed_type`` to another type (as
        Accelerate's tests do), it answers for that type: Accelerate's warning, and the block
        runs unchanged."""
        if self.distributed_type is not distributed_type_of(self._rt.strategy):
            return no_join(self.distributed_type.value)
        return self._step.join_uneven_inputs(joinables, even_batches=even_batches,
                                             default_even=self.dataloader_config.even_batches)
