"""Device maps: where each part of a model goes when it does not fit on one device.

:func:`infer_auto_device_map` walks the model's top-level parts in order and fills the devices
of the budget in order (GPUs, then ``"cpu"``, then ``"disk"``), splitting a part into its
children only when it does not fit and its class is not in ``no_split_module_classes``. Parts
that share a parameter (a tied embedding and output head) go to the same device. On the
*main* devices (the first GPU and the CPU when there is a GPU, else the CPU) room for the
largest remaining layer is kept free: an offloaded layer is brought there to run. Everything
is computed from shapes and dtypes, so a model built under ``init_empty_weights()`` (on the
``meta`` device) is placed without allocating its weights.

Sizes (:func:`compute_module_sizes`) count each tensor once (tied parameters once), at
``dtype`` for floating-point tensors when given (integer and bool tensors keep their dtype, as
loading does not convert them), and at ``special_dtypes[name]`` for the tensors named there.
Unlike Accelerate, a floating tensor is counted at ``dtype`` even when ``dtype`` is wider than
the tensor's (loading with ``dtype`` converts it, so that is the memory it takes).

Example:
    >>> import torch
    >>> from accel.big_modeling import init_empty_weights
    >>> with init_empty_weights():
    ...     model = torch.nn.Sequential(*[torch.nn.Linear(100, 100) for _ in range(3)])
    >>> compute_module_sizes(model)["0"]
    40400
    >>> dict(infer_auto_device_map(model, max_memory={"cpu": 100_000}))
    {'0': 'cpu', '1': 'disk', '2': 'disk'}
"""

from __future__ import annotations

import logging
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from .._base.warn import warn_user
from .budget import DeviceKey, get_max_memory
from .sizes import format_size, parse_dtype

__all__ = ["check_device_map", "clean_device_map", "compute_module_sizes",
           "find_tied_parameters", "get_balanced_memory", "get_max_layer_size",
           "infer_auto_device_map", "unplaced_tensors"]

Part = nn.Module | torch.Tensor
DtypeLike = str | torch.dtype


def _within(name: str, prefix: str) -> bool:
    """``name`` is ``prefix`` or inside it (``"layers.1"`` is not inside ``"layers.10"``)."""
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


def _named_tensors(model: nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """Parameters then buffers, each tensor once (a tied parameter under its first name)."""
    seen: set[int] = set()
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            yield name, tensor


def compute_module_sizes(model: nn.Module, dtype: DtypeLike | None = None,
                         special_dtypes: Mapping[str, DtypeLike] | None = None
                         ) -> defaultdict[str, int]:
    """Bytes of every submodule and tensor of ``model`` (``""`` is the whole model).

    Args:
        model: any module; on the ``meta`` device too (sizes come from shapes and dtypes).
        dtype: count floating-point tensors at this dtype (as loading with ``dtype`` stores
            them); None: at their own dtype.
        special_dtypes: ``{tensor name: dtype}`` overriding ``dtype`` for those tensors.

    Example:
        >>> import torch
        >>> sizes = compute_module_sizes(torch.nn.Linear(10, 10), dtype="bfloat16")
        >>> sizes[""], sizes["weight"], sizes["bias"]
        (220, 200, 20)
    """
    target = parse_dtype(dtype) if dtype is not None else None
    special = {name: parse_dtype(d, f"special_dtypes[{name!r}]")
               for name, d in (special_dtypes or {}).items()}
    sizes: defaultdict[str, int] = defaultdict(int)
    for name, tensor in _named_tensors(model):
        if name in special:
            per_element = special[name].itemsize
        elif target is not None and (tensor.is_floating_point() or tensor.is_complex()):
            per_element = target.itemsize
        else:
            per_element = tensor.element_size()
        size = tensor.numel() * per_element
        parts = name.split(".")
        for depth in range(len(parts) + 1):
            sizes[".".join(parts[:depth])] += size
    return sizes


def _splittable(part: Part, no_split: Sequence[str]) -> bool:
    return isinstance(part, nn.Module) and type(part).__name__ not in no_split and \
        next(iter(part.children()), None) is not None


def _parts_of(module: nn.Module, prefix: str = "") -> list[tuple[str, Part]]:
    """Direct parameters, child modules, then direct buffers, with full names."""
    head = f"{prefix}." if prefix else ""
    own: list[tuple[str, Part]] = [*module.named_parameters(recurse=False),
                                   *module.named_children(), *module.named_buffers(recurse=False)]
    return [(head + name, part) for name, part in own]


def get_max_layer_size(modules: Sequence[tuple[str, Part]], module_sizes: Mapping[str, int],
                       no_split_module_classes: Sequence[str]) -> tuple[int, list[str]]:
    """The size of the largest *layer* among ``modules`` and the layers of that size.

    A layer is a tensor, a module without children, or a module whose class is in
    ``no_split_module_classes`` (it is placed whole, so it must fit whole).

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(3, 3))
        >>> get_max_layer_size(list(model.named_children()), compute_module_sizes(model), [])
        (48, ['1'])
    """
    best, names = 0, []
    todo = list(modules)
    while todo:
        name, part = todo.pop(0)
        if _splittable(part, no_split_module_classes):
            assert isinstance(part, nn.Module)
            todo = [*_parts_of(part, name), *todo]
            continue
        size = module_sizes.get(name, 0)
        if size > best:
            best, names = size, [name]
        elif size == best:
            names.append(name)
    return best, names


def find_tied_parameters(model: nn.Module) -> list[list[str]]:
    """Groups of names under which one parameter is registered (tied weights), sorted.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 5))
        >>> model[1].weight = model[0].weight
        >>> find_tied_parameters(model)
        [['0.weight', '1.weight']]
    """
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [sorted(group) for group in names.values() if len(group) > 1]


def clean_device_map(device_map: dict[str, DeviceKey], module_name: str = ""
                     ) -> dict[str, DeviceKey]:
    """Merge entries under ``module_name`` that share one device into their parent, in place.

    Example:
        >>> clean_device_map({"a.x": 0, "a.y": 0, "b": "cpu"})
        {'a': 0, 'b': 'cpu'}
    """
    inside = [(k, v) for k, v in device_map.items() if _within(k, module_name)]
    merged = dict(_merged(module_name, inside))
    cleaned = {}
    for key, value in device_map.items():  # keep the order: merged groups where they began
        if _within(key, module_name):
            cleaned.update(merged)
            merged = {}
        else:
            cleaned[key] = value
    device_map.clear()
    device_map.update(cleaned)
    return device_map


def _merged(prefix: str, items: list[tuple[str, DeviceKey]]) -> list[tuple[str, DeviceKey]]:
    if len(items) > 1 and len({value for _, value in items}) == 1:
        return [(prefix, items[0][1])]
    groups: dict[str, list[tuple[str, DeviceKey]]] = {}
    cut = len(prefix) + 1 if prefix else 0
    for key, value in items:
        if key == prefix:
            return items  # the parent itself is an entry: nothing below it to merge
        child = key[cut:].split(".", 1)[0]
        groups.setdefault(f"{prefix}.{child}" if prefix else child, []).append((key, value))
    return [pair for child, group in groups.items() for pair in _merged(child, group)]


def check_device_map(model: nn.Module, device_map: Mapping[str, object]) -> None:
    """Check that ``device_map`` places every parameter and buffer of ``model``.

    Raises:
        ValueError: naming the tensors that no entry covers.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> check_device_map(model, {"0": "cpu"})
        >>> check_device_map(model, {"1": "cpu"})
        Traceback (most recent call last):
        ...
        ValueError: the device map places no device for 0.weight, 0.bias; add them (or a \
module containing them) to device_map, or use device_map="auto"
    """
    known = {name for name, _ in model.named_modules()}
    tensors = [name for name, _ in [*model.named_parameters(remove_duplicate=False),
                                    *model.named_buffers(remove_duplicate=False)]]
    unknown = [key for key in device_map if key not in known and key not in tensors]
    if unknown:
        warn_user(f"device_map keys do not match any submodules or tensors of the model: "
                  f"{unknown}; they place nothing (check their spelling)")
    unplaced = unplaced_tensors(model, device_map)
    if unplaced:
        shown = ", ".join(unplaced[:20]) + (f" and {len(unplaced) - 20} more"
                                            if len(unplaced) > 20 else "")
        raise ValueError(f"the device map places no device for {shown}; add them (or a "
                         "module containing them) to device_map, or use device_map=\"auto\"")


def unplaced_tensors(model: nn.Module, device_map: Mapping[str, object]) -> list[str]:
    """Names of ``model``'s parameters and buffers (tied names included) that no entry of
    ``device_map`` covers."""
    return [name for name, _ in [*model.named_parameters(remove_duplicate=False),
                                 *model.named_buffers(remove_duplicate=False)]
            if not any(_within(name, key) for key in device_map)]


def _no_split_list(classes: str | Sequence[str] | None) -> list[str]:
    if classes is None:
        return []
    return [classes] if isinstance(classes, str) else list(classes)


def _accelerators(budget: Mapping[DeviceKey, int]) -> list[int]:
    return sorted(key for key, size in budget.items() if isinstance(key, int) and size > 0)


def get_balanced_memory(model: nn.Module, max_memory: Mapping[object, int | str] | None = None,
                        no_split_module_classes: str | Sequence[str] | None = None,
                        dtype: DtypeLike | None = None,
                        special_dtypes: Mapping[str, DtypeLike] | None = None,
                        low_zero: bool = False) -> dict[DeviceKey, int]:
    """A ``max_memory`` that spreads ``model`` evenly over the GPUs (Accelerate's semantics).

    Each GPU but the last is capped at the model's share plus a margin (1.25 times the larger
    of the biggest no-split block and the mean leaf module), so that rounding does not push
    layers off the GPUs. With one GPU and no ``max_memory``, 90% of it is used. ``low_zero``
    puts as little as possible on GPU 0 (it keeps room for ``generate`` and the like). Without
    GPUs the budget is returned unchanged.

    Example:
        >>> import torch
        >>> get_balanced_memory(torch.nn.Linear(4, 4), {"cpu": "1MB"})
        {'cpu': 1000000}
    """
    budget = get_max_memory(max_memory)
    gpus = _accelerators(budget)
    if not gpus:
        return budget
    if len(gpus) == 1:
        if max_memory is None:
            budget[gpus[0]] = int(budget[gpus[0]] * 0.9)
        return budget
    sizes = compute_module_sizes(model, dtype, special_dtypes)
    share = sizes[""] // (len(gpus) - 1 if low_zero else len(gpus))
    share += int(1.25 * max(_no_split_block(model, sizes, no_split_module_classes),
                            _mean_leaf(model, sizes)))
    for index in gpus[:-1]:
        if not (low_zero and index == gpus[0]):
            budget[index] = min(share, budget[index])
    if low_zero:
        rest = sum(budget[index] for index in gpus[1:])
        budget[gpus[0]] = min(max(0, sizes[""] - rest), budget[gpus[0]])
    return budget


def _no_split_block(model: nn.Module, sizes: Mapping[str, int],
                    classes: str | Sequence[str] | None) -> int:
    """The largest of the first block found of each no-split class (blocks repeat)."""
    first: dict[str, int] = {}
    wanted = _no_split_list(classes)
    for name, module in model.named_modules():
        kind = type(module).__name__
        if kind in wanted and kind not in first:
            first[kind] = sizes.get(name, 0)
    return max(first.values(), default=0)


def _mean_leaf(model: nn.Module, sizes: Mapping[str, int]) -> int:
    """The mean size of the innermost modules that hold tensors."""
    holders = [name for name, _ in model.named_modules() if name and name in sizes]
    parents = {name.rpartition(".")[0] for name in holders}
    leaves = [sizes[name] for name in holders if name not in parents]
    return sum(leaves) // max(len(leaves), 1)


@dataclass(kw_only=True, slots=True)
class _Planner:
    """The state of one :func:`infer_auto_device_map` walk."""

    sizes: Mapping[str, int]
    budget: dict[DeviceKey, int | None]
    no_split: list[str]
    tied: list[list[str]]
    queue: list[tuple[str, Part]]
    verbose: bool
    fallback: bool = False
    devices: list[DeviceKey] = field(init=False)
    main: set[DeviceKey] = field(init=False)
    used: dict[DeviceKey, int] = field(init=False)
    placed: OrderedDict[str, DeviceKey] = field(default_factory=OrderedDict)
    current: int = 0
    largest: tuple[int, list[str]] = (0, [])
    reserved: dict[DeviceKey, int] = field(default_factory=dict)  # kept free when left
    empty: dict[DeviceKey, int] = field(default_factory=dict)  # left with nothing: room needed
    fell_back: set[DeviceKey] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.devices = list(self.budget)
        accelerators = [d for d in self.devices if d not in ("cpu", "disk")]
        self.main = {accelerators[0], "cpu"} if accelerators else {"cpu"}
        self.used = dict.fromkeys(self.devices, 0)
        self.largest = get_max_layer_size(self.queue, self.sizes, self.no_split)

    def say(self, text: str) -> None:
        if self.verbose:
            print(text)

    def ties_of(self, name: str) -> list[int]:
        """Queue positions of the parts holding parameters tied to ``name``'s, outside it."""
        outside = [p for group in self.tied if any(_within(q, name) for q in group)
                   for p in group if not _within(p, name)]
        return sorted({i for i, (other, _) in enumerate(self.queue)
                       for p in outside if _within(p, other)})

    def split(self, position: int) -> None:
        name, part = self.queue[position]
        assert isinstance(part, nn.Module)
        self.say(f"  splitting {name}")
        self.queue[position:position + 1] = _parts_of(part, name)
        self.largest = get_max_layer_size(self.queue, self.sizes, self.no_split)

    def step(self) -> None:
        name, part = self.queue[0]
        if any(_within(n, name) for n in self.largest[1]):
            self.largest = get_max_layer_size(self.queue[1:], self.sizes, self.no_split)
        device = self.devices[self.current]
        cap = self.budget[device]
        reserve = self.largest[0] if device in self.main else 0
        room = None if cap is None else cap - reserve - self.used[device]
        ties = self.ties_of(name)
        size = self.sizes.get(name, 0)
        together = size + sum(self.sizes.get(self.queue[i][0], 0) for i in ties)
        if room is None or together <= room:
            group = [0, *ties]
            self.say(f"putting {', '.join(self.queue[i][0] for i in group)} "
                     f"({format_size(together)}) on {device!r}")
            for i in group:
                self.placed[self.queue[i][0]] = device
            self.used[device] += together
            self.queue = [entry for i, entry in enumerate(self.queue) if i not in group]
            return
        assert room is not None
        if ties and size <= room:  # the part fits without its tied parts: split one of those
            for i in ties:
                if _splittable(self.queue[i][1], self.no_split):
                    return self.split(i)
        elif _splittable(part, self.no_split):
            return self.split(0)
        if self.fallback and self.used[device] == 0 and device not in self.fell_back:
            self.fell_back.add(device)
            if self.fall_back(room):
                return None
        self.say(f"{name} ({format_size(together)}) does not fit on {device!r} "
                 f"({format_size(max(room, 0))} left): next device")
        self.reserved[device] = reserve
        if self.used[device] == 0:
            self.empty[device] = together + reserve
        self.current += 1
        if self.current == len(self.devices):
            raise ValueError(_overflow_message(name, together, self.budget))


    def fall_back(self, room: int) -> bool:
        """Bring to the front of the queue the first part (breadth first, splitting what may
        be split) that fits in ``room`` with its tied parts; False when none does."""
        todo = list(self.queue)
        while todo:
            name, part = todo.pop(0)
            ties = [self.queue[i][0] for i in self.ties_of(name)]
            if self.sizes.get(name, 0) + sum(self.sizes.get(t, 0) for t in ties) <= room:
                break
            if _splittable(part, self.no_split):
                assert isinstance(part, nn.Module)
                todo = [*_parts_of(part, name), *todo]
        else:
            return False
        self.say(f"  fallback allocation: {name} fits in the {format_size(room)} left")
        while all(entry != name for entry, _ in self.queue):
            self.split(next(i for i, (e, _) in enumerate(self.queue) if _within(name, e)))
        position = next(i for i, (entry, _) in enumerate(self.queue) if entry == name)
        self.queue.insert(0, self.queue.pop(position))
        return True


def _log_empty_devices(empty: Mapping[DeviceKey, int]) -> None:
    if empty:
        needs = ", ".join(f"{device!r} needs {format_size(size)}" for device, size in empty.items())
        logging.getLogger(__name__).info(
            "no part of the model could be placed on these devices, for insufficient memory: "
            "%s (for this model and order of placement); raise their max_memory to at least "
            "that, or pass fallback_allocation=True to place smaller parts there", needs)


def _overflow_message(name: str, size: int, budget: Mapping[DeviceKey, int | None]) -> str:
    shown = ", ".join(f"{k!r}: {format_size(v or 0)}" for k, v in budget.items())
    return (f"the model does not fit in max_memory ({shown}): {name} ({format_size(size)}) "
            "has no room left; raise a budget, or leave 'disk' out of max_memory (unlimited "
            "disk offload)")


def infer_auto_device_map(model: nn.Module, max_memory: Mapping[object, int | str] | None = None,
                          no_split_module_classes: str | Sequence[str] | None = None,
                          dtype: DtypeLike | None = None,
                          special_dtypes: Mapping[str, DtypeLike] | None = None,
                          verbose: bool = False, clean_result: bool = True,
                          offload_buffers: bool = False, fallback_allocation: bool = False
                          ) -> OrderedDict[str, DeviceKey]:
    """A device map for ``model``: GPUs first, then the CPU, then the disk.

    Args:
        model: the model to place, typically built under ``init_empty_weights()``.
        max_memory: ``{device: size}`` budgets (``{0: "10GiB", "cpu": "30GiB"}``); None:
            what this machine has free (:func:`get_max_memory`). ``"disk"`` is unlimited unless
            given.
        no_split_module_classes: class names of modules never split across devices (blocks
            with residual connections, e.g. ``["LlamaDecoderLayer"]``).
        dtype: the dtype the weights will be loaded in (sizes are computed at it).
        special_dtypes: per-tensor dtypes that override ``dtype``.
        verbose: print each decision.
        clean_result: merge the entries of a module that all went to one device into it.
        offload_buffers: whether the buffers of offloaded modules are offloaded too; when
            not (the default) they stay on the execution device, and a warning says when they
            may not fit there.
        fallback_allocation: when the next part fits nowhere on a device that has nothing
            yet, place there the first smaller part that fits (searched breadth first,
            splitting parts), rather than leaving the device empty. A device left empty is
            logged (INFO) with the room it would need.

    Returns:
        An ordered ``{module or tensor name: device}``, devices being GPU indices (ints),
        ``"mps"``, ``"xla"``, ``"cpu"`` or ``"disk"``.

    Raises:
        ValueError: a ``max_memory`` key naming no device here, an unreadable size, or a
            capped ``"disk"`` too small for what is left.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 10))
        >>> dict(infer_auto_device_map(model, {"cpu": 1000}))
        {'': 'cpu'}
    """
    budget: dict[DeviceKey, int | None] = dict(get_max_memory(max_memory))
    budget.setdefault("disk", None)
    sizes = compute_module_sizes(model, dtype, special_dtypes)
    planner = _Planner(sizes=sizes, budget=budget, no_split=_no_split_list(no_split_module_classes),
                       tied=find_tied_parameters(model), queue=_parts_of(model), verbose=verbose,
                       fallback=fallback_allocation)
    while planner.queue:
        planner.step()
    _log_empty_devices(planner.empty)
    if not offload_buffers:
        _warn_offloaded_buffers(model, planner=planner, dtype=dtype, special_dtypes=special_dtypes)
    placed = planner.placed
    if clean_result:
        clean_device_map(placed)
    return placed


def _warn_offloaded_buffers(model: nn.Module, *, planner: _Planner, dtype: DtypeLike | None,
                            special_dtypes: Mapping[str, DtypeLike] | None) -> None:
    gpus = [d for d in planner.devices if isinstance(d, int)]
    offloaded = [name for name, device in planner.placed.items() if device in ("cpu", "disk")]
    if not gpus or not offloaded:
        return
    buffers = {name for name, _ in model.named_buffers()}
    sizes = compute_module_sizes(model, dtype, special_dtypes)
    needed = sum(sizes[name] for name in buffers if any(_within(name, o) for o in offloaded))
    room = {g: (planner.budget[g] or 0) - planner.used[g] - planner.reserved.get(g, 0)
            for g in gpus}
    if needed and not any(room[g] >= needed for g in gpus):
        warn_user(f"the offloaded modules hold {format_size(needed)} of buffers, which stay "
                  "on the GPU and may not fit there; pass offload_buffers=True if you run "
                  "out of memory", UserWarning)
