"""DHT wire records: round trips, run ids, strict rejection of garbage, size bounds."""

from __future__ import annotations

import contextlib
import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtfp2p.config import RunSpec
from gwtfp2p.dht.records import (
    MAX_EXCLUDED,
    MAX_LINKS,
    MAX_MADDRS,
    MAX_RECENT_HASHES,
    MAX_RECORD_BYTES,
    MAX_ROUTES,
    ExcludedPeer,
    LinkStats,
    NodeRecord,
    RecordError,
    RouteSummary,
    RunSpecRecord,
    encode_record,
    parse_node_record,
    parse_run_spec_record,
    run_id_of,
)

PEER = "12D3KooWEEKNFHzs7nSD3qG5DLxASVLuwVJ4WANjMzc1Y7r2bCKf"
OTHER = "12D3KooWAZrpVn1HLK8X78Wxjsb5xQXn8CKwmT5GF2jxrD8Pg9Wy"
RUN = "0123456789abcdef"
pytestmark = pytest.mark.timeout(60)


def node(**fields) -> NodeRecord:
    base = dict(run_id=RUN, peer_id=PEER, role="relay", stage=1, state="online")
    base.update(fields)
    return NodeRecord(**base)


def node_json(**fields) -> bytes:
    data = json.loads(encode_record(node()))
    data.update(fields)
    return json.dumps(data).encode()


def test_run_spec_round_trip_and_run_id():
    spec = RunSpec(n_stages=3, partition=(1, 2, 1), seed=7, dataset="corpus.txt")
    record = RunSpecRecord.from_spec(spec, published_by=PEER)
    parsed = parse_run_spec_record(encode_record(record))
    assert parsed == record and parsed.to_spec() == spec
    assert parsed.run_id == run_id_of(spec) and len(parsed.run_id) == 16
    assert int(parsed.run_id, 16) >= 0
    assert run_id_of(RunSpec(seed=8)) != run_id_of(RunSpec(seed=7))
    assert run_id_of(RunSpec()) == run_id_of(RunSpec())


@pytest.mark.parametrize("bad_spec", [
    {"lr": "0.001"},  # strings are not numbers
    {"weight_decay": 1e999},  # infinity
    {"n_stages": 0},  # RunSpec's own validation
    {"partition": [1, 2], "n_stages": 3},  # one layer count per stage
    {"seed": 1.5},
    {"unknown_field": 1},
])
def test_run_spec_rejects_bad_fields(bad_spec):
    spec = json.loads(encode_record(RunSpecRecord.from_spec(RunSpec())))
    spec["spec"].update(bad_spec)
    with pytest.raises(RecordError):
        parse_run_spec_record(json.dumps(spec).encode())


def test_node_record_round_trip():
    record = node(capacity=4, compute_s=0.25, maddrs=("/ip4/127.0.0.1/tcp/4000/p2p/" + PEER,),
                  iteration=12, location="Tokyo", links={OTHER: LinkStats(rtt_s=0.03, bandwidth_bytes_per_s=1e8)},
                  routing=(RouteSummary(next_peer=OTHER, sink=PEER, units=3),), weight_hash="ab12",
                  loss=2.5, tokens_per_s=1000.0, updated_at=1.7e9)
    assert parse_node_record(encode_record(record)) == record
    data_holder = node(role="data", stage=0)
    assert parse_node_record(encode_record(data_holder)).role == "data"


def test_worst_case_node_record_fits_the_size_cap():
    def peer(i: int) -> str:
        return ("12D3KooW" + "z" * 56)[:-4] + "".join("ABCDEFGHJK"[int(c)] for c in f"{i:04d}")

    record = node(
        capacity=10**6, compute_s=86_399.123456789, maddrs=tuple("/" + "x" * 159 for _ in range(MAX_MADDRS)),
        iteration=2**53, location="L" * 32,
        links={peer(i): LinkStats(rtt_s=599.123456789012, bandwidth_bytes_per_s=1e14 + 0.123)
               for i in range(MAX_LINKS)},
        routing=tuple(RouteSummary(next_peer=peer(i), sink=peer(i + 500), units=10**6) for i in range(MAX_ROUTES)),
        weight_hash="f" * 64, loss=-123456.789012345, tokens_per_s=1e14 + 0.5, updated_at=9.9e10 + 0.123456,
        recent_hashes=tuple((2**53 - MAX_RECENT_HASHES + i, "f" * 16) for i in range(MAX_RECENT_HASHES)),
        excluded=tuple(ExcludedPeer(peer=peer(900 + i), reason="r" * 96) for i in range(MAX_EXCLUDED)))
    raw = encode_record(record)
    assert len(raw) <= MAX_RECORD_BYTES
    assert len(pickle.dumps(raw)) < MAX_RECORD_BYTES + 64  # hivemind's pipe limit is ~16 KiB, the seal adds < 1 KiB
    assert parse_node_record(raw) == record


@pytest.mark.parametrize("fields", [
    {"role": "data", "stage": 1},
    {"role": "relay", "stage": 0},
    {"role": "oracle"},
    {"state": "dead"},
    {"stage": -1},
    {"stage": 5000},
    {"compute_s": float("nan")},
    {"compute_s": -1.0},
    {"capacity": "3"},
    {"capacity": 2.0},
    {"peer_id": "not a peer id!"},
    {"peer_id": "0OIl" * 10},  # not base58
    {"run_id": "xyz"},
    {"version": 2},
    {"location": "Tokyo; DROP TABLE"},
    {"weight_hash": "XYZ"},
    {"maddrs": ["no-leading-slash"]},
    {"maddrs": ["/ip4/1.2.3.4"] * (MAX_MADDRS + 1)},
    {"links": {OTHER: {"rtt_s": -0.1}}},
    {"links": {OTHER: {"rtt_s": 0.1, "extra": 1}}},
    {"routing": [{"next_peer": OTHER, "sink": PEER, "units": -1}]},
    {"surprise": True},
])
def test_node_record_rejects_invalid_fields(fields):
    with pytest.raises(RecordError):
        parse_node_record(node_json(**fields))


def test_node_record_rejects_too_many_links():
    links = {("12D3KooW" + "A" * 40 + f"{i:04d}").replace("0", "z"): {"rtt_s": 0.1} for i in range(MAX_LINKS + 1)}
    with pytest.raises(RecordError):
        parse_node_record(node_json(links=links))


@pytest.mark.parametrize("raw", [b"", b"garbage", b"[]", b"null", b'{"version": 1}', b"\xff\xfe", 42, None,
                                 b"{" + b" " * (MAX_RECORD_BYTES + 1) + b"}"])
def test_parsers_reject_garbage(raw):
    with pytest.raises(RecordError):
        parse_node_record(raw)
    with pytest.raises(RecordError):
        parse_run_spec_record(raw)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300),
                 st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
                              lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10),
                                                                                       inner, max_size=4),
                              max_leaves=20).map(lambda v: json.dumps(v).encode())))
def test_parsers_raise_only_record_error(raw):
    for parse in (parse_node_record, parse_run_spec_record):
        with contextlib.suppress(RecordError):
            parse(raw)


@settings(max_examples=100, deadline=None)
@given(stage=st.integers(1, 1024), capacity=st.integers(0, 10**6), compute_s=st.floats(0, 86_400),
       iteration=st.integers(0, 2**53), loss=st.none() | st.floats(-1e6, 1e6),
       rtts=st.lists(st.floats(0, 600), max_size=MAX_LINKS))
def test_valid_node_records_round_trip(stage, capacity, compute_s, iteration, loss, rtts):
    links = {("12D3KooW" + "B" * 40 + f"{i:04d}").replace("0", "z"): LinkStats(rtt_s=rtt)
             for i, rtt in enumerate(rtts)}
    record = node(stage=stage, capacity=capacity, compute_s=compute_s, iteration=iteration, loss=loss,
                  links=links)
    assert parse_node_record(encode_record(record)) == record


def test_encode_refuses_oversized_spec():
    record = RunSpecRecord.from_spec(RunSpec(dataset="d" * (MAX_RECORD_BYTES + 10)))
    with pytest.raises(RecordError):
        encode_record(record)
