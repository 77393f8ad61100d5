"""The flow wire codec: every message round-trips; malformed bytes never pass."""

import contextlib
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtfp2p.flow import messages as m
from gwtfp2p.flow.wire import MESSAGE_TYPES, WireError, decode_message, encode_message

TABLE_UNIT = m.TableUnit("i", "p", "o", "n", "d", 1.0, 2.0, 3.0, 4.0)
TRANSFER = m.UnitTransfer("e", "p", "d", 3, 1.5, True)
SAMPLES = [
    m.Advert("a", (("d", 1.5), ("e", math.inf)), 3),
    m.Request("a", "d", ("a#1", "a#2"), (1.0, 2.0), 3.5),
    m.Accept("a", ("a#1",)),
    m.Reject("a", ("a#2",), m.Advert("a", (), 0)),
    m.Refresh("a", (m.ForwardEntry("x", "d", 1.0, 0),), (m.BackwardEntry("y", math.inf, False, 2),)),
    m.Cancel("a", ("x",)),
    m.PushBack("a", ("x",)),
    m.Moved("a", (m.MovedEntry("x", "h", 4),)),
    m.FlowTable("a", 2, (TABLE_UNIT,), (("n", 1.0),)),
    m.ProposeTakeover("a", "a/1", "i", "o", 1.0, 2.0, 0.5),
    m.ProposeSwap("a", "a/2", "d", "i", "o", "n", "i2", "o2", 1.0, 2.0, 3.0, 4.0, 0.1),
    m.ProposeExchange("a", "a/3", "i", "o", 1.0, 2.0, TABLE_UNIT, 0.2),
    m.MoveAnswer("a", "a/1", True, TRANSFER, None),
    m.SwapCommit("a", "a/2", TRANSFER, TRANSFER),
    m.Residual("a", (("d", 3),), (("d", 2), ("e", 7))),
    m.Residual("a", (("d", 1),), (), paths=(("in", "d", ("<a", ">a", "<d")),)),
    m.Augment("a", "d", 5, "b#3"),
]


def test_samples_cover_every_message_type():
    assert {type(s).__name__ for s in SAMPLES} == set(MESSAGE_TYPES)


@pytest.mark.parametrize("message", SAMPLES, ids=lambda s: type(s).__name__)
def test_round_trip(message):
    assert decode_message(encode_message(message)) == message


@pytest.mark.parametrize("mutate", [
    lambda d: d | {"t": "Nope"},
    lambda d: {"t": d["t"], "m": {**d["m"], "extra": 1}},
    lambda d: {"t": d["t"], "m": {k: v for k, v in d["m"].items() if k != "sender"}},
    lambda d: {"t": d["t"], "m": {**d["m"], "spare": "3"}},
    lambda d: {"t": d["t"], "m": {**d["m"], "costs": [["d", "nan"]]}},
    lambda d: {"t": d["t"], "m": {**d["m"], "sender": "x" * 1000}},
    lambda d: {"t": d["t"], "m": {**d["m"], "costs": [["d"]]}},
])
def test_malformed_messages_are_rejected(mutate):
    raw = json.loads(encode_message(SAMPLES[0]))
    with pytest.raises(WireError):
        decode_message(json.dumps(mutate(raw)).encode())


def test_oversized_and_non_json_input_rejected():
    with pytest.raises(WireError):
        decode_message(b"\xff\xfe")
    with pytest.raises(WireError):
        decode_message(b"[" * 300_000)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_crash(data):
    with contextlib.suppress(WireError):
        decode_message(data)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=20),
       st.sampled_from(sorted(MESSAGE_TYPES)))
def test_random_json_never_crashes(payload, name):
    with contextlib.suppress(WireError):
        decode_message(json.dumps({"t": name, "m": payload}).encode())
