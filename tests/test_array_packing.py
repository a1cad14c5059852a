"""A deployed message's arrays in one object (flower_pfl/tuned/array_packing.py): the byte
layout by hand, the same Arrays back bit for bit, fewer objects, the ClientApp's mod packing
its reply only when the request came packed, and the ServerApp's grid packing what it
pushes and unpacking what it pulls."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, RecordDict
from flwr.common import FitIns, ndarrays_to_parameters
from flwr.compat.common.recorddict_compat import fitins_to_recorddict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.task_identity import TaskIdentity

from flower_pfl.tuned import array_packing as ap


@pytest.fixture(autouse=True)
def _identity(monkeypatch):
    """A Message needs the task it is made in (Flower sets this in its processes)."""
    for name, value in (("_run_id", 7), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


def _arrays(record):
    return [(k, a.dtype, tuple(a.shape), a.stype, a.data) for k, a in record.items()]


def test_the_bytes_are_the_documented_layout_by_hand():
    """Two entries in a non-sorted order, one 0-d with no data: the uint64 header length,
    the JSON header, then each entry's bytes in order."""
    entries = [("w", "float32", (2,), "numpy.ndarray", b"\x01\x02"),
               ("b", "int8", (), "x", b"")]
    header = b'[["w","float32",[2],"numpy.ndarray",2],["b","int8",[],"x",0]]'
    want = struct.pack("<Q", len(header)) + header + b"\x01\x02"
    assert ap.pack_bytes(entries) == want
    assert ap.unpack_bytes(want) == entries


def test_sizes_that_do_not_add_up_are_refused():
    blob = ap.pack_bytes([("a", "u8", (3,), "s", b"abc"), ("c", "u8", (1,), "s", b"d")])
    with pytest.raises(ValueError, match="header accounts for"):
        ap.unpack_bytes(blob[:-1])
    with pytest.raises(ValueError, match="header accounts for"):
        ap.unpack_bytes(blob + b"!")


def _fit_message(arrays):
    return Message(fitins_to_recorddict(FitIns(ndarrays_to_parameters(arrays),
                                                {"round": 3, "lr": 0.5}), True),
                   dst_node_id=5, message_type="train")


ARRAYS = [np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5,
          np.array(-7, dtype=np.int64),
          np.zeros((0, 4)),
          np.array([1e-300, -np.inf, np.nan])]


def test_a_message_packs_into_six_objects_and_unpacks_to_the_same_arrays_bit_for_bit():
    msg = _fit_message(ARRAYS)
    before = {k: _arrays(r) for k, r in msg.content.array_records.items()}
    config = msg.content["fitins.config"]
    n_before = len(get_all_nested_objects(msg))
    assert ap.pack_message(msg)
    packed = msg.content["fitins.parameters"]
    assert list(packed.keys()) == [ap.KEY] and packed[ap.KEY].stype == ap.STYPE
    assert len(get_all_nested_objects(msg)) == 6 < n_before == 6 + 2 * (len(ARRAYS) - 1)
    assert msg.content["fitins.config"] is config  # other records untouched
    assert list(msg.content.keys()) == ["fitins.parameters", "fitins.config"]
    assert ap.unpack_message(msg)
    assert {k: _arrays(r) for k, r in msg.content.array_records.items()} == before
    got = [a.numpy() for a in msg.content["fitins.parameters"].values()]
    for have, want in zip(got, ARRAYS):
        assert have.dtype == want.dtype and have.shape == want.shape
        assert have.tobytes() == want.tobytes()


def test_nothing_to_pack_is_left_as_it_is():
    one = _fit_message([np.ones(3)])  # one Array: packing would add bytes, not save objects
    content = one.content
    assert not ap.pack_message(one) and one.content is content
    assert not ap.unpack_message(one) and one.content is content
    assert not ap.pack_message(Message(RecordDict({"c": ConfigRecord({"a": 1})}),
                                       dst_node_id=1, message_type="train"))
    failed = Message(Error(code=0, reason="no"), reply_to=one)  # an error reply: no content
    assert not ap.pack_message(failed) and not ap.unpack_message(failed)


def test_a_packed_array_of_another_format_version_is_refused_naming_it():
    blob = ap.pack_bytes([("a", "u8", (1,), "s", b"x")])
    record = ArrayRecord(array_dict={ap.KEY: Array(dtype=ap.DTYPE, shape=(len(blob),),
                                                   stype="flower_pfl.packed/2", data=blob)})
    with pytest.raises(ValueError, match="flower_pfl.packed/2"):
        ap.unpack_record(record)


def _reply_to(request, arrays):
    return Message(RecordDict({"fitres.parameters": ArrayRecord(arrays),
                               "fitres.metrics": ConfigRecord({"loss": 0.25})}),
                   reply_to=request)


def test_the_client_mod_unpacks_the_request_and_packs_the_reply_only_when_it_came_packed():
    seen = []

    def call_next(message, context):
        seen.append(list(message.content["fitins.parameters"].keys()))
        return _reply_to(message, [np.ones(2), np.full(3, -1.5)])

    packed = _fit_message(ARRAYS)
    ap.pack_message(packed)
    reply = ap.client_mod(packed, None, call_next)
    assert seen[-1] == ["0", "1", "2", "3"]  # the client read the arrays as Flower made them
    assert list(reply.content["fitres.parameters"].keys()) == [ap.KEY]
    plain = ap.client_mod(_fit_message(ARRAYS), None, call_next)
    assert seen[-1] == ["0", "1", "2", "3"]
    assert list(plain.content["fitres.parameters"].keys()) == ["0", "1"]  # stock: as made


def test_the_grid_pushes_packed_and_hands_replies_on_unpacked(monkeypatch):
    """ServerApp side (engine: tuned, deployment): what reaches Flower's push is packed;
    what comes back from Flower's pull is unpacked before the legacy loop reads it."""
    pushed = []
    request = _fit_message(ARRAYS)
    reply = _reply_to(request, [np.ones(2), np.arange(3)])
    ap.pack_message(reply)  # as a ClientApp's mod sent it
    flowers = {"push_messages": lambda grid, msgs: pushed.extend(msgs) or ["id"],
               "pull_messages": lambda grid, ids: iter([reply])}
    monkeypatch.setattr(ap, "flowers_own", flowers.__getitem__)
    assert ap.push_messages(object(), [request]) == ["id"]
    assert [list(m.content["fitins.parameters"].keys()) for m in pushed] == [[ap.KEY]]
    (got,) = ap.pull_messages(object(), ["id"])
    assert list(got.content["fitres.parameters"].keys()) == ["0", "1"]
    assert got.content["fitres.parameters"]["1"].numpy().tolist() == [0, 1, 2]


def test_the_header_is_json_a_reader_in_another_language_can_follow():
    blob = ap.pack_bytes([("layer.0", "float64", (1, 2), "numpy.ndarray", b"12345678" * 2)])
    (n,) = struct.unpack_from("<Q", blob)
    assert json.loads(blob[8:8 + n]) == [["layer.0", "float64", [1, 2], "numpy.ndarray", 16]]
