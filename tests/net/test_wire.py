import uuid

import pytest

from raftlog.errors import ErrorCode
from raftlog.metadata.controller import messages as cm
from raftlog.net.wire import WireDecodeError, WireRegistry


def _registry() -> WireRegistry:
    registry = WireRegistry()
    registry.register_module(cm)
    return registry


def test_controller_messages_round_trip():
    registry = _registry()
    request = cm.CreateTopics(
        (
            cm.NewTopic("t", 3, 2, configs={"retention.ms": "10"}),
            cm.NewTopic("u", assignments={0: (1, 2)}),
        ),
        validate_only=True,
    )
    assert registry.decode(registry.encode(request)) == request
    reply = cm.RegisterBrokerReply(ErrorCode.duplicate_broker_registration, "busy", 4)
    decoded = registry.decode(registry.encode(reply))
    assert decoded == reply
    assert isinstance(decoded.error_code, ErrorCode)
    register = cm.RegisterBroker(1, uuid.uuid4(), "h", 1, "h", 2, None, "cid")
    assert registry.decode(registry.encode(register)) == register


def test_unregistered_types_are_refused_both_ways():
    registry = WireRegistry()
    with pytest.raises(TypeError, match="not registered"):
        registry.encode(cm.DeleteTopics(("t",)))
    data = _registry().encode(cm.DeleteTopics(("t",)))
    with pytest.raises(WireDecodeError, match="not registered"):
        registry.decode(data)


def test_garbage_is_a_decode_error():
    with pytest.raises(WireDecodeError):
        _registry().decode(b"\xc1\xc1")
