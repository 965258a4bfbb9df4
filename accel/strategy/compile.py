"""``torch.compile`` for prepared models, under Hugging Face Accelerate's names.

``TorchDynamoPlugin`` holds the settings (fields left unset come from the ``ACCEL_DYNAMO_*``
variables that ``accel launch --dynamo_backend ...`` exports, as Accelerate's come from
``ACCELERATE_DYNAMO_*``); ``prepare()`` compiles each model with them once it is wrapped, or,
with ``use_regional_compilation=True``, compiles each block of a repeated ``nn.ModuleList``
(``compile_regions``), so that a stack of identical blocks is compiled once.

A compiled model keeps the user's module inside it (``_orig_mod``): state dicts, checkpoints and
``unwrap_model`` see through it, so saved parameter names never carry ``_orig_mod.``.

Example:
    >>> plugin = TorchDynamoPlugin(backend="inductor", mode="max-autotune")
    >>> plugin.backend, plugin.to_kwargs()
    (<DynamoBackend.INDUCTOR: 'INDUCTOR'>, {'backend': 'inductor', 'mode': 'max-autotune'})
    >>> TorchDynamoPlugin(backend="no").compiles
    False
"""

from __future__ import annotations

import copy
import enum
import sys
import types
from dataclasses import dataclass, fields
from typing import Any, cast

import torch
from torch import nn

from .. import env
from .._base.parse import parse_choice
from ..config.settings import KwargsHandler

__all__ = [
    "DynamoBackend",
    "TorchDynamoPlugin",
    "compile_model",
    "compile_regions",
    "compiled_inner",
    "compiles_inside_wrapper",
    "has_compiled_regions",
    "has_repeated_blocks",
    "is_compiled_module",
    "is_repeated_blocks",
    "rewrap_compiled",
]


class DynamoBackend(str, enum.Enum):
    """A ``torch.compile`` backend; members and values are Accelerate's (``NO``: do not compile).

    ``TorchDynamoPlugin(backend=...)`` takes a member or its name in any case. Torch itself
    registers ``eager``, ``aot_eager``, ``inductor`` and ``cudagraphs`` (and ``tvm`` when its
    package is installed); the others need the package that registers them, or are names of
    older torch versions.

    Example:
        >>> DynamoBackend("INDUCTOR") is DynamoBackend.INDUCTOR
        True
    """

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


#: Backends that take no ``mode`` or ``options`` (torch would ignore them with a log line).
_PLAIN_BACKENDS = (DynamoBackend.EAGER, DynamoBackend.AOT_EAGER, DynamoBackend.CUDAGRAPHS)


def _backend(value: Any, source: str) -> DynamoBackend:
    if isinstance(value, DynamoBackend):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{source} must be a DynamoBackend or its name, got {value!r}")
    try:
        name = parse_choice(value, name=source, choices=env.DYNAMO_BACKENDS,
                            what="a dynamo backend")
    except ValueError as exc:
        raise ValueError(f"{exc}; pass backend='inductor' to compile with torch's default "
                         "compiler, or 'no' not to compile") from None
    return DynamoBackend(name.upper())


def _flag(value: Any, *, source: str, optional: bool = False) -> bool | None:
    if isinstance(value, bool) or (optional and value is None):
        return value
    allowed = "True, False or None" if optional else "True or False"
    raise TypeError(f"{source} must be {allowed}, got {value!r}")


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    """How ``prepare()`` compiles models with ``torch.compile`` (Accelerate's plugin).

    Fields left as None take the value that ``accel launch`` passed (``ACCEL_DYNAMO_BACKEND``,
    ``ACCEL_DYNAMO_MODE``, ``ACCEL_DYNAMO_USE_FULLGRAPH``, ``ACCEL_DYNAMO_USE_DYNAMIC``,
    ``ACCEL_DYNAMO_USE_REGIONAL_COMPILATION``), else Accelerate's default: backend ``"no"``,
    mode ``"default"``, fullgraph and regional compilation off, ``dynamic`` torch's default.

    Args:
        backend: a :class:`DynamoBackend` or its name, any case; ``"no"`` does not compile.
        mode: ``"default"``, ``"reduce-overhead"``, ``"max-autotune"`` or
            ``"max-autotune-no-cudagraphs"`` (inductor, and backends of other packages, only).
        fullgraph: compile the whole forward as one graph (a graph break is an error).
        dynamic: trace with dynamic shapes (True), never (False), or torch's default (None).
        options: a dict for the backend (inductor config); not together with a ``mode``.
        disable: make ``torch.compile`` a no-op (the model is wrapped but runs eagerly).
        use_regional_compilation: compile each block of repeated ``nn.ModuleList`` blocks
            separately (one compilation serves all blocks of a class) and the rest whole.

    Raises:
        ValueError: an unknown backend or mode, or a ``mode``/``options`` with a backend that
            takes none; the message names the accepted values.

    Example:
        >>> TorchDynamoPlugin(backend="INDUCTOR", use_regional_compilation=True).to_dict()[
        ...     "backend"]
        'inductor'
    """

    backend: DynamoBackend | str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        settings = env.read_settings()
        sources = {name: f"TorchDynamoPlugin({name}=...)" for name in
                   ("backend", "mode", "fullgraph", "dynamic", "use_regional_compilation")}
        if self.backend is None:
            self.backend = settings.dynamo_backend or "no"
            sources["backend"] = "ACCEL_DYNAMO_BACKEND"
        if self.mode is None:
            self.mode = settings.dynamo_mode or "default"
            sources["mode"] = "ACCEL_DYNAMO_MODE"
        if self.fullgraph is None:
            self.fullgraph = settings.dynamo_use_fullgraph
        if self.dynamic is None:
            self.dynamic = settings.dynamo_use_dynamic
        if self.use_regional_compilation is None:
            self.use_regional_compilation = settings.dynamo_use_regional_compilation
        self.backend = _backend(self.backend, sources["backend"])
        self.mode = parse_choice(self.mode, name=sources["mode"], choices=env.DYNAMO_MODES,
                                 what="a torch.compile mode")
        self.fullgraph = _flag(self.fullgraph, source=sources["fullgraph"])
        self.dynamic = _flag(self.dynamic, source=sources["dynamic"], optional=True)
        self.disable = bool(_flag(self.disable, source="TorchDynamoPlugin(disable=...)"))
        self.use_regional_compilation = _flag(self.use_regional_compilation,
                                              source=sources["use_regional_compilation"])
        if self.options is not None and not isinstance(self.options, dict):
            raise TypeError("TorchDynamoPlugin(options=...) must be a dict of backend options "
                            f"(e.g. inductor config), got {type(self.options).__name__}")
        self._check_combination(sources)

    def _check_combination(self, sources: dict[str, str]) -> None:
        mode = self.mode if self.mode != "default" else None
        if mode is not None and self.options is not None:
            raise ValueError(f"mode={mode!r} ({sources['mode']}) and options=... cannot be used "
                             "together (torch.compile takes one of them); drop one")
        if self.backend in _PLAIN_BACKENDS and (mode is not None or self.options is not None):
            what = f"mode={mode!r} ({sources['mode']})" if mode else "options=..."
            name = cast(DynamoBackend, self.backend).value.lower()
            raise ValueError(f"{what} needs a compiling backend, but the {name!r} backend takes "
                             "none (torch would ignore it); use backend='inductor', or drop it")

    @property
    def compiles(self) -> bool:
        """Whether ``prepare()`` compiles models (the backend is not ``"no"``)."""
        return self.backend is not DynamoBackend.NO

    def to_dict(self) -> dict[str, Any]:
        """The fields, with the backend as its lower-case name (Accelerate's ``to_dict``)."""
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}
        out["backend"] = _backend(self.backend, "backend").value.lower()
        return out

    def to_kwargs(self) -> dict[str, Any]:
        """The ``torch.compile`` keyword arguments that differ from its defaults.

        ``use_regional_compilation`` is not one (it picks what ``prepare()`` compiles), and
        ``backend`` is left out when it is ``"no"``, as in Accelerate.
        """
        out = self.to_dict()
        defaults = {"backend": "no", "mode": "default", "fullgraph": False, "dynamic": None,
                    "options": None, "disable": False}
        return {name: out[name] for name, default in defaults.items() if out[name] != default}


# -- what a compiled module looks like -----------------------------------------------------------
def is_compiled_module(module: Any) -> bool:
    """True when ``module`` is what ``torch.compile(model)`` returned.

    Example:
        >>> is_compiled_module(torch.nn.Linear(1, 1))
        False
    """
    if "torch._dynamo" not in sys.modules:  # nothing can be compiled before dynamo is imported
        return False
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(module, OptimizedModule)


def compiled_inner(module: nn.Module) -> nn.Module | None:
    """The module a compile wrapper holds: ``torch.compile``'s ``_orig_mod``, or the original of
    a ``compile_regions`` copy; None when ``module`` is neither.

    Example:
        >>> compiled_inner(torch.nn.Linear(1, 1)) is None
        True
    """
    inner = module._modules.get("_orig_mod")  # torch.compile registers it as a submodule
    if inner is None:
        inner = vars(module).get("_orig_mod")  # compile_regions keeps it out of state dicts
    return inner if isinstance(inner, nn.Module) else None


def is_repeated_blocks(module: nn.Module) -> bool:
    """True for a non-empty ``nn.ModuleList`` whose children are all of the first one's class."""
    return isinstance(module, nn.ModuleList) and len(module) > 0 and all(
        isinstance(m, type(module[0])) for m in module)


def has_repeated_blocks(module: nn.Module) -> bool:
    """True when ``module`` or a submodule is a list of repeated blocks."""
    return any(is_repeated_blocks(m) for m in module.modules())


def has_compiled_regions(module: nn.Module) -> bool:
    """True when a submodule of ``module`` (or ``module`` itself) was compiled.

    Example:
        >>> has_compiled_regions(torch.nn.Sequential(torch.nn.Linear(1, 1)))
        False
    """
    return any(is_compiled_module(m) for m in module.modules())


# -- compiling -------------------------------------------------------------------------------------
def compile_regions(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Compile each block of repeated ``nn.ModuleList`` blocks in ``module`` separately.

    Blocks of one class share one compilation (dynamo's cache), so a stack of N identical
    transformer blocks costs one block's compile, not a whole model's. Modules outside such
    lists run eagerly; a module with no repeated blocks is compiled whole.

    ``module`` is not changed: the result is a shallow copy of it whose containers on the way
    to the blocks are copies too, with the same parameters and buffers (training the result
    trains ``module``); ``result._orig_mod`` is ``module``, which ``unwrap_model`` returns.

    Args:
        module: the model.
        **compile_kwargs: ``torch.compile``'s keyword arguments (e.g. ``backend="inductor"``).

    Example:
        >>> blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])
        >>> model = torch.nn.Sequential(blocks, torch.nn.Linear(2, 1))
        >>> compiled = compile_regions(model, backend="eager")
        >>> is_compiled_module(compiled[0][1]), compiled[1] is model[1], compiled._orig_mod is model
        (True, True, True)
    """
    if not has_repeated_blocks(module):
        return cast(nn.Module, torch.compile(module, **compile_kwargs))
    copied = _copy_regions(module, compile_kwargs)
    vars(copied)["_orig_mod"] = module  # not a submodule: state dicts keep the plain names
    return copied


def _copy_regions(module: nn.Module, compile_kwargs: dict[str, Any]) -> nn.Module:
    if is_repeated_blocks(module):
        blocks = cast(nn.ModuleList, module)
        return nn.ModuleList(cast(nn.Module, torch.compile(block, **compile_kwargs))
                             for block in blocks)
    if not has_repeated_blocks(module):
        return module  # shared as is: nothing inside it is compiled
    new = type(module).__new__(type(module))
    vars(new).update(vars(module))  # same parameter and buffer dicts: the same tensors
    for name, value in vars(module).items():  # methods bound to the original: bind to the copy
        if isinstance(value, types.MethodType) and value.__self__ is module:
            vars(new)[name] = types.MethodType(value.__func__, new)
    new._modules = {name: _copy_regions(child, compile_kwargs) if child is not None else None
                    for name, child in module._modules.items()}
    return new


def _check_registered(backend: str) -> None:
    """Fail before compiling when torch has no such backend, naming the ones it has."""
    from torch._dynamo import list_backends

    known = list_backends(exclude_tags=())
    if backend not in known:
        raise ValueError(
            f"dynamo backend {backend!r} is not registered with torch {torch.__version__} "
            f"(registered: {', '.join(sorted(known))}); install and import the package that "
            "provides it, or pick another backend, e.g. dynamo_backend='inductor'")


def compiles_inside_wrapper(module: nn.Module) -> bool:
    """Whether ``torch.compile(DDP(module))`` compiles ``module``'s forward.

    Dynamo stops tracing at DDP's forward and starts again at the frame of the module it calls,
    but never starts a frame in torch's own code: a module whose forward is torch's
    (``nn.Sequential``, ``nn.Linear``) is then not compiled at all. Such a module must be
    compiled itself, before it is wrapped (``DDP(torch.compile(module))``).

    Example:
        >>> compiles_inside_wrapper(torch.nn.Sequential(torch.nn.Linear(1, 1)))
        False
    """
    from torch._dynamo import trace_rules

    return not trace_rules.check(module.forward)


def compile_model(model: nn.Module, plugin: TorchDynamoPlugin) -> nn.Module:
    """``model`` compiled as ``plugin`` says: whole, or its regions (``compile_regions``).

    Args:
        model: what to compile: the wrapped model (``torch.compile(DDP(module))``, as
            Accelerate), or the placed user's module before it is wrapped (regional
            compilation, and modules that ``compiles_inside_wrapper`` says need it).
        plugin: the settings; a plugin with backend ``"no"`` returns ``model`` unchanged.

    Raises:
        ValueError: the backend is not registered with this torch (the message lists those
            that are).
    """
    if not plugin.compiles:
        return model
    kwargs = plugin.to_kwargs()
    _check_registered(kwargs["backend"])
    if plugin.use_regional_compilation:
        return compile_regions(model, **kwargs)
    return cast(nn.Module, torch.compile(model, **kwargs))


def rewrap_compiled(compiled: nn.Module, inner: nn.Module) -> nn.Module | None:
    """A compile wrapper around ``inner`` like ``compiled`` (for ``keep_torch_compile``).

    ``compiled`` itself when it wraps ``inner`` directly; when it wraps a wrapper of ``inner``
    (``torch.compile(DDP(model))``) a new ``torch.compile`` wrapper of ``inner`` with the same
    settings, leaving the one being trained untouched (Accelerate re-points it instead, which
    takes DDP out of the training model). None when neither is possible.
    """
    if compiled_inner(compiled) is inner:
        return compiled
    if is_compiled_module(compiled):
        return type(compiled)(inner, compiled.dynamo_ctx)  # the same settings, around inner
    return None
