"""KIP-848 regex subscriptions on loopback, as kio requests: a join by regex alone gets the
matching topics' partitions and ConsumerGroupDescribe reports the regex; an invalid or
over-long pattern is INVALID_REGULAR_EXPRESSION with a message, and changes nothing."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from raftlog.groups.topic_regex import MAX_REGEX_CHARS
from tests.kafka.test_consumer_group_wire import (
    PARTITIONS,
    TOPIC,
    assigned,
    client,
    describe_one,
    gb,
    heartbeat,
)
from tests.kafka.test_groups_wire import GroupBroker
from tests.kafka.wire import WireClient

__all__ = ["client", "gb"]  # fixtures


async def test_join_by_regex_alone(gb: GroupBroker, client: WireClient) -> None:
    r = await heartbeat(
        client, gb, "m", 0, subscribed_topic_names=None, subscribed_topic_regex=f"{TOPIC}.*"
    )
    assert r.error_code == ErrorCode.none
    assert assigned(r, gb) == set(range(PARTITIONS))
    described = await describe_one(client, "cg")
    [member] = described.members
    assert member.subscribed_topic_regex == f"{TOPIC}.*"
    assert member.subscribed_topic_names == ()
    # A regex matching nothing (internal topics never match) gets nothing.
    r2 = await heartbeat(
        client, gb, "n", 0, group="cg2", subscribed_topic_names=None, subscribed_topic_regex="__.*"
    )
    assert r2.error_code == ErrorCode.none and assigned(r2, gb) == set()


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("t[", "is not a valid regular expression"),
        ("(?<=a)b", "is not a valid regular expression"),
        ("a" * (MAX_REGEX_CHARS + 1), f"the limit is {MAX_REGEX_CHARS}"),
    ],
)
async def test_invalid_patterns(
    gb: GroupBroker, client: WireClient, pattern: str, message: str
) -> None:
    r = await heartbeat(client, gb, "m", 0, subscribed_topic_regex=pattern)
    assert r.error_code == ErrorCode.invalid_regular_expression
    assert message in (r.error_message or "")
    assert r.assignment is None
