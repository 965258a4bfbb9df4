"""Accelerate's ``DistributedType``, derived at the boundary from what the engine chose.

The engine knows strategies (``"single"``, ``"ddp"``, ``"fsdp"``, ``"xla"``) and device kinds;
Accelerate's scripts compare ``accelerator.distributed_type`` against its enum. The mapping
between the two lives here, and nowhere below.

Example:
    >>> import torch
    >>> from accel.distributed import ProcessContext
    >>> from accel.strategy import select_strategy
    >>> ctx = ProcessContext.single()
    >>> distributed_type_of(select_strategy(ctx))
    <DistributedType.NO: 'NO'>
"""

from __future__ import annotations

import enum

from ..strategy import Strategy

__all__ = ["DistributedType", "distributed_type_of"]


class DistributedType(str, enum.Enum):
    """How the job is distributed; members and values are Accelerate's, so comparisons carry over.

    accel produces ``NO`` (one process), ``MULTI_CPU`` and ``MULTI_GPU`` (DDP over gloo or
    nccl), ``FSDP`` (FSDP2) and ``XLA`` (torch_xla, one process or many, as Accelerate reports
    it). The other members exist so that scripts written for Accelerate keep working: accel
    never produces ``MULTI_NPU``, ``MULTI_MLU``, ``MULTI_SDAA``, ``MULTI_MUSA``, ``MULTI_XPU``,
    ``MULTI_HPU``, ``MULTI_NEURON``, ``DEEPSPEED`` or ``MEGATRON_LM``, so a branch on one of
    them is simply not taken. ``MULTI_XLA`` is accel's older name for ``XLA`` (an alias, same
    member).

    Example:
        >>> DistributedType.DEEPSPEED == "DEEPSPEED", DistributedType.NO == DistributedType.FSDP
        (True, False)
        >>> DistributedType.MULTI_XLA is DistributedType.XLA
        True
    """

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"
    MULTI_XLA = "XLA"  # alias of XLA: Accelerate reports every torch_xla job as XLA


#: strategy name -> Accelerate's type, whatever the device
_BY_STRATEGY = {"single": DistributedType.NO, "fsdp": DistributedType.FSDP,
                "xla": DistributedType.XLA}
#: DDP's type by device kind (Accelerate names DDP after the device; gloo on CPU otherwise)
_DDP_BY_DEVICE = {"cuda": DistributedType.MULTI_GPU}


def distributed_type_of(strategy: Strategy) -> DistributedType:
    """Accelerate's name for the job ``strategy`` runs (``accelerator.distributed_type``).

    Raises:
        ValueError: a strategy this mapping does not know (add it to the tables above).
    """
    if strategy.name == "ddp":
        return _DDP_BY_DEVICE.get(strategy.ctx.device.type, DistributedType.MULTI_CPU)
    found = _BY_STRATEGY.get(strategy.name)
    if found is None:
        raise ValueError(f"strategy {strategy.name!r} has no Accelerate DistributedType; add it "
                         "to accel/compat/distributed_type.py")
    return found
