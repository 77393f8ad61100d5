"""Signed DHT values: every value gwtf stores is sealed by its owner and bound to where it is stored.

A sealed value carries the key, subkey and expiration it is stored under, the signer's public key
and a signature over all of them and the payload (``seal``). ``unseal`` checks the signature and that
the key names the peer id it claims; ``check_entry`` holds the ownership rules of gwtf's keys: a node
record lives under its own peer id and names it, a run spec under its publisher's, and a key under
``gwtf/`` is only ever a dictionary of such owned entries. A replayed value cannot move to another
key, subkey or expiration; a forged one does not verify. Pure: no I/O, no hivemind.
"""

from __future__ import annotations

import logging
import re
import struct
from dataclasses import dataclass

from gwtfp2p.dht.identity import MAX_KEY_PROTO_BYTES, MAX_SIGNATURE_BYTES, NodeKey, peer_id_of, verify
from gwtfp2p.dht.records import (
    RUN_ID_HEX_CHARS,
    RecordError,
    parse_admitted_record,
    parse_node_record,
    parse_run_spec_record,
)

logger = logging.getLogger(__name__)
MAGIC = b"GWS1"
DOMAIN = b"gwtf-dht-value-v1\0"
MAX_KEY_CHARS = 256
MAX_SUBKEY_CHARS = 128
GWTF_PREFIX = "gwtf/"
CURRENT_RUN_KEY = "gwtf/current-run"
_RUN_KEY = re.compile(rf"^gwtf/([0-9a-f]{{{RUN_ID_HEX_CHARS}}})/(spec|nodes|admitted)$")
_U16 = struct.Struct(">H")
_F64 = struct.Struct(">d")


@dataclass(frozen=True)
class Sealed:
    """An opened value: where it was sealed to be stored, by whom, and what it holds."""

    key: str
    subkey: str  # "" for a value without a subkey
    expiration: float
    signer: str  # the peer id of the key that signed it ("" when unsigned)
    payload: bytes
    public_key: bytes = b""  # the signer's public key (libp2p protobuf; empty when unsigned)


def signing_message(key: str, subkey: str, expiration: float, payload: bytes) -> bytes:
    k, s = key.encode(), subkey.encode()
    return DOMAIN + _U16.pack(len(k)) + k + _U16.pack(len(s)) + s + _F64.pack(expiration) + payload


def seal(node_key: NodeKey | None, key: str, subkey: str, expiration: float, payload: bytes) -> bytes:
    """The bytes to store: ``payload`` bound to (key, subkey, expiration), signed by ``node_key``
    (None: unsigned, for swarms that run with signatures off)."""
    if len(key) > MAX_KEY_CHARS or len(subkey) > MAX_SUBKEY_CHARS:
        raise RecordError(f"DHT key of {len(key)} or subkey of {len(subkey)} characters is too long")
    public, signature = b"", b""
    if node_key is not None:
        public, signature = node_key.public_key_proto, node_key.sign(signing_message(key, subkey, expiration, payload))
    k, s = key.encode(), subkey.encode()
    return b"".join((MAGIC, _U16.pack(len(k)), k, _U16.pack(len(s)), s, _F64.pack(expiration),
                     _U16.pack(len(public)), public, _U16.pack(len(signature)), signature, payload))


def _take(raw: bytes, offset: int, limit: int, what: str) -> tuple[bytes, int]:
    if offset + 2 > len(raw):
        raise RecordError(f"sealed value truncated before its {what}")
    (size,) = _U16.unpack_from(raw, offset)
    offset += 2
    if size > limit or offset + size > len(raw):
        raise RecordError(f"sealed value: bad {what} length {size}")
    return raw[offset:offset + size], offset + size


def unseal(raw: object, *, verify_signature: bool = True) -> Sealed:
    """Open a sealed value; ``RecordError`` unless it parses and (``verify_signature``) its signature holds
    and its key names its signer. Without verification the signer is whoever the subkey claims."""
    if not isinstance(raw, (bytes, bytearray)) or not bytes(raw[:4]) == MAGIC:
        raise RecordError("not a sealed gwtf value")
    raw = bytes(raw)
    key_bytes, offset = _take(raw, 4, MAX_KEY_CHARS, "key")
    subkey_bytes, offset = _take(raw, offset, MAX_SUBKEY_CHARS, "subkey")
    if offset + 8 > len(raw):
        raise RecordError("sealed value truncated before its expiration")
    (expiration,) = _F64.unpack_from(raw, offset)
    public, offset = _take(raw, offset + 8, MAX_KEY_PROTO_BYTES, "public key")
    signature, offset = _take(raw, offset, MAX_SIGNATURE_BYTES, "signature")
    try:
        key, subkey = key_bytes.decode(), subkey_bytes.decode()
    except UnicodeDecodeError as e:
        raise RecordError("sealed value: key or subkey is not UTF-8") from e
    payload = raw[offset:]
    if not verify_signature:
        return Sealed(key, subkey, expiration, peer_id_of(public) if public else subkey, payload, public)
    if not public:
        raise RecordError(f"unsigned value under {key!r}/{subkey!r}: this swarm requires signed records")
    signer = peer_id_of(public)
    if not verify(signer, public, signing_message(key, subkey, expiration, payload), signature):
        raise RecordError(f"bad signature on the value under {key!r}/{subkey!r}")
    return Sealed(key, subkey, expiration, signer, payload, public)


def check_entry(sealed: Sealed) -> None:
    """The ownership rules of gwtf's keys; ``RecordError`` naming the broken one.

    Every entry under ``gwtf/`` lives under a subkey that is its signer's peer id. ``gwtf/<run>/nodes``
    holds that peer's ``NodeRecord`` of run ``<run>``; ``gwtf/<run>/spec`` and ``gwtf/current-run``
    hold a ``RunSpecRecord`` published by that peer (of run ``<run>`` for the former);
    ``gwtf/<run>/admitted`` the peers that peer admits to run ``<run>`` (only its creator's count). Other keys
    only need their subkey, if any, to be the signer's.
    """
    key, subkey, signer = sealed.key, sealed.subkey, sealed.signer
    if subkey and subkey != signer:
        raise RecordError(f"the entry under {key!r}/{subkey!r} is signed by {signer}, not by its owner")
    if not key.startswith(GWTF_PREFIX):
        return
    if not subkey:
        raise RecordError(f"{key!r} holds only entries owned by a peer (a subkey), not a plain value")
    run = _RUN_KEY.match(key)
    if key == CURRENT_RUN_KEY or (run and run.group(2) == "spec"):
        spec = parse_run_spec_record(sealed.payload)
        if spec.published_by != signer:
            raise RecordError(f"a run spec under {key!r} published by {spec.published_by}, signed by {signer}")
        if run and spec.run_id != run.group(1):
            raise RecordError(f"the spec under {key!r} is of run {spec.run_id}")
    elif run and run.group(2) == "admitted":
        if parse_admitted_record(sealed.payload).run_id != run.group(1):
            raise RecordError(f"the admitted peers under {key!r} are of another run")
    elif run:
        node = parse_node_record(sealed.payload)
        if node.peer_id != signer or node.run_id != run.group(1) or node.public_key:
            raise RecordError(f"a node record of {node.peer_id} (run {node.run_id}) under {key!r}/{subkey!r}")


def open_entries(value: object, key: str, *, verify_signature: bool = True) -> dict[str, Sealed]:
    """The valid entries of a dictionary value read under ``key`` (hivemind's ``{subkey: ValueWithExpiration}``),
    by subkey: entries that do not unseal, were sealed for another place or break ``check_entry`` are dropped."""
    if not isinstance(value, dict):
        return {}
    entries: dict[str, Sealed] = {}
    for subkey, entry in value.items():
        try:
            sealed = unseal(getattr(entry, "value", None), verify_signature=verify_signature)
            if sealed.key != key or sealed.subkey != subkey:
                raise RecordError(f"sealed for {sealed.key!r}/{sealed.subkey!r}")
            check_entry(sealed)
        except RecordError as e:
            logger.debug("dropping the entry under %r/%r: %s", key, subkey, e)
            continue
        entries[subkey] = sealed
    return entries
