"""Model structure for big models: tied weights, module order, sizes (Accelerate's
``retie_parameters``, ``check_tied_parameters_*``, ``ensure_weights_retied``,
``get_module_children_bottom_up`` and ``calculate_maximum_sizes``).

Example:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    >>> [name for name, _ in get_module_children_bottom_up(model, return_fqns=True)]
    ['0', '1', '']
    >>> calculate_maximum_sizes(model)
    (48, (24, ['0', '1']))
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .._base.warn import warn_user
from .placement import compute_module_sizes, get_max_layer_size

__all__ = ["calculate_maximum_sizes", "check_tied_parameters_in_config",
           "check_tied_parameters_on_same_device", "compute_module_total_buffer_size",
           "ensure_weights_retied", "get_module_children_bottom_up",
           "get_non_persistent_buffers", "retie_parameters"]


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    module_name, _, leaf = name.rpartition(".")
    return model.get_submodule(module_name), leaf


def retie_parameters(model: nn.Module, tied_params: Sequence[Sequence[str]]) -> None:
    """Tie again the groups of ``tied_params`` (as :func:`find_tied_parameters` gives them) whose
    link was broken: every name of a group gets the group's first parameter that is not on the
    ``meta`` device (a group that is all on ``meta`` is left alone)."""
    for group in tied_params:
        params = [getattr(*_owner(model, name)) for name in group]
        keep = next((p for p in params if not p.is_meta), None)
        if keep is None:
            continue
        for name in group:
            setattr(*_owner(model, name), keep)


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """Whether a transformers model's config asks for tied weights (tied word embeddings with an
    output embedding, a tied encoder and decoder, or a module with ``_tie_weights``). Any other
    model: False."""
    if "PreTrainedModel" not in [cls.__name__ for cls in inspect.getmro(type(model))]:
        return False
    config = getattr(model, "config", None)
    text_config = getattr(config, "get_text_config", None)
    decoder = text_config(decoder=True) if callable(text_config) else config
    get_output = getattr(model, "get_output_embeddings", lambda: None)
    embeddings = decoder is not None and bool(getattr(decoder, "tie_word_embeddings", False)) \
        and get_output() is not None
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False)
                           and getattr(config, "tie_encoder_decoder", False))
    return embeddings or encoder_decoder or \
        any(hasattr(module, "_tie_weights") for module in model.modules())


def _device_of(name: str, device_map: Mapping[str, Any]) -> Any:
    probe = name
    while probe not in device_map:
        if not probe:
            raise ValueError(f"the device_map places no module holding {name!r}; add an entry for "
                             "it (or for one of its parent modules)")
        probe = probe.rpartition(".")[0]
    return device_map[probe]


def check_tied_parameters_on_same_device(tied_params: Sequence[Sequence[str]],
                                         device_map: Mapping[str, Any]) -> None:
    """Warn for every group of tied parameters that ``device_map`` splits across devices."""
    for group in tied_params:
        devices = {name: _device_of(name, device_map) for name in group}
        if len({str(d) for d in devices.values()}) > 1:
            warn_user(f"tied parameters are on different devices: {devices}; put their "
                      "modules on one device in your device_map, or use device_map='auto'")


def ensure_weights_retied(param_init_fn: Callable[[nn.Module], Any], model: nn.Module,
                          device: torch.device | str | int) -> Callable[[nn.Module], Any]:
    """``param_init_fn`` (an FSDP ``param_init_fn``, which may reallocate a module's parameters)
    wrapped so that the weights named in ``model._tied_weights_keys`` stay tied: every use of a
    tied parameter gets the first parameter built for it. Without ``_tied_weights_keys``:
    ``param_init_fn`` itself. ``device`` is unused (Accelerate's signature)."""
    del device
    tied_names = getattr(model, "_tied_weights_keys", None)
    if not tied_names:
        return param_init_fn
    built: dict[int, nn.Parameter | None] = {id(getattr(*_owner(model, n))): None
                                             for n in tied_names}

    def init_keeping_ties(module: nn.Module) -> Any:
        tied = [(id(p), n) for n, p in module.named_parameters(recurse=False) if id(p) in built]
        module = param_init_fn(module)
        for key, name in tied:
            first = built[key]
            if first is None:
                built[key] = getattr(module, name)
            else:
                setattr(module, name, first)
        return module

    return init_keeping_ties


def get_module_children_bottom_up(model: nn.Module, return_fqns: bool = False
                                  ) -> list[Any]:
    """Every module of ``model``, children before their parent (post-order, children in
    registration order), ``model`` last; ``(qualified name, module)`` pairs with
    ``return_fqns``. A module registered under several parents is listed under each."""
    ordered: list[tuple[str, nn.Module]] = []
    stack: list[tuple[str, nn.Module, bool]] = [("", model, False)]
    while stack:
        name, module, expanded = stack.pop()
        if expanded:
            ordered.append((name, module))
            continue
        stack.append((name, module, True))
        children = [(f"{name}.{child}" if name else child, sub)
                    for child, sub in module.named_children()]
        stack.extend((child, sub, False) for child, sub in reversed(children))
    return ordered if return_fqns else [module for _, module in ordered]


def calculate_maximum_sizes(model: nn.Module) -> tuple[int, tuple[int, list[str]]]:
    """``(bytes of the whole model, (bytes of its largest layer, names of the layers of that
    size))``; a class in ``model._no_split_modules`` (transformers sets it) counts as one layer.
    """
    sizes = compute_module_sizes(model)
    no_split = getattr(model, "_no_split_modules", None) or []
    parts: list[tuple[str, nn.Module | torch.Tensor]] = [
        *model.named_parameters(recurse=False), *model.named_children(),
        *model.named_buffers(recurse=False)]
    return sizes[""], get_max_layer_size(parts, sizes, list(no_split))


def _refuse_recurrent_layers_under_sequence_parallelism(model: nn.Module) -> None:
    """Raise ``ValueError`` when ``model``'s config (its text config, if it has one) lists
    ``layer_types`` with linear attention: such layers carry a state along the sequence, which
    sharding the sequence across ranks would silently restart on every rank."""
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", None)
    config = text() if callable(text) else config
    kinds = getattr(config, "layer_types", None) or []
    recurrent = sorted({kind for kind in kinds if "linear_attention" in str(kind)})
    if recurrent:
        raise ValueError(
            f"{type(model).__name__} has attention layers of type {recurrent}, which carry a "
            "recurrent state along the sequence: sharding the sequence (sequence parallelism) "
            "would restart that state on every rank and give wrong gradients without an error. "
            "Use a model with full attention, or turn sequence parallelism off.")


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False,
                               fqns: bool = False) -> set[str]:
    """Names of ``module``'s non-persistent buffers (left out of its ``state_dict``), a new set;
    with ``recurse``, its submodules' too (their full names with ``fqns``).

    Example:
        >>> norm = torch.nn.BatchNorm1d(2)
        >>> norm.register_buffer("scratch", torch.zeros(2), persistent=False)
        >>> get_non_persistent_buffers(torch.nn.Sequential(norm), recurse=True, fqns=True)
        {'0.scratch'}
    """
    found = set(module._non_persistent_buffers_set)
    if recurse:
        for name, sub in module.named_modules():
            own = sub._non_persistent_buffers_set
            found |= {f"{name}.{b}" if fqns and name else b for b in own}
    return found


def compute_module_total_buffer_size(model: nn.Module, dtype: str | torch.dtype | None = None,
                                     special_dtypes: Mapping[str, str | torch.dtype] | None = None
                                     ) -> int:
    """Bytes of all of ``model``'s buffers (sized as :func:`compute_module_sizes` sizes them).

    Example:
        >>> compute_module_total_buffer_size(torch.nn.BatchNorm1d(4))  # 2 x 4 floats, 1 int64
        40
    """
    sizes = compute_module_sizes(model, dtype, special_dtypes)
    return sum(sizes.get(name, 0) for name, _ in model.named_buffers())
