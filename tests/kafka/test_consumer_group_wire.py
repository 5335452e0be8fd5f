"""KIP-848 on loopback: ConsumerGroupHeartbeat and ConsumerGroupDescribe as kio requests,
OffsetCommit v9 at the member epoch, ListGroups/DescribeGroups of a consumer group, one
protocol per group id, and every field range-checked at decode."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from kio.schema.errors import ErrorCode

from raftlog.client.consumer_protocol import decode_assignment, decode_subscription
from raftlog.groups.service import InProcessGroupService
from raftlog.groups.settings import GroupConfig
from raftlog.metadata.controller.messages import NewTopic
from raftlog.net.kafka.apis import ApiKey, default_registry
from raftlog.net.kafka.codec import request_class
from raftlog.net.kafka.handlers_consumer_group import (
    CONSUMER_GROUP_DESCRIBE,
    CONSUMER_GROUP_HEARTBEAT,
    register_consumer_group_apis,
)
from raftlog.net.kafka.handlers_groups import register_group_apis
from tests.kafka.conftest import start_broker
from tests.kafka.test_groups_wire import GroupBroker, call, item_class, join, make, nested
from tests.kafka.wire import WireClient

HB = CONSUMER_GROUP_HEARTBEAT
TOPIC = "t"
PARTITIONS = 4


async def start_consumer_group_broker(
    nursery: trio.Nursery, data_dir: Path, config: GroupConfig | None = None
) -> GroupBroker:
    """The in-memory broker with the classic group APIs and KIP-848's."""
    service = InProcessGroupService(config or GroupConfig(offsets_topic_num_partitions=3))
    await nursery.start(service.run)
    registry = default_registry()
    register_group_apis(registry, service)
    register_consumer_group_apis(registry, service)
    broker = await start_broker(nursery, data_dir, registry)
    service.node_id, service.port = broker.backend.node_id, broker.port
    await broker.backend.create_topics([NewTopic(TOPIC, PARTITIONS)], 1000, False)
    return GroupBroker(broker, service)


@pytest.fixture
async def gb(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[GroupBroker]:
    started = await start_consumer_group_broker(nursery, tmp_path)
    yield started
    started.broker.backend.close()


@pytest.fixture
async def client(gb: GroupBroker) -> AsyncIterator[WireClient]:
    wire = await WireClient.connect(gb.port)
    yield wire
    await wire.aclose()


def topic_id(gb: GroupBroker, name: str = TOPIC) -> uuid.UUID:
    (info,) = gb.broker.backend.topics([name])
    return info.topic_id


def owned_tps(gb: GroupBroker, version: int, partitions: set[int]) -> tuple[Any, ...]:
    if not partitions:
        return ()
    return (
        nested(
            HB, version, "topic_partitions", topic_id=topic_id(gb), partitions=tuple(partitions)
        ),
    )


async def heartbeat(
    client: WireClient,
    gb: GroupBroker,
    member_id: str,
    epoch: int,
    owned: set[int] | None = None,
    *,
    version: int = 1,
    group: str = "cg",
    **values: Any,
) -> Any:
    """A ConsumerGroupHeartbeat; a join (epoch 0) subscribes to TOPIC unless `values` say
    otherwise."""
    if epoch == 0:
        values.setdefault("subscribed_topic_names", (TOPIC,))
    if owned is not None:
        values.setdefault("topic_partitions", owned_tps(gb, version, owned))
    return await send_heartbeat(client, member_id, epoch, version=version, group=group, **values)


async def send_heartbeat(
    client: WireClient,
    member_id: str,
    epoch: int,
    *,
    version: int = 1,
    group: str = "cg",
    **values: Any,
) -> Any:
    """A ConsumerGroupHeartbeat of `values` over the defaults: no change to anything, or for
    a join (epoch 0) a rebalance timeout and no owned partitions."""
    fields: dict[str, Any] = {
        "group_id": group,
        "member_id": member_id,
        "member_epoch": epoch,
        "instance_id": None,
        "rack_id": None,
        "rebalance_timeout": datetime.timedelta(milliseconds=-1),
        "subscribed_topic_names": None,
        "subscribed_topic_regex": None,
        "server_assignor": None,
        "topic_partitions": None,
    }
    if epoch == 0:
        fields["rebalance_timeout"] = datetime.timedelta(milliseconds=60_000)
        fields["topic_partitions"] = ()
    fields.update(values)
    return await call(client, HB, version, **fields)


def assigned(response: Any, gb: GroupBroker) -> set[int] | None:
    if response.assignment is None:
        return None
    out: set[int] = set()
    for t in response.assignment.topic_partitions:
        assert t.topic_id == topic_id(gb)
        out.update(t.partitions)
    return out


async def test_join_revoke_then_hand_over(gb: GroupBroker, client: WireClient) -> None:
    a = await heartbeat(client, gb, "a", 0)
    assert a.error_code == ErrorCode.none and a.member_id == "a" and a.member_epoch > 0
    assert assigned(a, gb) == set(range(PARTITIONS))
    assert a.heartbeat_interval == datetime.timedelta(milliseconds=5_000)
    b = await heartbeat(client, gb, "b", 0)
    assert assigned(b, gb) == set()  # a still holds everything
    a2 = await heartbeat(client, gb, "a", a.member_epoch, set(range(PARTITIONS)))
    kept = assigned(a2, gb)
    assert kept is not None and len(kept) == 2 and a2.member_epoch == a.member_epoch
    b2 = await heartbeat(client, gb, "b", b.member_epoch, set())
    assert assigned(b2, gb) == set()  # not before a acknowledges
    a3 = await heartbeat(client, gb, "a", a2.member_epoch, kept)
    assert a3.member_epoch > a.member_epoch
    b3 = await heartbeat(client, gb, "b", b2.member_epoch, set())
    assert assigned(b3, gb) == set(range(PARTITIONS)) - kept
    # A forged heartbeat with a's id and a wrong epoch is fenced and given nothing.
    for forged in (a3.member_epoch + 1, a3.member_epoch - 1, 0):
        fake = await heartbeat(client, gb, "a", forged, set())
        assert fake.error_code == ErrorCode.fenced_member_epoch
        assert fake.assignment is None
    left = await heartbeat(client, gb, "b", -1)
    assert left.error_code == ErrorCode.none and left.member_epoch == -1


async def test_v0_gets_a_member_id(gb: GroupBroker, client: WireClient) -> None:
    r = await heartbeat(client, gb, "", 0, version=0)
    assert r.error_code == ErrorCode.none and r.member_id


@pytest.mark.parametrize(
    ("member_id", "epoch", "values", "code"),
    [
        ("m", -3, {}, ErrorCode.invalid_request),
        ("", 0, {}, ErrorCode.invalid_request),  # v1: the client names itself
        ("m", -2, {}, ErrorCode.invalid_request),  # static leave without an instance id
        ("m", 0, {"subscribed_topic_names": None}, ErrorCode.invalid_request),
        ("m", 0, {"rebalance_timeout": datetime.timedelta(0)}, ErrorCode.invalid_request),
        (
            "m",
            0,
            {"rebalance_timeout": datetime.timedelta(days=2)},
            ErrorCode.invalid_request,
        ),
        ("m", 0, {"subscribed_topic_names": ("x" * 250,)}, ErrorCode.invalid_request),
        ("m", 0, {"subscribed_topic_regex": "t["}, ErrorCode.invalid_regular_expression),
        ("m" * 256, 0, {}, ErrorCode.invalid_request),
        ("m", 0, {"server_assignor": "sticky"}, ErrorCode.unsupported_assignor),
        ("m", 5, {}, ErrorCode.unknown_member_id),
    ],
)
async def test_fields_are_range_checked(
    gb: GroupBroker,
    client: WireClient,
    member_id: str,
    epoch: int,
    values: dict[str, Any],
    code: ErrorCode,
) -> None:
    r = await heartbeat(client, gb, member_id, epoch, **values)
    assert r.error_code == code
    assert r.assignment is None


async def test_a_name_no_topic_can_have_is_kept_and_matches_nothing(
    gb: GroupBroker, client: WireClient
) -> None:
    """As Kafka: librdkafka's 0033 subscribes to "..._IV#!" beside real topics."""
    r = await heartbeat(client, gb, "m", 0, subscribed_topic_names=(TOPIC, "no such #!"))
    assert r.error_code == ErrorCode.none
    assigned(r, gb)  # only the real topic's partitions (it checks every topic id)
    r = await heartbeat(client, gb, "m", r.member_epoch)
    assert r.error_code == ErrorCode.none
    assigned(r, gb)


async def test_owned_partitions_on_join_and_bad_indexes(
    gb: GroupBroker, client: WireClient
) -> None:
    r = await heartbeat(client, gb, "m", 0, topic_partitions=owned_tps(gb, 1, {1}))
    assert r.error_code == ErrorCode.invalid_request
    bad = (nested(HB, 1, "topic_partitions", topic_id=topic_id(gb), partitions=(-1,)),)
    r = await heartbeat(client, gb, "m", 0)
    r = await heartbeat(client, gb, "m", r.member_epoch, topic_partitions=bad)
    assert r.error_code == ErrorCode.invalid_request


async def test_describe_list_commit_and_protocol_conflict(
    gb: GroupBroker, client: WireClient
) -> None:
    a = await heartbeat(client, gb, "a", 0, group="cg2")
    described = await call(
        client,
        CONSUMER_GROUP_DESCRIBE,
        1,
        group_ids=("cg2", "nope"),
        include_authorized_operations=False,
    )
    g, missing = described.groups
    assert g.error_code == ErrorCode.none and g.group_state == "Stable"
    assert g.assignor_name == "uniform" and g.group_epoch == g.assignment_epoch >= 1
    (member,) = g.members
    assert member.member_id == "a" and member.member_epoch == a.member_epoch
    assert member.subscribed_topic_names == (TOPIC,)
    assert member.member_type == 1
    (tps,) = member.assignment.topic_partitions
    assert tps.topic_name == TOPIC and set(tps.partitions) == set(range(PARTITIONS))
    assert missing.error_code == ErrorCode.group_id_not_found

    listed = await call(client, ApiKey.LIST_GROUPS, 5, states_filter=(), types_filter=("consumer",))
    assert [(x.group_id, x.group_type, x.protocol_type) for x in listed.groups] == [
        ("cg2", "consumer", "consumer")
    ]
    classic_view = await call(client, ApiKey.DESCRIBE_GROUPS, 5, groups=("cg2",))
    (described_group,) = classic_view.groups
    assert (described_group.protocol_type, described_group.group_state) == ("consumer", "Stable")
    (classic_member,) = described_group.members
    assert decode_subscription(classic_member.member_metadata).topics == (TOPIC,)
    assert decode_assignment(classic_member.member_assignment) == {
        (TOPIC, p) for p in range(PARTITIONS)
    }

    async def commit(epoch: int, member_id: str = "a") -> ErrorCode:
        topic = nested(
            ApiKey.OFFSET_COMMIT,
            9,
            "topics",
            name=TOPIC,
            partitions=(
                _commit_partition(
                    partition_index=1, committed_offset=42, committed_leader_epoch=-1
                ),
            ),
        )
        r = await call(
            client,
            ApiKey.OFFSET_COMMIT,
            9,
            group_id="cg2",
            generation_id_or_member_epoch=epoch,
            member_id=member_id,
            group_instance_id=None,
            topics=(topic,),
        )
        return r.topics[0].partitions[0].error_code

    assert await commit(a.member_epoch) == ErrorCode.none
    assert await commit(a.member_epoch - 1) == ErrorCode.stale_member_epoch
    assert await commit(a.member_epoch, "zz") == ErrorCode.unknown_member_id
    fetched = await call(
        client,
        ApiKey.OFFSET_FETCH,
        9,
        groups=(
            nested(ApiKey.OFFSET_FETCH, 9, "groups", group_id="cg2", member_id=None, topics=None),
        ),
        require_stable=False,
    )
    (p,) = [p for t in fetched.groups[0].topics for p in t.partitions]
    assert (p.partition_index, p.committed_offset) == (1, 42)

    # One group id, one protocol.
    classic = await join(client, 9, "cg2")
    assert classic.error_code == ErrorCode.inconsistent_group_protocol
    await join(client, 9, "classic-only")
    r = await heartbeat(client, gb, "x", 0, group="classic-only")
    assert r.error_code == ErrorCode.inconsistent_group_protocol


def _commit_partition(**values: Any) -> Any:
    topic_cls = item_class(request_class(ApiKey.OFFSET_COMMIT, 9), "topics")
    return make(item_class(topic_cls, "partitions"), committed_metadata=None, **values)


async def test_static_member_restarts_without_a_rebalance(
    gb: GroupBroker, client: WireClient
) -> None:
    a = await heartbeat(client, gb, "a-1", 0, group="static", instance_id="host-a")
    b = await heartbeat(client, gb, "b-1", 0, group="static", instance_id="host-b")
    assert a.error_code == b.error_code == ErrorCode.none
    # b leaves for a while (-2): its partitions stay reserved for host-b.
    away = await heartbeat(client, gb, "b-1", -2, group="static", instance_id="host-b")
    assert (away.error_code, away.member_epoch) == (ErrorCode.none, -2)
    epoch_before = (await describe_one(client, "static")).group_epoch
    # Another process cannot take host-a's id while host-a is live.
    clash = await heartbeat(client, gb, "a-2", 0, group="static", instance_id="host-a")
    assert clash.error_code == ErrorCode.unreleased_instance_id
    # host-b comes back under a new member id and gets its old epoch and target back.
    back = await heartbeat(client, gb, "b-2", 0, group="static", instance_id="host-b")
    assert back.error_code == ErrorCode.none and back.member_id == "b-2"
    described = await describe_one(client, "static")
    assert {m.member_id: m.instance_id for m in described.members} == {
        "a-1": "host-a",
        "b-2": "host-b",
    }
    assert described.group_epoch == epoch_before  # no rebalance
    assert assigned(back, gb) is not None


async def describe_one(client: WireClient, group: str) -> Any:
    response = await call(
        client, CONSUMER_GROUP_DESCRIBE, 1, group_ids=(group,), include_authorized_operations=False
    )
    (described,) = response.groups
    return described
