"""The bodies of "txn.markers" and "txn.verify": what a peer sends is range-checked at decode."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from raftlog.codec import DecodeError
from raftlog.errors import ErrorCode
from raftlog.txn import rpc_bodies as wire


def over_the_wire(body: Any) -> Any:
    return msgpack.unpackb(msgpack.packb(body, use_bin_type=True), raw=False)


def markers_body(**changes: Any) -> dict[str, Any]:
    body = over_the_wire(wire.markers_request(7, 3, 12, True, (("orders", 0), ("orders", 5))))
    body.update(changes)
    return body


def verify_body(**changes: Any) -> dict[str, Any]:
    body = over_the_wire(wire.verify_request("tx-1", 7, 3, "orders", 5))
    body.update(changes)
    return body


def test_markers_round_trip() -> None:
    request = wire.decode_markers_request(markers_body())
    assert (request.producer_id, request.producer_epoch, request.coordinator_epoch) == (7, 3, 12)
    assert request.commit is True
    assert request.topic_partitions == (("orders", 0), ("orders", 5))
    results = {("orders", 0): ErrorCode.none, ("orders", 5): ErrorCode.not_enough_replicas}
    assert wire.decode_markers_response(over_the_wire(wire.markers_response(results))) == results


def test_verify_round_trip() -> None:
    request = wire.decode_verify_request(verify_body())
    assert request == wire.TxnVerifyRequest("tx-1", 7, 3, "orders", 5)
    answer = over_the_wire(wire.verify_response(ErrorCode.invalid_txn_state))
    assert wire.decode_verify_response(answer) is ErrorCode.invalid_txn_state


@pytest.mark.parametrize(
    "changes",
    [
        {"producer_id": -1},
        {"producer_id": 2**63},
        {"producer_id": "7"},
        {"producer_epoch": -1},
        {"producer_epoch": 2**15},
        {"coordinator_epoch": -1},
        {"coordinator_epoch": 2**31},
        {"commit": 1},
        {"partitions": [["orders", -1]]},
        {"partitions": [["orders", 2**31]]},
        {"partitions": [["", 0]]},
        {"partitions": [["t" * 250, 0]]},
        {"partitions": [["orders", 0], ["orders", 0]]},
        {"partitions": [["orders", 0, 1]]},
        {"partitions": [["orders", p] for p in range(wire.MAX_MARKER_PARTITIONS + 1)]},
        {"partitions": None},
    ],
    ids=repr,
)
def test_markers_request_out_of_range_is_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(DecodeError):
        wire.decode_markers_request(markers_body(**changes))


def test_markers_request_missing_field_is_refused() -> None:
    body = markers_body()
    del body["coordinator_epoch"]
    with pytest.raises(DecodeError):
        wire.decode_markers_request(body)
    with pytest.raises(DecodeError):
        wire.decode_markers_request(["not", "a", "map"])


@pytest.mark.parametrize(
    "changes",
    [
        {"transactional_id": ""},
        {"transactional_id": "é" * 20_000},  # under the character limit, over 32767 bytes
        {"transactional_id": "x" * 2**15},
        {"transactional_id": None},
        {"producer_id": -1},
        {"producer_epoch": 2**15},
        {"topic": ""},
        {"topic": "t" * 250},
        {"partition": -1},
        {"partition": 2**31},
    ],
    ids=repr,
)
def test_verify_request_out_of_range_is_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(DecodeError):
        wire.decode_verify_request(verify_body(**changes))


def test_answers_are_checked_too() -> None:
    # A code this node does not know (a newer peer's) reads as UNKNOWN_SERVER_ERROR.
    assert wire.decode_verify_response({"error": 30_000}) is ErrorCode.unknown_server_error
    with pytest.raises(DecodeError):
        wire.decode_verify_response({"error": "NONE"})
    with pytest.raises(DecodeError):
        wire.decode_markers_response({"results": [["orders", -1, 0]]})
