"""Sealed DHT values: identity keys, signatures bound to key/subkey/expiration, ownership rules, the
validator hivemind calls, the choice among several runs, and fuzzing of every parser with garbage."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils.serializer import MSGPackSerializer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwtfp2p.config import RunSpec
from gwtfp2p.dht.identity import IdentityError, NodeKey, decode_key_proto, peer_id_of, verify
from gwtfp2p.dht.records import NodeRecord, RecordError, RunSpecRecord, encode_record
from gwtfp2p.dht.run_choice import choose_run
from gwtfp2p.dht.sealed import CURRENT_RUN_KEY, check_entry, open_entries, seal, unseal
from gwtfp2p.dht.validator import SealedValueValidator

pytestmark = pytest.mark.timeout(120)
ALICE, MALLORY = NodeKey.generate(), NodeKey.generate()
RSA_KEY = NodeKey.generate("rsa")
SPEC = RunSpec(n_stages=2, seed=3)
RUN = RunSpecRecord.from_spec(SPEC).run_id
NODES = f"gwtf/{RUN}/nodes"
EXPIRES = 1_700_000_000.5


def node(peer: str, **fields) -> NodeRecord:
    return NodeRecord(**{"run_id": RUN, "peer_id": peer, "role": "relay", "stage": 1, "state": "online", **fields})


def record(key: str, subkey: str, value: bytes, expiration: float = EXPIRES) -> DHTRecord:
    """What hivemind hands a validator: the key's DHT id, msgpack subkey and value."""
    sub = MSGPackSerializer.dumps(subkey) if subkey else MSGPackSerializer.dumps(None)
    return DHTRecord(DHTID.generate(source=key).to_bytes(), sub, MSGPackSerializer.dumps(value), expiration)


def test_identity_keys_name_their_peer_ids() -> None:
    for key in (ALICE, RSA_KEY):
        again = NodeKey.from_private_proto(key.private_proto())
        assert again.peer_id == key.peer_id == peer_id_of(key.public_key_proto)
        signature = key.sign(b"message")
        assert verify(key.peer_id, key.public_key_proto, b"message", signature)
        assert not verify(key.peer_id, key.public_key_proto, b"massage", signature)
        assert not verify(MALLORY.peer_id, key.public_key_proto, b"message", signature)  # key of another id
    assert RSA_KEY.peer_id.startswith("Qm") and ALICE.peer_id.startswith("12D3KooW")


def test_a_node_record_verifies_under_its_owner_only() -> None:
    raw = seal(ALICE, NODES, ALICE.peer_id, EXPIRES, encode_record(node(ALICE.peer_id)))
    sealed = unseal(raw)
    assert sealed.signer == ALICE.peer_id and sealed.key == NODES and sealed.expiration == EXPIRES
    check_entry(sealed)
    assert SealedValueValidator().validate(record(NODES, ALICE.peer_id, raw))
    for moved in (record(NODES + "x", ALICE.peer_id, raw), record(NODES, MALLORY.peer_id, raw),
                  record(NODES, ALICE.peer_id, raw, EXPIRES + 3600)):  # replayed elsewhere or later
        assert not SealedValueValidator().validate(moved)


@pytest.mark.parametrize("attack", ["overwrite", "claim", "plain", "unsigned", "tampered", "other_run"])
def test_forgeries_are_refused(attack: str) -> None:
    """Mallory overwrites Alice's record, claims her id, stores a plain value over the dictionary,
    drops the signature, edits a signed record, or moves a record to another run's key."""
    payload = encode_record(node(ALICE.peer_id, state="leaving"))
    raw, subkey, key = seal(MALLORY, NODES, ALICE.peer_id, EXPIRES, payload), ALICE.peer_id, NODES
    if attack == "claim":
        raw, subkey = seal(MALLORY, NODES, MALLORY.peer_id, EXPIRES, payload), MALLORY.peer_id
    elif attack == "plain":
        raw, subkey = seal(MALLORY, NODES, "", EXPIRES, b"[]"), ""
    elif attack == "unsigned":
        raw = seal(None, NODES, ALICE.peer_id, EXPIRES, payload)
    elif attack == "tampered":
        good = seal(ALICE, NODES, ALICE.peer_id, EXPIRES, encode_record(node(ALICE.peer_id)))
        raw = good.replace(b'"online"', b'"leaving"')
    elif attack == "other_run":
        raw = seal(ALICE, NODES.replace(RUN, "f" * 16), ALICE.peer_id, EXPIRES, encode_record(node(ALICE.peer_id)))
        key = NODES.replace(RUN, "f" * 16)
    assert not SealedValueValidator().validate(record(key, subkey, raw))
    assert open_entries({subkey: _Entry(raw)}, key) == {}


def test_run_specs_are_owned_by_their_publisher() -> None:
    spec = encode_record(RunSpecRecord.from_spec(SPEC, published_by=ALICE.peer_id))
    good = seal(ALICE, CURRENT_RUN_KEY, ALICE.peer_id, EXPIRES, spec)
    assert SealedValueValidator().validate(record(CURRENT_RUN_KEY, ALICE.peer_id, good))
    stolen = seal(MALLORY, CURRENT_RUN_KEY, MALLORY.peer_id, EXPIRES, spec)  # published_by is Alice
    assert not SealedValueValidator().validate(record(CURRENT_RUN_KEY, MALLORY.peer_id, stolen))
    garbage = seal(MALLORY, CURRENT_RUN_KEY, MALLORY.peer_id, EXPIRES, b"{}")
    assert not SealedValueValidator().validate(record(CURRENT_RUN_KEY, MALLORY.peer_id, garbage))
    wrong_run = seal(ALICE, f"gwtf/{'e' * 16}/spec", ALICE.peer_id, EXPIRES, spec)
    assert not SealedValueValidator().validate(record(f"gwtf/{'e' * 16}/spec", ALICE.peer_id, wrong_run))


def test_unsigned_swarms_keep_the_binding_rules() -> None:
    payload = encode_record(node(ALICE.peer_id))
    unsigned = SealedValueValidator(verify_signatures=False)
    assert unsigned.validate(record(NODES, ALICE.peer_id, seal(None, NODES, ALICE.peer_id, EXPIRES, payload)))
    assert not unsigned.validate(record(NODES, MALLORY.peer_id, seal(None, NODES, MALLORY.peer_id, EXPIRES, payload)))


def test_the_run_of_the_initial_peers_is_chosen() -> None:
    honest = RunSpecRecord.from_spec(SPEC, published_by=ALICE.peer_id)
    other = RunSpecRecord.from_spec(dataclasses.replace(SPEC, seed=99), published_by=MALLORY.peer_id)
    runs = {ALICE.peer_id: honest, MALLORY.peer_id: other}
    assert choose_run(runs, {}, [ALICE.peer_id]) == honest
    relay = "QmRelayOfTheHonestRun"
    members = {honest.run_id: {ALICE.peer_id, relay}, other.run_id: {MALLORY.peer_id, "a", "b"}}
    assert choose_run(runs, members, [relay]) == honest
    assert choose_run(runs, members, ["QmStranger"]) == other  # no hint: the larger swarm
    assert choose_run({}, {}, [ALICE.peer_id]) is None


class _Entry:
    def __init__(self, value: object) -> None:
        self.value = value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600), st.text(max_size=80), st.floats(allow_nan=True))
def test_garbage_never_validates_nor_raises(raw: bytes, subkey: str, expiration: float) -> None:
    validator = SealedValueValidator()
    assert not validator.validate(DHTRecord(raw[:20], raw[20:40], raw, expiration))
    assert not validator.validate(record(NODES, subkey, raw, expiration))
    with pytest.raises(RecordError):
        unseal(raw)
    assert open_entries({subkey: _Entry(raw)}, NODES) == {}


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_corrupted_seals_are_refused(data: st.DataObject) -> None:
    """Flip, cut or extend a valid sealed value anywhere: it never validates and never raises."""
    raw = bytearray(seal(ALICE, NODES, ALICE.peer_id, EXPIRES, encode_record(node(ALICE.peer_id))))
    position = data.draw(st.integers(0, len(raw) - 1))
    how = data.draw(st.sampled_from(["flip", "cut", "extend"]))
    if how == "flip":
        raw[position] ^= data.draw(st.integers(1, 255))
    elif how == "cut":
        del raw[position:]
    else:
        raw[position:position] = data.draw(st.binary(min_size=1, max_size=16))
    assert not SealedValueValidator().validate(record(NODES, ALICE.peer_id, bytes(raw)))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_key_protobufs_parse_or_fail_cleanly(raw: bytes) -> None:
    with contextlib.suppress(IdentityError):
        decode_key_proto(raw)
    assert not verify(peer_id_of(raw), raw, b"m", b"s" * 64)
    with pytest.raises(IdentityError):
        NodeKey.from_private_proto(raw + b"\xff")


def test_admitted_lists_are_owned_and_of_their_run() -> None:
    from gwtfp2p.dht.records import AdmittedRecord

    key = f"gwtf/{RUN}/admitted"
    mine = encode_record(AdmittedRecord(run_id=RUN, peers=(MALLORY.peer_id,)))
    assert SealedValueValidator().validate(record(key, ALICE.peer_id, seal(ALICE, key, ALICE.peer_id, EXPIRES, mine)))
    forged = seal(MALLORY, key, ALICE.peer_id, EXPIRES, mine)  # her list under the creator's name
    assert not SealedValueValidator().validate(record(key, ALICE.peer_id, forged))
    other = encode_record(AdmittedRecord(run_id="f" * 16, peers=()))
    assert not SealedValueValidator().validate(record(key, ALICE.peer_id, seal(ALICE, key, ALICE.peer_id, EXPIRES,
                                                                                other)))
