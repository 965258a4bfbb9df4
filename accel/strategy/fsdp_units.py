"""Which submodules of a model become FSDP units, and which parameters FSDP leaves alone.

A unit is a module ``fully_shard`` is applied to: its parameters are gathered together before
its forward and freed after. Units are chosen by the plugin's ``auto_wrap_policy`` and returned
in post-order (children before parents), the order in which they must be sharded; the root is
always sharded last, by the caller, and holds every parameter no unit took. A module holding a
parameter that is also used outside it (a tied weight) is never made a unit of its own.

Example:
    >>> from torch import nn
    >>> from accel.config.fsdp import FullyShardedDataParallelPlugin
    >>> class Block(nn.Sequential): pass
    >>> model = nn.Sequential(nn.Embedding(4, 2), Block(nn.Linear(2, 2)), Block(nn.Linear(2, 2)))
    >>> plugin = FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"])
    >>> [name for name, _ in select_units(model, plugin)]
    ['1', '2']
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from .._base.warn import warn_user
from ..config.fsdp import FullyShardedDataParallelPlugin

__all__ = ["ignored_parameters", "select_units"]


def _post_order(model: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    """``(name, module)`` for every submodule below ``model``, children before parents."""
    for name, child in model.named_children():
        path = f"{prefix}.{name}" if prefix else name
        yield from _post_order(child, path)
        yield path, child


def _class_names(model: nn.Module) -> set[str]:
    return {type(m).__name__ for m in model.modules()}


def _transformer_classes(model: nn.Module, plugin: FullyShardedDataParallelPlugin) -> set[str]:
    names = plugin.transformer_cls_names_to_wrap or list(
        getattr(model, "_no_split_modules", None) or [])
    if not names:
        raise ValueError("auto_wrap_policy='transformer_based_wrap' needs the block classes to "
                         "shard one at a time: pass FullyShardedDataParallelPlugin("
                         "transformer_cls_names_to_wrap=['MyBlock']) (accel launch "
                         "--fsdp_transformer_layer_cls_to_wrap MyBlock)")
    present = _class_names(model)
    missing = sorted(set(names) - present)
    if missing:
        choices = ", ".join(sorted(present - {type(model).__name__}))
        raise ValueError(f"transformer_cls_names_to_wrap names {missing}, which no module of "
                         f"{type(model).__name__} is; its module classes are: {choices}")
    return set(names)


def _call_policy(policy: Callable[..., Any], module: nn.Module, unwrapped: int) -> bool:
    """A callable policy: ``policy(module)``, or torch's FSDP1 form ``policy(module=,
    recurse=False, nonwrapped_numel=)`` (``transformer_auto_wrap_policy`` and friends)."""
    try:
        params = inspect.signature(policy).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    if "recurse" in params and "nonwrapped_numel" in params:
        return bool(policy(module=module, recurse=False, nonwrapped_numel=unwrapped))
    return bool(policy(module))


def select_units(model: nn.Module, plugin: FullyShardedDataParallelPlugin,
                 ignored: set[nn.Module] | None = None) -> list[tuple[str, nn.Module]]:
    """The submodules to shard as units of their own, children first (the root excluded).

    Raises:
        ValueError: a ``transformer_cls_names_to_wrap`` entry names no module class of the model.
    """
    policy, ignored = plugin.auto_wrap_policy, ignored or set()
    if policy == "no_wrap":
        return []
    classes = _transformer_classes(model, plugin) if policy == "transformer_based_wrap" else set()
    units: list[tuple[str, nn.Module]] = []
    taken: set[int] = set()  # parameters already in a unit below
    skipped = {id(m) for module in ignored for m in module.modules()}
    users = _parameter_users(model)
    for name, module in _post_order(model):
        if id(module) in skipped:
            continue
        free = [p for p in module.parameters() if id(p) not in taken]
        if not free:
            continue
        numel = sum(p.numel() for p in free)
        if policy == "transformer_based_wrap":
            chosen = type(module).__name__ in classes
        elif policy == "size_based_wrap":
            chosen = numel >= plugin.min_num_params  # type: ignore[operator]
        else:
            chosen = _call_policy(policy, module, numel)  # type: ignore[arg-type]
        if chosen and not _shares_outside(users, name=name, module=module, policy=policy):
            units.append((name, module))
            taken.update(id(p) for p in free)
    return units


def _parameter_users(model: nn.Module) -> dict[int, list[str]]:
    """For each parameter (by id), the names of the modules that register it (two for a tied
    weight)."""
    users: dict[int, list[str]] = {}
    for mod_name, module in model.named_modules():
        for p_name, p in module.named_parameters(recurse=False):
            users.setdefault(id(p), []).append(f"{mod_name}.{p_name}" if mod_name else p_name)
    return users


def _shares_outside(users: dict[int, list[str]], *, name: str, module: nn.Module,
                    policy: Any) -> bool:
    """Whether ``module`` (named ``name``) holds a parameter that a module outside it uses too
    (a tied weight): as a unit it would own the parameter and gather it for its own forward
    only, so the other use would read a shard. Such a module is not made a unit (its
    parameters stay with the enclosing unit, which gathers them for both uses); a named class
    is warned about."""
    prefix = name + "."
    for p in module.parameters():
        outside = [u for u in users.get(id(p), []) if not u.startswith(prefix)]
        if outside:
            if policy == "transformer_based_wrap":
                warn_user(f"FSDP: {name} ({type(module).__name__}) is not sharded as a unit "
                          f"of its own: it shares a parameter with {outside[0]} (a tied "
                          "weight), so it stays in the enclosing unit")
            return True
    return False


def _within(module: nn.Module, container: nn.Module) -> bool:
    return any(module is m for m in container.modules())


def ignored_parameters(model: nn.Module, plugin: FullyShardedDataParallelPlugin
                       ) -> tuple[set[nn.Module], set[nn.Parameter]]:
    """The modules ``ignored_modules`` names (objects, or a regex over module names) and their
    parameters, which FSDP leaves unsharded and unsynchronised.

    Raises:
        ValueError: a module given is not part of the model, or the regex matches nothing.
    """
    given = plugin.ignored_modules
    if given is None:
        return set(), set()
    if isinstance(given, str):
        pattern = re.compile(given)
        modules = {m for n, m in model.named_modules() if n and pattern.fullmatch(n)}
        if not modules:
            raise ValueError(f"ignored_modules={given!r} matches no module name of "
                             f"{type(model).__name__} (the regex must match the whole name, "
                             "e.g. 'encoder\\.layers\\.0')")
    else:
        modules = set(given)
        outside = [type(m).__name__ for m in modules if not _within(m, model)]
        if outside:
            raise ValueError(f"ignored_modules has modules that are not part of the model: "
                             f"{outside}")
    return modules, {p for m in modules for p in m.parameters()}
