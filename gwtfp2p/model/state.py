"""Weights + optimizer state of one trainable part as bytes, and its content hash.

Owns the byte format (``torch.save`` of plain containers, read back with ``weights_only=True``
so untrusted bytes cannot run code) and the hash: SHA-256 over every weight and optimizer-state
tensor's name, dtype, shape and raw bytes in a canonical order, shortened to 16 hex digits. The
hash depends on content only, never on the byte encoding. It does not move bytes anywhere.
"""

from __future__ import annotations

import hashlib
import io
from typing import Any

import torch
from torch import nn

STATE_FORMAT = 1
HASH_HEX_DIGITS = 16
HASHED_GROUP_KEYS = ("params", "lr", "betas", "eps", "weight_decay")


class StateError(ValueError):
    """State bytes are malformed, belong to another part or model, or fail their hash."""


def _feed_tensor(digest: Any, name: str, tensor: torch.Tensor) -> None:
    t = tensor.detach().to("cpu").contiguous()
    digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
    digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def _feed_value(digest: Any, name: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        _feed_tensor(digest, name, value)
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            _feed_value(digest, f"{name}.{key}", value[key])
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _feed_value(digest, f"{name}[{i}]", item)
    else:
        digest.update(f"{name}={value!r}|".encode())


def _hash(weights: Any, optimizer_state: Any | None) -> str:
    digest = hashlib.sha256()
    _feed_value(digest, "w", dict(weights))
    if optimizer_state is not None:
        groups = optimizer_state.get("param_groups") or []
        _feed_value(digest, "o", {  # hyper-parameters only: implementation flags vary across torch versions
            "state": optimizer_state.get("state"),
            "groups": [{k: g.get(k) for k in HASHED_GROUP_KEYS} if isinstance(g, dict) else g for g in groups]})
    return digest.hexdigest()[:HASH_HEX_DIGITS]


def weights_hash(module: nn.Module) -> str:
    """Short hex hash of a module's weights (its state_dict, names sorted)."""
    return _hash(module.state_dict(), None)


def state_hash(module: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """Short hex hash of weights and optimizer state (moments, step counts, hyper-parameters)."""
    return _hash(module.state_dict(), optimizer.state_dict())


def dump_state(kind: str, module: nn.Module, optimizer: torch.optim.Optimizer) -> bytes:
    """Bytes holding ``kind`` (e.g. ``stage3``), the weights, the optimizer state and their hash."""
    payload = {"format": STATE_FORMAT, "kind": kind, "hash": state_hash(module, optimizer),
               "weights": {k: v.detach().to("cpu") for k, v in module.state_dict().items()},
               "optimizer": optimizer.state_dict()}
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def load_state(data: bytes, kind: str, module: nn.Module, optimizer: torch.optim.Optimizer,
               expected_hash: str | None = None) -> str:
    """Load bytes from ``dump_state`` into ``module``/``optimizer``; returns the verified hash.

    Raises ``StateError`` before touching the part if the bytes are not a state of ``kind``, their
    content does not hash to the recorded (and, if given, the expected) hash, or their names and
    shapes do not fit the module.
    """
    try:
        payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for bad bytes
        raise StateError(f"state bytes are not readable: {exc}") from exc
    if not isinstance(payload, dict) or payload.get("format") != STATE_FORMAT:
        raise StateError("state bytes have an unknown format")
    if payload.get("kind") != kind:
        raise StateError(f"state bytes belong to {payload.get('kind')!r}, not {kind!r}")
    weights, opt_state, recorded = payload.get("weights"), payload.get("optimizer"), payload.get("hash")
    if not isinstance(weights, dict) or not isinstance(opt_state, dict):
        raise StateError("state bytes lack weights or optimizer state")
    actual = _hash(weights, opt_state)
    if actual != recorded or (expected_hash is not None and actual != expected_hash):
        raise StateError(f"state content hashes to {actual}; recorded {recorded!r}, "
                         f"expected {expected_hash!r}")
    _check_fits(weights, opt_state, module, optimizer)
    module.load_state_dict(weights, strict=True)
    optimizer.load_state_dict(opt_state)
    return actual


def _check_fits(weights: dict, opt_state: dict, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    own = module.state_dict()
    if set(weights) != set(own):
        raise StateError(f"state names differ from this part's: {sorted(set(weights) ^ set(own))[:4]}")
    for name, mine in own.items():
        theirs = weights[name]
        same = isinstance(theirs, torch.Tensor) and (theirs.shape, theirs.dtype) == (mine.shape, mine.dtype)
        if not same:
            raise StateError(f"state tensor {name} does not fit: expected {tuple(mine.shape)} "
                             f"{mine.dtype}")
    groups = opt_state.get("param_groups")
    own_groups = optimizer.state_dict()["param_groups"]
    theirs_params = [g.get("params") if isinstance(g, dict) else None for g in groups or []]
    if not isinstance(groups, list) or theirs_params != [g["params"] for g in own_groups]:
        raise StateError("optimizer state does not fit this part's parameter groups")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    states = opt_state.get("state")
    if not isinstance(states, dict):
        raise StateError("optimizer state lacks its per-parameter state")
    for index, entry in states.items():
        if not (isinstance(index, int) and 0 <= index < len(params) and isinstance(entry, dict)):
            raise StateError(f"optimizer state names an unknown parameter {index!r}")
        for key, value in entry.items():
            if key != "step" and (not isinstance(value, torch.Tensor) or value.shape != params[index].shape):
                raise StateError(f"optimizer state {key} of parameter {index} does not fit")
