"""Wire codec of flow-protocol messages: dataclass ↔ compact JSON bytes, strictly validated.

Bytes from the network are untrusted: every field is checked against the message's declared
type (strings and sequences bounded, numbers finite except an explicit "inf" cost, no unknown
or missing fields), and any violation raises ``WireError``. Owns no transport.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from functools import cache

from gwtfp2p.flow import messages as m

MAX_MESSAGE_BYTES = 256 * 1024
MAX_STRING = 256
MAX_ITEMS = 4096
INF_TOKEN = "inf"

MESSAGE_TYPES: dict[str, type] = {cls.__name__: cls for cls in (
    m.Advert, m.Request, m.Accept, m.Reject, m.Refresh, m.Cancel, m.PushBack, m.Moved, m.FlowTable,
    m.ProposeTakeover, m.ProposeSwap, m.ProposeExchange, m.MoveAnswer, m.SwapCommit, m.Residual, m.Augment)}


class WireError(ValueError):
    """Bytes that are not a valid flow message."""


def encode_message(message: m.Message) -> bytes:
    """Serialize one message (its class name plus its fields)."""
    name = type(message).__name__
    if name not in MESSAGE_TYPES:
        raise WireError(f"not a flow message: {name}")
    return json.dumps({"t": name, "m": _encode(message)}, separators=(",", ":")).encode()


def decode_message(data: bytes) -> m.Message:
    """Parse and validate one message; raises WireError on anything malformed."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"not JSON: {exc}") from exc
    if not isinstance(raw, dict) or set(raw) != {"t", "m"} or raw["t"] not in MESSAGE_TYPES:
        raise WireError("expected {'t': <message type>, 'm': {...}}")
    return _decode(MESSAGE_TYPES[raw["t"]], raw["m"], raw["t"])


def _encode(value):
    if dataclasses.is_dataclass(value):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    if isinstance(value, float) and math.isinf(value) and value > 0:
        return INF_TOKEN
    return value


@cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _decode(tp, raw, where: str):
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, raw, where)
    if origin in (types.UnionType, typing.Union):
        options = typing.get_args(tp)
        if raw is None and type(None) in options:
            return None
        inner = [o for o in options if o is not type(None)]
        return _decode(inner[0], raw, where)
    if origin is tuple:
        return _decode_tuple(tp, raw, where)
    return _decode_scalar(tp, raw, where)


def _decode_dataclass(cls: type, raw, where: str):
    if not isinstance(raw, dict):
        raise WireError(f"{where}: expected an object")
    names = {f.name for f in dataclasses.fields(cls)}
    if set(raw) != names:
        raise WireError(f"{where}: fields {sorted(raw)} != {sorted(names)}")
    hints = _hints(cls)
    return cls(**{name: _decode(hints[name], raw[name], f"{where}.{name}") for name in names})


def _decode_tuple(tp, raw, where: str):
    if not isinstance(raw, list) or len(raw) > MAX_ITEMS:
        raise WireError(f"{where}: expected a list of at most {MAX_ITEMS} items")
    args = typing.get_args(tp)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(raw))
    if len(raw) != len(args):
        raise WireError(f"{where}: expected {len(args)} items")
    return tuple(_decode(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, raw, strict=True)))


def _decode_scalar(tp, raw, where: str):
    if tp is str:
        if not isinstance(raw, str) or len(raw) > MAX_STRING:
            raise WireError(f"{where}: expected a string of at most {MAX_STRING} characters")
        return raw
    if tp is bool:
        if not isinstance(raw, bool):
            raise WireError(f"{where}: expected a boolean")
        return raw
    if tp is int:
        if isinstance(raw, bool) or not isinstance(raw, int) or abs(raw) > 2**53:
            raise WireError(f"{where}: expected an integer")
        return raw
    if tp is float:
        if raw == INF_TOKEN:
            return math.inf
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
            raise WireError(f"{where}: expected a finite number or 'inf'")
        return float(raw)
    raise WireError(f"{where}: unsupported type {tp!r}")
