"""Encode nested Python state into tensors (for safetensors) plus a JSON structure, and back.

The JSON structure is plain JSON where it can be (str-keyed dicts, lists, finite numbers,
strings, booleans, null) and a one-key tagged object where plain JSON would lose the type:

=====================  =========================================================
``{"$tensor": k}``      a tensor, stored under key ``k`` (same tensor object -> same key)
``{"$ndarray": k, …}``  a numpy array, stored as raw bytes; ``dtype`` and ``shape`` recorded
``{"$tuple": [...]}``   a tuple (named tuples come back as plain tuples)
``{"$dict": [[k, v]]}`` a dict with a non-str key (optimizer ``state`` int keys) or a ``$`` key
``{"$float": "inf"}``   inf, -inf, nan (JSON cannot hold them)
``{"$npscalar": …}``    a numpy scalar (exact bytes); also ``$dtype``, ``$device``, ``$size``,
                        ``$bytes``, ``$complex``, ``$set``, ``$frozenset``
=====================  =========================================================

Anything else raises ``TypeError`` naming the key path: checkpoints never fall back to pickle.

Example:
    >>> import torch
    >>> tensors, structure = encode({"step": 3, 0: (torch.ones(2), float("inf"))})
    >>> structure
    {'$dict': [['step', 3], [0, {'$tuple': [{'$tensor': '0.0'}, {'$float': 'inf'}]}]]}
    >>> decode(structure, tensors)[0][1]
    inf
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["decode", "encode"]

class _Encoder:
    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._by_id: dict[int, str] = {}

    def _key(self, path: tuple[Any, ...]) -> str:
        base = ".".join(str(p) for p in path) or "value"
        key, n = base, 1
        while key in self.tensors:
            n += 1
            key = f"{base}#{n}"
        return key

    def tensor(self, value: torch.Tensor, path: tuple[Any, ...]) -> str:
        key = self._by_id.get(id(value))
        if key is None:
            key = self._key(path)
            self.tensors[key] = value.detach()
            self._by_id[id(value)] = key  # value stays alive in self.tensors: ids are stable
        return key

    def encode(self, value: Any, path: tuple[Any, ...]) -> Any:
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str):
            return str(value)
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return float(value) if math.isfinite(value) else {"$float": repr(float(value))}
        if isinstance(value, torch.Tensor):
            return {"$tensor": self.tensor(value, path)}
        if isinstance(value, Mapping):
            return self._mapping(value, path)
        if isinstance(value, list):
            return [self.encode(v, (*path, i)) for i, v in enumerate(value)]
        if isinstance(value, torch.Size):
            return {"$size": list(value)}
        if isinstance(value, tuple):
            return {"$tuple": [self.encode(v, (*path, i)) for i, v in enumerate(value)]}
        return self._other(value, path)

    def _mapping(self, value: Mapping[Any, Any], path: tuple[Any, ...]) -> Any:
        if all(type(k) is str and not k.startswith("$") for k in value):
            return {k: self.encode(v, (*path, k)) for k, v in value.items()}
        return {"$dict": [[self.encode(k, (*path, "<key>")), self.encode(v, (*path, k))]
                          for k, v in value.items()]}

    def _other(self, value: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                raise _unsupported(value, path, "a numpy array of Python objects")
            arr = np.ascontiguousarray(value)
            raw = torch.from_numpy(arr.reshape(-1).view(np.uint8)) if arr.size else \
                torch.empty(0, dtype=torch.uint8)
            key = self._key(path)
            self.tensors[key] = raw
            return {"$ndarray": key, "dtype": arr.dtype.str, "shape": list(arr.shape)}
        if isinstance(value, np.generic) and not value.dtype.hasobject:
            return {"$npscalar": value.dtype.str, "hex": value.tobytes().hex()}
        if isinstance(value, torch.dtype):
            return {"$dtype": str(value).removeprefix("torch.")}
        if isinstance(value, torch.device):
            return {"$device": str(value)}
        if isinstance(value, (bytes, bytearray)):
            return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
        if isinstance(value, complex):
            return {"$complex": [self.encode(value.real, path), self.encode(value.imag, path)]}
        if isinstance(value, (set, frozenset)):
            tag = "$frozenset" if isinstance(value, frozenset) else "$set"
            return {tag: [self.encode(v, (*path, "<item>")) for v in value]}
        raise _unsupported(value, path, f"a {type(value).__module__}.{type(value).__qualname__}")


def _unsupported(value: Any, path: tuple[Any, ...], what: str) -> TypeError:
    where = "".join(f"[{p!r}]" for p in path) or "<root>"
    return TypeError(
        f"cannot checkpoint the value at state{where}: it is {what}. Checkpoints hold tensors, "
        "numpy arrays, numbers, strings, bools, None, dtypes/devices and dicts/lists/tuples of "
        "them, and never pickle arbitrary objects; make the object's state_dict() return such "
        f"values (e.g. convert it to a tensor, number or string). Found: {value!r:.80}")


def encode(state: Any) -> tuple[dict[str, torch.Tensor], Any]:
    """Split ``state`` into tensors and a JSON-able structure that refers to them by key.

    Returns:
        (tensors keyed by their path in ``state``, JSON-able structure).

    Raises:
        TypeError: a leaf of an unsupported type, naming its key path and how to fix it.
    """
    encoder = _Encoder()
    structure = encoder.encode(state, ())
    return encoder.tensors, structure


def _float(text: str) -> float:
    if text not in ("inf", "-inf", "nan"):
        raise ValueError(f"bad $float value {text!r}; expected 'inf', '-inf' or 'nan'")
    return float(text)


def _tensor(tensors: Mapping[str, torch.Tensor], key: Any) -> torch.Tensor:
    if key not in tensors:
        raise KeyError(f"the structure refers to tensor {key!r}, which the tensor file lacks")
    return tensors[key]


def _ndarray(node: dict[str, Any], tensors: Mapping[str, torch.Tensor]) -> np.ndarray:
    dtype = np.dtype(node["dtype"])
    if dtype.hasobject:
        raise ValueError("object arrays are never decoded")
    raw = _tensor(tensors, node["$ndarray"])
    data = raw.numpy().tobytes() if raw.numel() else b""
    array: np.ndarray = np.frombuffer(data, dtype=dtype).reshape(node["shape"]).copy()
    return array


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return value


_DECODERS: dict[str, Any] = {
    "$float": lambda node, t: _float(node["$float"]),
    "$tensor": lambda node, t: _tensor(t, node["$tensor"]),
    "$ndarray": _ndarray,
    "$tuple": lambda node, t: tuple(_decode(v, t) for v in node["$tuple"]),
    "$dict": lambda node, t: {_decode(k, t): _decode(v, t) for k, v in node["$dict"]},
    "$npscalar": lambda node, t: np.frombuffer(bytes.fromhex(node["hex"]),
                                               dtype=np.dtype(node["$npscalar"]))[0],
    "$dtype": lambda node, t: _dtype(node["$dtype"]),
    "$device": lambda node, t: torch.device(node["$device"]),
    "$size": lambda node, t: torch.Size(node["$size"]),
    "$bytes": lambda node, t: base64.b64decode(node["$bytes"], validate=True),
    "$complex": lambda node, t: complex(_decode(node["$complex"][0], t),
                                        _decode(node["$complex"][1], t)),
    "$set": lambda node, t: {_decode(v, t) for v in node["$set"]},
    "$frozenset": lambda node, t: frozenset(_decode(v, t) for v in node["$frozenset"]),
}


def _decode(structure: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(structure, list):
        return [_decode(v, tensors) for v in structure]
    if isinstance(structure, dict):
        if structure:
            decoder = _DECODERS.get(next(iter(structure)))
            if decoder is not None:
                return decoder(structure, tensors)
        return {k: _decode(v, tensors) for k, v in structure.items()}
    return structure


def decode(structure: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """Rebuild the state that :func:`encode` split (tensors are used as given, e.g. on CPU).

    Raises:
        ValueError: the structure is malformed or refers to a tensor ``tensors`` lacks.
    """
    try:
        return _decode(structure, tensors)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise ValueError(f"malformed checkpoint structure: {exc}") from exc
