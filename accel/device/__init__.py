"""Device detection: the one place with the detection order.

Order when nothing is chosen explicitly: XLA (only when ``PJRT_DEVICE`` is set and torch_xla is
installed), CUDA (NVML check, CUDA is not initialised), MPS, CPU. An explicit choice
(``cpu=True``, ``device=...``, or ``ACCEL_DEVICE``) wins.

Example:
    >>> select_device(cpu=True).kind
    'cpu'
"""

from __future__ import annotations

from .._base.warn import warn_user
from ..env import EnvSettings
from .base import Device
from .cpu import CPUDevice
from .cuda import CUDADevice
from .mps import MPSDevice
from .xla import XLADevice

__all__ = ["DEVICE_KINDS", "Device", "select_device"]

DEVICE_KINDS: dict[str, type[Device]] = {
    "cpu": CPUDevice,
    "cuda": CUDADevice,
    "xla": XLADevice,
    "mps": MPSDevice,
}
_AUTO_ORDER = ("xla", "cuda", "mps", "cpu")


def _resolve(name: str, source: str) -> type[Device]:
    """The device class for ``name`` ("cuda:1" and "gpu" mean cuda), without checking it."""
    if not isinstance(name, str):
        raise TypeError(f"{source} must be a string such as 'cpu' or 'cuda', got {name!r}")
    key = name.strip().lower().split(":")[0]
    if key == "gpu":
        key = "cuda"
    if key not in DEVICE_KINDS:
        raise ValueError(f"{source}={name!r} is not a device kind; expected one of "
                         f"{', '.join(DEVICE_KINDS)}")
    return DEVICE_KINDS[key]


def _kind(name: str, source: str) -> type[Device]:
    cls = _resolve(name, source)
    if not cls.available():
        hint = {
            "cuda": "no NVIDIA GPU is visible (check the driver and CUDA_VISIBLE_DEVICES)",
            "xla": "set PJRT_DEVICE (e.g. TPU or CPU) and install torch_xla",
            "mps": "MPS needs an Apple-silicon Mac with a recent PyTorch",
        }.get(cls.kind, "")
        raise RuntimeError(f"{source}={name!r} was requested but is not available: {hint}")
    return cls


def select_device(
    device: str | None = None, *, cpu: bool = False, settings: EnvSettings | None = None
) -> Device:
    """Pick the device kind for this process.

    Args:
        device: explicit kind ("cpu", "cuda", "xla", "mps"), e.g. from ``Accelerator(device=)``.
        cpu: force the CPU (``Accelerator(cpu=True)``).
        settings: ``ACCEL_*`` settings; ``settings.device`` applies when nothing explicit is set.

    Raises:
        ValueError: conflicting or unknown choices. RuntimeError: chosen kind unavailable.
    """
    env_choice = settings.device if settings is not None else None
    # Conflicts are checked before availability: the user's mistake is the useful message.
    if cpu and device is not None and _resolve(device, "device").kind != "cpu":
        raise ValueError(f"cpu=True conflicts with device={device!r}; pass only one of them")
    explicit = "cpu" if cpu else device
    if explicit is not None:
        chosen = _kind(explicit, "device")
        # ACCEL_DEVICE is overridden here, so it need not be available (e.g. cpu=True while
        # `accel launch` exported ACCEL_DEVICE=cuda on a machine without a GPU).
        if env_choice is not None and _resolve(env_choice, "ACCEL_DEVICE").kind != chosen.kind:
            warn_user(
                f"Accelerator(device/cpu) asks for {chosen.kind!r} but ACCEL_DEVICE (set by "
                f"`accel launch`) is {env_choice!r}; using {chosen.kind!r} from the constructor",
            )
        return chosen()
    if env_choice is not None:
        return _kind(env_choice, "ACCEL_DEVICE")()
    for key in _AUTO_ORDER:
        if DEVICE_KINDS[key].available():
            return DEVICE_KINDS[key]()
    return CPUDevice()
