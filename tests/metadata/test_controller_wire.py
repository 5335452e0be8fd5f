"""Controller requests and replies on the internal listener (cm.CODEC)."""

import uuid

import msgpack
import pytest

from raftlog.codec import DecodeError
from raftlog.errors import ErrorCode
from raftlog.metadata.controller import messages as cm


def test_controller_messages_round_trip():
    request = cm.CreateTopics(
        (
            cm.NewTopic("t", 3, 2, configs={"retention.ms": "10", "null.value": None}),
            cm.NewTopic("u", assignments={0: (1, 2)}),
        ),
        validate_only=True,
    )
    assert cm.CODEC.decode(cm.ControllerRequest, cm.CODEC.encode(request)) == request
    reply = cm.RegisterBrokerReply(ErrorCode.duplicate_broker_registration, "busy", 4)
    decoded = cm.CODEC.decode(cm.ControllerReply, cm.CODEC.encode(reply))
    assert decoded == reply
    assert isinstance(decoded.error_code, ErrorCode)
    register = cm.RegisterBroker(1, uuid.uuid4(), "h", 1, "h", 2, None, "cid")
    assert cm.CODEC.decode(cm.ControllerRequest, cm.CODEC.encode(register)) == register


def test_a_reply_is_not_a_request_and_no_other_class_is_either():
    data = cm.CODEC.encode(cm.DeleteTopicsReply(()))
    with pytest.raises(DecodeError, match="is not one of"):
        cm.CODEC.decode(cm.ControllerRequest, data)
    forged = msgpack.packb(
        msgpack.ExtType(cm.CONTROLLER_EXT, msgpack.packb(["ControllerResult", [[], None]]))
    )
    with pytest.raises(DecodeError, match="'ControllerResult' is not one of"):
        cm.CODEC.decode(cm.ControllerRequest, forged)
    with pytest.raises(TypeError):
        cm.CODEC.encode(cm.ControllerResult((), None), cm.ControllerRequest)


def test_out_of_range_fields_are_refused():
    wire = cm.CODEC.to_wire(cm.BrokerHeartbeat(1, 17, 120))
    name, values = msgpack.unpackb(wire.data)
    values[0] = 2**31  # broker id above int32
    bad = msgpack.ExtType(cm.CONTROLLER_EXT, msgpack.packb([name, values]))
    with pytest.raises(DecodeError, match=r"BrokerHeartbeat\.broker_id"):
        cm.CODEC.from_wire(cm.ControllerRequest, bad)


def test_a_rack_longer_than_kafka_clients_need_is_refused_at_decode():
    register = cm.RegisterBroker(1, uuid.uuid4(), "h", 1, "h", 2, "r" * 255, "cid")
    assert cm.CODEC.decode(cm.ControllerRequest, cm.CODEC.encode(register)) == register
    forged = cm.RegisterBroker(1, uuid.uuid4(), "h", 1, "h", 2, "r" * 256, "cid")
    with pytest.raises(DecodeError, match=r"RegisterBroker\.rack"):
        cm.CODEC.decode(cm.ControllerRequest, cm.CODEC.encode(forged))


def test_garbage_is_a_decode_error():
    with pytest.raises(DecodeError):
        cm.CODEC.decode(cm.ControllerRequest, b"\xc1\xc1")
