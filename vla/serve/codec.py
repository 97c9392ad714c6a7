"""openpi's msgpack-numpy wire format, written to be safe on untrusted input.

    data = packb({"observation.state": np.zeros(39, np.float32), "prompt": "push"})
    obs = unpackb(data)                   # the same dict back; numpy arrays for the ndarray maps

An array travels as a msgpack map ``{"__ndarray__": True, "data": <bytes>, "dtype": dtype.str, "shape": [...]}`` and
a numpy scalar as ``{"__npgeneric__": True, "data": item, "dtype": dtype.str}``, exactly as
``openpi_client.msgpack_numpy`` writes them (the keys as msgpack bin, like its ``b"__ndarray__"``), so the bytes
``packb`` produces are the bytes openpi's packer produces and either side can read the other's.

Reading is where openpi's own code trusts the sender; here nothing in a message can run code or make the server
allocate more than the message holds:
- only msgpack's plain types come out (no ``ext`` types, no pickle fallback, no object hooks beyond the two above);
- dtypes are numeric or boolean only (``b i u f``; object ``O``, void ``V``, complex ``c`` and strings are refused, as
  openpi's packer refuses them on the way out), native or explicit byte order;
- an array's shape must be non-negative, at most ``MAX_NDIM`` dimensions, and describe exactly the bytes sent;
- maps nest at most ``MAX_DEPTH`` deep (a message is an observation: a flat map of arrays and strings);
- a map holds at most ``MAX_KEYS`` keys, a list at most ``MAX_LIST_LEN`` values, and the whole message at most
  ``MAX_VALUES`` values in its maps and lists, each checked while reading: an array's elements travel as one bin, so
  these bound the Python objects a message can make (600,000 keys in 7.5 MB took 0.4 s to build) and not its size.
Anything else raises ``DecodeError`` naming the key and the fix, which the server sends back as its error reply.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgpack
import numpy as np

MAX_NDIM = 8
MAX_DEPTH = 8
MAX_KEYS = 256  # keys in one map: an observation holds a state, its cameras, a prompt and a few flags
MAX_LIST_LEN = 4096  # values in one list (a state sent as a list); arrays travel as bytes, not lists
MAX_VALUES = 65536  # values in all of a message's maps and lists together
_ALLOWED_KINDS = "biuf"  # bool, signed and unsigned integers, floats


class DecodeError(ValueError):
    """A message that is not a valid msgpack-numpy observation; the text says what and how to fix it."""


class _TooLarge(DecodeError):
    """A message over a structure bound: refused as it is read, never read again to find its key."""


_AS_ARRAYS = "send arrays as numpy arrays (msgpack-numpy packs their elements as one bin), not as lists"
_LIMIT = re.compile(r"(\d+) exceeds max_(map|array)_len")


def _bounded_unpackb(data: bytes, object_hook=None, ext_hook=None) -> Any:
    """``msgpack.unpackb`` under the structure bounds: ``MAX_KEYS`` and ``MAX_LIST_LEN`` by msgpack's own limits
    (checked on each header, before its values are read), ``MAX_VALUES`` counted by the hooks as each map and list
    is finished (so no more than ``MAX_VALUES + MAX_LIST_LEN`` values are made before a refusal)."""
    count = 0

    def counted(container):
        nonlocal count
        count += len(container)
        if count > MAX_VALUES:
            raise _TooLarge(f"the message holds more than {MAX_VALUES} values in its maps and lists; {_AS_ARRAYS}")
        return container

    def on_map(m: dict) -> Any:
        counted(m)
        return object_hook(m) if object_hook is not None else m

    try:
        # strict_map_key=False: openpi's ndarray maps use bin keys. max_str/bin_len default to the message length.
        return msgpack.unpackb(
            data,
            object_hook=on_map,
            list_hook=counted,
            ext_hook=ext_hook,
            strict_map_key=False,
            raw=False,
            use_list=True,
            max_map_len=MAX_KEYS,
            max_array_len=MAX_LIST_LEN,
        )
    except ValueError as err:
        limit = _LIMIT.match(str(err))
        if limit is None or isinstance(err, DecodeError):
            raise
        size, kind = int(limit.group(1)), limit.group(2)
        if kind == "map":
            raise _TooLarge(
                f"the message holds a map of {size} keys; a map may hold at most {MAX_KEYS}: send an "
                "observation as one flat map of its state, cameras and prompt"
            ) from None
        raise _TooLarge(
            f"the message holds a list of {size} values; a list may hold at most {MAX_LIST_LEN}: {_AS_ARRAYS}"
        ) from None


def _pack_default(obj: Any) -> Any:
    """openpi's ``pack_array``: ndarrays and numpy scalars as maps with bin keys; other types are msgpack's own."""
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind in ("V", "O", "c"):
        raise ValueError(f"unsupported dtype {obj.dtype} (object, void and complex arrays are not sent)")
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot send a {type(obj).__name__}; send numpy arrays, numbers, strings, lists and dicts")


def packb(obj: Any) -> bytes:
    """``obj`` as msgpack bytes, arrays in openpi's layout (byte for byte what ``openpi_client`` writes)."""
    return msgpack.packb(obj, default=_pack_default)


def _get(m: dict, key: str) -> Any:
    """A field of an ndarray map, under a bin key (openpi's packer) or a str key (other packers)."""
    if key.encode() in m:
        return m[key.encode()]
    return m.get(key)


def _dtype(value: Any) -> np.dtype:
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str) or len(value) > 8:
        raise DecodeError(f"an array's dtype must be a short string such as '<f4', got {value!r}")
    try:
        dtype = np.dtype(value)
    except TypeError as err:
        raise DecodeError(f"unknown dtype {value!r}: {err}") from None
    if dtype.kind not in _ALLOWED_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise DecodeError(f"dtype {value!r} is refused: send bool, integer or float arrays (images as uint8)")
    return dtype


def _object_hook(m: dict) -> Any:
    if _get(m, "__ndarray__") is True:
        dtype = _dtype(_get(m, "dtype"))
        shape, data = _get(m, "shape"), _get(m, "data")
        if not isinstance(shape, (list, tuple)) or len(shape) > MAX_NDIM:
            raise DecodeError(f"an array's shape must be a list of at most {MAX_NDIM} sizes, got {shape!r}")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            raise DecodeError(f"an array's shape must hold non-negative integers, got {shape!r}")
        if not isinstance(data, bytes):
            raise DecodeError(f"an array's data must be bytes (msgpack bin), got {type(data).__name__}")
        expected = math.prod(shape) * dtype.itemsize
        if expected != len(data):
            raise DecodeError(
                f"an array of shape {list(shape)} and dtype {dtype.str} needs {expected} bytes, got {len(data)}"
            )
        return np.frombuffer(data, dtype=dtype).reshape(shape)  # read-only view of the message's bytes
    if _get(m, "__npgeneric__") is True:
        dtype = _dtype(_get(m, "dtype"))
        value = _get(m, "data")
        if not isinstance(value, (bool, int, float)):
            raise DecodeError(f"a numpy scalar's data must be a number, got {type(value).__name__}")
        try:
            return dtype.type(value)
        except (OverflowError, ValueError, TypeError) as err:  # 1000 as uint8, -1 as uint64
            raise DecodeError(
                f"a numpy scalar's data {value!r} does not fit its dtype {dtype.str} ({err}); send a value the dtype "
                "holds"
            ) from None
    return m


def _check_depth(obj: Any, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise DecodeError(f"the message nests deeper than {MAX_DEPTH} levels; send a flat map of arrays and strings")
    if isinstance(obj, dict):
        for value in obj.values():
            _check_depth(value, depth + 1)
    elif isinstance(obj, list):
        for value in obj:
            _check_depth(value, depth + 1)


def describe_bytes(data: bytes | bytearray | memoryview, head: int = 16) -> str:
    """``"13 bytes starting b'\\xc1 not msgpack'"``: what arrived, for an error reply (the first ``head`` bytes)."""
    data = bytes(data)
    if not data:
        return "an empty message (0 bytes)"
    shown = repr(data[:head]) + ("..." if len(data) > head else "")
    return f"{len(data)} bytes starting {shown}"


def describe_failure(err: Exception) -> str:
    """msgpack's reason, or the exception's name where msgpack gives none (its FormatError is often empty)."""
    reason = str(err).strip()
    if isinstance(err, msgpack.FormatError) and not reason:
        return "malformed msgpack"
    return reason or type(err).__name__


def _led_by_its_key(data: bytes, err: DecodeError) -> str:
    """``err``'s text led by the top-level key whose value it is about (``_object_hook`` sees an array, not its key):
    the message read again as plain msgpack, each value's arrays checked alone. Only on the error path."""
    try:
        plain = _bounded_unpackb(bytes(data), ext_hook=lambda code, payload: None)
    except Exception:  # noqa: BLE001 - no better text than the error itself
        return str(err)
    for key, value in plain.items() if isinstance(plain, dict) else ():
        try:
            msgpack.unpackb(msgpack.packb(value), object_hook=_object_hook, strict_map_key=False, raw=False)
        except DecodeError:
            return f"'{key.decode('utf-8', 'replace') if isinstance(key, bytes) else key}': {err}"
        except Exception:  # noqa: BLE001 - a value that does not pack again is not the one
            continue
    return str(err)


def unpackb(data: bytes) -> Any:
    """Bytes from ``packb`` (or openpi's packer) -> the object, arrays as read-only numpy arrays.

    Raises ``DecodeError`` for anything that is not plain msgpack with numeric arrays (see the module docstring).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"expected a binary message (msgpack), got {type(data).__name__}")

    def no_ext(code: int, payload: bytes) -> Any:
        raise DecodeError(f"msgpack extension type {code} is refused; send plain msgpack")

    try:
        obj = _bounded_unpackb(bytes(data), object_hook=_object_hook, ext_hook=no_ext)
    except _TooLarge:
        raise
    except DecodeError as err:
        raise DecodeError(_led_by_its_key(data, err)) from None
    except msgpack.StackError:  # msgpack's own nesting limit, far past ours
        raise DecodeError(
            f"the message nests deeper than {MAX_DEPTH} levels; send a flat map of arrays and strings"
        ) from None
    except (msgpack.ExtraData, msgpack.FormatError, ValueError, TypeError) as err:
        raise DecodeError(
            f"not a msgpack message ({describe_failure(err)}): received {describe_bytes(data)}; send "
            "an observation map packed with msgpack-numpy (openpi_client.msgpack_numpy.packb or "
            "vla.serve.packb)"
        ) from None
    _check_depth(obj)
    return obj
