"""Read and write the safetensors format directly (no pickle, one copy, hash while writing).

Files written here are plain safetensors: ``safetensors.torch.load_file`` reads them. Tensors
are laid out by decreasing element size so that every tensor starts at an offset aligned to
its element size, which lets the reader hand out zero-copy views of one read buffer.

Identical views (tied weights: the same storage, offset, shape and strides) are stored once;
the other names are recorded in the ``accel.aliases`` metadata entry and restored on load.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from ._io import Buffer
from .errors import CheckpointError

__all__ = ["ALIASES_KEY", "DTYPE_NAMES", "describe_foreign", "entry_of", "header_size", "parse",
           "parse_header", "plan", "with_aliases", "write"]

ALIASES_KEY = "accel.aliases"
_MAX_HEADER = 100 << 20

_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL", torch.complex64: "C64",
    torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.float8_e4m3fnuz: "F8_E4M3FNUZ", torch.float8_e5m2fnuz: "F8_E5M2FNUZ",
}
_NAMES: dict[str, torch.dtype] = {name: dtype for dtype, name in _DTYPES.items()}
#: safetensors dtype names -> torch dtypes
DTYPE_NAMES: Mapping[str, torch.dtype] = _NAMES


class _Sink(Protocol):
    def write(self, data: bytes | bytearray | memoryview) -> None: ...


def _check(name: str, tensor: Any) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor file entry {name!r} is a {type(tensor).__name__}, expected a "
                        "torch.Tensor; put other values in a JSON component instead")
    if tensor.layout != torch.strided or tensor.is_meta or tensor.is_quantized:
        raise TypeError(f"tensor {name!r} has layout {tensor.layout} on {tensor.device}; only "
                        "dense tensors with data can be saved (call .to_dense() / materialise it)")
    if tensor.dtype not in _DTYPES:
        raise TypeError(f"tensor {name!r} has dtype {tensor.dtype}, which safetensors cannot "
                        f"store; convert it (supported: {', '.join(map(str, _DTYPES))})")
    return tensor.detach()


def plan(tensors: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Validate names and tensors; collapse identical views into one stored entry.

    Returns:
        (tensors to store, aliases {alias name: stored name}).
    """
    stored: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be strings, found {name!r} "
                            f"({type(name).__name__}); convert the keys with str()")
        tensor = _check(name, value)
        if tensor.numel() > 0:
            ident = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
                     tuple(tensor.shape), tensor.stride(), tensor.dtype)
            if ident in seen:
                aliases[name] = seen[ident]
                continue
            seen[ident] = name
        stored[name] = tensor
    return stored, aliases


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    flat = tensor.cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]  # stubs lack __buffer__


def _header(tensors: dict[str, torch.Tensor], metadata: Mapping[str, str]
            ) -> tuple[bytes, list[str]]:
    order = sorted(tensors, key=lambda n: -tensors[n].element_size())  # stable: keeps insertion
    offsets: dict[str, list[int]] = {}
    pos = 0
    for name in order:
        size = tensors[name].numel() * tensors[name].element_size()
        offsets[name] = [pos, pos + size]
        pos += size
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    for name, tensor in tensors.items():  # header in the caller's order, data in aligned order
        header[name] = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": offsets[name]}
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw, order


def write(sink: _Sink, tensors: Mapping[str, Any],
          metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialise ``tensors`` (with tied-weight aliases) as safetensors into ``sink``.

    Returns:
        The header bytes written first (length prefix included), for callers that record a
        hash of the header alone (a sharded reader plans from headers before reading data).
    """
    stored, aliases = plan(tensors)
    meta = {"format": "pt", **(metadata or {})}
    for key, value in meta.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"safetensors metadata must map str to str, found {key!r}: {value!r}")
    if aliases:
        meta[ALIASES_KEY] = json.dumps(aliases, separators=(",", ":"))
    header, order = _header(stored, meta)
    sink.write(header)
    for name in order:
        if stored[name].numel():
            sink.write(_bytes_of(stored[name]))
    return header


def describe_foreign(buf: bytes | Buffer | memoryview) -> str | None:
    """Name the format of a file that is clearly not safetensors (pickle/zip), else None."""
    head = bytes(buf[:4])
    if head.startswith(b"PK\x03\x04"):
        return ("it is a zip archive, the format of torch.save(); accel never unpickles files. "
                "Convert it once in a trusted environment: "
                "accel.checkpoint.save(torch.load(path, weights_only=True), new_path)")
    if head[:1] == b"\x80" and len(head) > 1 and head[1] <= 5:
        return ("it is a Python pickle (pickle/torch.save legacy format); accel never unpickles "
                "files because loading a pickle can run arbitrary code")
    return None


def _invalid(source: str, why: str) -> CheckpointError:
    return CheckpointError(f"{source} is not a valid safetensors file: {why}", path=source)


def _read_header(buf: Buffer | bytes, source: str) -> tuple[dict[str, Any], int]:
    end = header_size(bytes(buf[:8]), source)
    if end > len(buf):
        raise _invalid(source, f"header length {end - 8} does not fit a file of {len(buf)} "
                       "bytes")
    try:
        header = json.loads(bytes(buf[8:end]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _invalid(source, f"the header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _invalid(source, f"the header is a {type(header).__name__}, expected an object")
    return header, end


def header_size(prefix: bytes, source: str) -> int:
    """Bytes of a safetensors header, length prefix included, from the file's first 8 bytes.

    Raises:
        CheckpointError: naming ``source`` when the prefix is not a safetensors length.
    """
    # A plausible length wins over the pickle/zip sniffing: a real header of 896 bytes starts
    # with b"\x80\x03", which is also how a protocol-3 pickle starts. A pickle or zip file has
    # opcodes or a signature in its first 8 bytes, so read as a length it is far too large.
    size = int.from_bytes(prefix[:8], "little") if len(prefix) >= 8 else None
    if size is None or size > _MAX_HEADER:
        foreign = describe_foreign(prefix)
        if foreign:
            raise _invalid(source, foreign)
    if size is None:
        raise _invalid(source, f"it has {len(prefix)} bytes, fewer than the 8-byte header length")
    if size > _MAX_HEADER:
        raise _invalid(source, f"header length {size} is over the {_MAX_HEADER}-byte limit")
    return 8 + size


def parse_header(raw: Buffer | bytes, source: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The tensor entries and metadata of a safetensors header (``raw``: at least the header).

    Entries map each name to ``{"dtype", "shape", "data_offsets"}``; nothing is validated
    against data (use :func:`parse` on the whole file for that).
    """
    header, _start = _read_header(raw, source)
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise _invalid(source, f"__metadata__ is a {type(metadata).__name__}, expected an object")
    return header, metadata


def entry_of(entry: Any, *, name: str, data_size: int, source: str
             ) -> tuple[torch.dtype, list[int], int, int]:
    """A header entry's (dtype, shape, begin, end), checked against ``data_size`` bytes of
    tensor data (offsets are relative to the end of the header)."""
    try:
        dtype = _NAMES[entry["dtype"]]
        shape = [int(d) for d in entry["shape"]]
        begin, end = (int(x) for x in entry["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise _invalid(source, f"entry {name!r} is malformed ({exc!r}): {entry!r}") from None
    numel = 1
    for dim in shape:
        numel *= dim
    if min(shape, default=0) < 0 or end - begin != numel * dtype.itemsize or begin < 0 \
            or end > data_size:
        raise _invalid(source, f"entry {name!r} (dtype {entry['dtype']}, shape {shape}, "
                       f"offsets {begin}..{end}) does not match the file's {data_size} bytes "
                       "of tensor data")
    return dtype, shape, begin, end


def _tensor(buf: Buffer, *, start: int, entry: Any, name: str, source: str) -> torch.Tensor:
    dtype, shape, begin, end = entry_of(entry, name=name, data_size=len(buf) - start, source=source)
    numel = (end - begin) // dtype.itemsize
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    if (start + begin) % dtype.itemsize == 0:  # zero-copy view of the read buffer
        return torch.frombuffer(buf, dtype=dtype, count=numel, offset=start + begin).view(shape)
    raw = torch.frombuffer(buf, dtype=torch.uint8, count=end - begin, offset=start + begin)
    out = torch.empty(shape, dtype=dtype)
    out.reshape(-1).view(torch.uint8).copy_(raw)
    return out


def with_aliases(tensors: dict[str, torch.Tensor], metadata: Mapping[str, str], source: str
                 ) -> dict[str, torch.Tensor]:
    """``tensors`` with the tied-weight aliases that :func:`write` recorded restored."""
    if ALIASES_KEY in metadata:
        try:
            aliases = json.loads(metadata[ALIASES_KEY])
            for alias, target in aliases.items():
                tensors[alias] = tensors[target]
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
            raise _invalid(source, f"bad {ALIASES_KEY} metadata ({exc!r})") from None
    return tensors


def parse(buf: Buffer, source: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors (CPU, sharing ``buf``'s memory) and metadata of a safetensors file's bytes.

    Aliases recorded by :func:`write` are restored: the alias names map to the same tensor.

    Raises:
        CheckpointError: naming ``source`` when the bytes are not a valid safetensors file.
    """
    header, start = _read_header(buf, source)
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise _invalid(source, f"__metadata__ is a {type(metadata).__name__}, expected an object")
    tensors = {name: _tensor(buf, start=start, entry=entry, name=name, source=source)
               for name, entry in header.items()}
    return with_aliases(tensors, metadata, source), metadata
