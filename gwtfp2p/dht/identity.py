"""A node's libp2p identity key: load the key file p2pd uses, derive its peer id, sign and verify.

A libp2p peer id names a public key: the sha2-256 multihash of the protobuf-encoded key (RSA, as
hivemind generates them), or the key itself inline (Ed25519). So whoever signs with the key of a
file given to p2pd (``--identity``) can prove it is that peer, and anyone holding the public key
can check a signature *and* that the key belongs to the peer id it claims. Keys travel in
libp2p's protobuf form (``public_key_proto``). No I/O besides reading the key file; no hivemind.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa

RSA, ED25519 = 0, 1  # libp2p's KeyType values
MAX_KEY_PROTO_BYTES = 2048  # an RSA-4096 public key is ~550 bytes
MAX_SIGNATURE_BYTES = 512
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


class IdentityError(ValueError):
    """A key file or public key that is not a usable libp2p identity."""


def b58encode(data: bytes) -> str:
    number, text = int.from_bytes(data, "big"), ""
    while number:
        number, digit = divmod(number, 58)
        text = _B58[digit] + text
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + text


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _read_varint(data: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while offset < len(data) and shift < 64:
        byte = data[offset]
        value |= (byte & 0x7F) << shift
        offset, shift = offset + 1, shift + 7
        if not byte & 0x80:
            return value, offset
    raise IdentityError("truncated varint in a key protobuf")


def encode_key_proto(key_type: int, data: bytes) -> bytes:
    """libp2p's ``PublicKey``/``PrivateKey`` protobuf: field 1 the type, field 2 the key bytes."""
    return b"\x08" + _varint(key_type) + b"\x12" + _varint(len(data)) + data


def decode_key_proto(raw: bytes) -> tuple[int, bytes]:
    """(key type, key bytes) of a libp2p key protobuf; ``IdentityError`` on anything else."""
    if not isinstance(raw, (bytes, bytearray)) or len(raw) > 16 * 1024:
        raise IdentityError("a key protobuf is at most 16 KiB of bytes")
    key_type, data, offset = None, None, 0
    while offset < len(raw):
        tag, offset = _read_varint(raw, offset)
        if tag == 0x08:
            key_type, offset = _read_varint(raw, offset)
        elif tag == 0x12:
            size, offset = _read_varint(raw, offset)
            if offset + size > len(raw):
                raise IdentityError("truncated key bytes in a key protobuf")
            data, offset = bytes(raw[offset:offset + size]), offset + size
        else:
            raise IdentityError(f"unexpected field tag {tag} in a key protobuf")
    if key_type is None or data is None:
        raise IdentityError("a key protobuf needs a key type and key bytes")
    return key_type, data


def peer_id_of(public_key_proto: bytes) -> str:
    """The base58 peer id of a protobuf public key: inline (identity multihash) up to 42 bytes, else sha2-256."""
    if len(public_key_proto) <= 42:
        return b58encode(b"\x00" + bytes([len(public_key_proto)]) + public_key_proto)
    return b58encode(b"\x12\x20" + hashlib.sha256(public_key_proto).digest())


class NodeKey:
    """A private identity key (RSA or Ed25519): its peer id, its public key protobuf, signatures."""

    def __init__(self, private_key: rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey) -> None:
        self._key = private_key
        public = private_key.public_key()
        if isinstance(public, rsa.RSAPublicKey):
            der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
            self.public_key_proto = encode_key_proto(RSA, der)
        else:
            raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            self.public_key_proto = encode_key_proto(ED25519, raw)
        self.peer_id = peer_id_of(self.public_key_proto)

    @classmethod
    def load(cls, path: str | Path) -> NodeKey:
        """The key in a libp2p private-key file (what hivemind's ``identity_path`` and p2pd's ``-id`` take)."""
        try:
            raw = Path(path).read_bytes()
        except OSError as e:
            raise IdentityError(f"cannot read the identity file {str(path)!r}: {e}") from e
        return cls.from_private_proto(raw)

    @classmethod
    def from_private_proto(cls, raw: bytes) -> NodeKey:
        key_type, data = decode_key_proto(raw)
        try:
            if key_type == RSA:
                key = serialization.load_der_private_key(data, password=None)
                if isinstance(key, rsa.RSAPrivateKey):
                    return cls(key)
            elif key_type == ED25519 and len(data) in (32, 64):
                return cls(ed25519.Ed25519PrivateKey.from_private_bytes(data[:32]))
        except ValueError as e:
            raise IdentityError(f"not a valid private key: {e}") from e
        raise IdentityError(f"unsupported identity key type {key_type} (RSA or Ed25519 expected)")

    @classmethod
    def generate(cls, kind: str = "ed25519") -> NodeKey:
        """A fresh key (tests and tools; a node's key is the one its p2pd uses)."""
        if kind == "rsa":
            return cls(rsa.generate_private_key(public_exponent=65537, key_size=2048))
        return cls(ed25519.Ed25519PrivateKey.generate())

    def private_proto(self) -> bytes:
        """The key as a libp2p private-key file's bytes."""
        if isinstance(self._key, rsa.RSAPrivateKey):
            der = self._key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL,
                                          serialization.NoEncryption())
            return encode_key_proto(RSA, der)
        seed = self._key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                       serialization.NoEncryption())
        public = self.public_key_proto[-32:]
        return encode_key_proto(ED25519, seed + public)

    def sign(self, message: bytes) -> bytes:
        if isinstance(self._key, rsa.RSAPrivateKey):
            return self._key.sign(message, padding.PKCS1v15(), hashes.SHA256())
        return self._key.sign(message)


@functools.lru_cache(maxsize=4096)
def _public_key(peer_id: str, public_key_proto: bytes) -> rsa.RSAPublicKey | ed25519.Ed25519PublicKey | None:
    """The public key, if ``public_key_proto`` parses and names ``peer_id``; None otherwise (cached)."""
    if len(public_key_proto) > MAX_KEY_PROTO_BYTES or peer_id_of(public_key_proto) != peer_id:
        return None
    try:
        key_type, data = decode_key_proto(public_key_proto)
        if key_type == RSA:
            key = serialization.load_der_public_key(data)
            return key if isinstance(key, rsa.RSAPublicKey) and key.key_size >= 2048 else None
        if key_type == ED25519 and len(data) == 32:
            return ed25519.Ed25519PublicKey.from_public_bytes(data)
    except (IdentityError, ValueError):
        return None
    return None


def verify(peer_id: str, public_key_proto: bytes, message: bytes, signature: bytes) -> bool:
    """Whether ``signature`` of ``message`` was made by the key ``public_key_proto`` and that key is ``peer_id``."""
    if not isinstance(signature, (bytes, bytearray)) or not 0 < len(signature) <= MAX_SIGNATURE_BYTES:
        return False
    key = _public_key(peer_id, bytes(public_key_proto))
    if key is None:
        return False
    try:
        if isinstance(key, rsa.RSAPublicKey):
            key.verify(bytes(signature), message, padding.PKCS1v15(), hashes.SHA256())
        else:
            key.verify(bytes(signature), message)
    except InvalidSignature:
        return False
    return True
