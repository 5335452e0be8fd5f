"""Group APIs on loopback, driven with raw kio-encoded requests of every advertised version.

The server runs with the in-memory test backend and InProcessGroupService (one node that
coordinates every group). `start_group_broker` is shared with test_groups_clients.py.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from kio.schema.errors import ErrorCode

from raftlog.groups.service import CoordinatorLocation, InProcessGroupService
from raftlog.groups.settings import GroupConfig
from raftlog.kio_private import field_shape
from raftlog.metadata.controller.messages import NewTopic
from raftlog.net.kafka.apis import ApiKey, default_registry
from raftlog.net.kafka.codec import request_class, zero_response
from raftlog.net.kafka.handlers_groups import GROUP_VERSION_TABLE, register_group_apis
from raftlog.net.kafka.handlers_util import to_ms
from tests.kafka.conftest import Broker, start_broker
from tests.kafka.wire import WireClient

SESSION_TIMEOUT_MS = 10_000
STEP_DEADLINE_S = 10


@dataclasses.dataclass
class GroupBroker:
    broker: Broker
    service: InProcessGroupService

    @property
    def port(self) -> int:
        return self.broker.port

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap


async def start_group_broker(
    nursery: trio.Nursery, data_dir: Path, config: GroupConfig | None = None
) -> GroupBroker:
    service = InProcessGroupService(config or GroupConfig(offsets_topic_num_partitions=3))
    await nursery.start(service.run)
    registry = default_registry()
    register_group_apis(registry, service)
    broker = await start_broker(nursery, data_dir, registry)
    # FindCoordinator must name the broker clients know from Metadata.
    service.node_id, service.port = broker.backend.node_id, broker.port
    # The topic the wire tests commit offsets of: a commit for a topic the cluster does not
    # have is refused (UNKNOWN_TOPIC_OR_PARTITION), as Kafka does.
    await broker.backend.create_topics([NewTopic("t", 4)], 1000, False)
    return GroupBroker(broker, service)


@pytest.fixture
async def gb(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[GroupBroker]:
    started = await start_group_broker(nursery, tmp_path)
    yield started
    started.broker.backend.close()


@pytest.fixture
async def client(gb: GroupBroker) -> AsyncIterator[WireClient]:
    wire = await WireClient.connect(gb.port)
    yield wire
    await wire.aclose()


def make(cls: type[Any], **values: Any) -> Any:
    """An entity of kio class `cls`: given fields (those it has), the rest zero/empty."""
    known = {f.name for f in dataclasses.fields(cls)}
    base = zero_response(cls, ErrorCode.none)
    return dataclasses.replace(base, **{k: v for k, v in values.items() if k in known})


def item_class(cls: type[Any], field: str) -> type[Any]:
    """The nested entity class of `cls`'s array field `field`."""
    (f,) = [f for f in dataclasses.fields(cls) if f.name == field]
    entity = field_shape(f).entity
    assert entity is not None, f"{cls.__name__}.{field} is not a nested entity"
    return entity


def req(api_key: int, version: int, **values: Any) -> Any:
    return make(request_class(api_key, version), **values)


def nested(api_key: int, version: int, field: str, **values: Any) -> Any:
    """An element of the request's array field `field`, of that version."""
    return make(item_class(request_class(api_key, version), field), **values)


async def call(client: WireClient, api_key: int, version: int, **values: Any) -> Any:
    with trio.fail_after(STEP_DEADLINE_S):
        return await client.request(req(api_key, version, **values))


# ------------------------------------------------------------------------------ helpers
async def join(client: WireClient, version: int, group_id: str, member_id: str = "") -> Any:
    """JoinGroup, answering KIP-394's MEMBER_ID_REQUIRED with the id handed out."""
    protocol = nested(ApiKey.JOIN_GROUP, version, "protocols", name="range", metadata=b"meta")
    values = dict(
        group_id=group_id,
        session_timeout=_td(SESSION_TIMEOUT_MS),
        rebalance_timeout=_td(SESSION_TIMEOUT_MS),
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(protocol,),
    )
    response = await call(client, ApiKey.JOIN_GROUP, version, **values)
    if response.error_code == ErrorCode.member_id_required:
        assert version >= 4
        values["member_id"] = response.member_id
        response = await call(client, ApiKey.JOIN_GROUP, version, **values)
    return response


def _td(ms: int) -> datetime.timedelta:
    # kio models *_ms fields as timedeltas.
    return datetime.timedelta(milliseconds=ms)


# ------------------------------------------------------------------------------ every version
GROUP_CASES = [
    (k, v) for k, (lo, hi) in sorted(GROUP_VERSION_TABLE.items()) for v in range(lo, hi + 1)
]


@pytest.mark.parametrize(("api_key", "version"), GROUP_CASES)
async def test_every_advertised_group_version_answers(
    gb: GroupBroker, client: WireClient, api_key: int, version: int
) -> None:
    """A minimal request of every advertised group API/version gets Kafka's answer."""
    group = f"g-{api_key}-{version}"
    response: Any = None  # the raw answer, where the case has one to check throttle_time on
    if api_key == ApiKey.FIND_COORDINATOR:
        response = await call(client, api_key, version, key=group, coordinator_keys=(group,))
        answers = response.coordinators if version >= 4 else [response]
        assert [(a.error_code, a.node_id, a.host, a.port) for a in answers] == [
            (ErrorCode.none, gb.broker.backend.node_id, "127.0.0.1", gb.port)
        ]
    elif api_key == ApiKey.JOIN_GROUP:
        response = await join(client, version, group)
        assert response.error_code == ErrorCode.none
        assert response.generation_id == 1
        assert response.leader == response.member_id != ""
        assert [mem.member_id for mem in response.members] == [response.member_id]
        assert response.protocol_name == "range"
    elif api_key in (ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT):
        response = await call(
            client, api_key, version, group_id=group, generation_id=1, member_id="ghost"
        )
        assert response.error_code == ErrorCode.unknown_member_id
    elif api_key == ApiKey.LEAVE_GROUP:
        member = nested(api_key, version, "members", member_id="ghost") if version >= 3 else None
        response = await call(
            client, api_key, version, group_id=group, member_id="ghost", members=(member,)
        )
        if version >= 3:
            assert response.error_code == ErrorCode.none
            assert [(x.member_id, x.error_code) for x in response.members] == [
                ("ghost", ErrorCode.unknown_member_id)
            ]
        else:
            assert response.error_code == ErrorCode.unknown_member_id
    elif api_key == ApiKey.OFFSET_COMMIT:
        response = await _standalone_commit(client, version, group, {0: 42})
        assert [
            (t.name, [(p.partition_index, p.error_code) for p in t.partitions])
            for t in response.topics
        ] == [("t", [(0, ErrorCode.none)])]
    elif api_key == ApiKey.OFFSET_FETCH:
        await _standalone_commit(client, 9, group, {0: 7})
        assert await _fetch(client, version, group, {"t": (0, 1)}) == (
            ErrorCode.none,
            {("t", 0): 7, ("t", 1): -1},
        )
    elif api_key == ApiKey.LIST_GROUPS:
        await _standalone_commit(client, 9, group, {0: 1})
        response = await call(client, api_key, version)
        assert response.error_code == ErrorCode.none
        assert [g.group_id for g in response.groups] == [group]
        if version >= 4:
            assert response.groups[0].group_state == "Empty"
    elif api_key == ApiKey.DESCRIBE_GROUPS:
        await _standalone_commit(client, 9, group, {0: 1})
        response = await call(client, api_key, version, groups=(group, "nope"))
        known, unknown = response.groups
        assert (known.group_id, known.error_code, known.group_state) == (
            group,
            ErrorCode.none,
            "Empty",
        )
        expected = ErrorCode.group_id_not_found if version >= 6 else ErrorCode.none
        assert (unknown.group_id, unknown.error_code, unknown.group_state) == (
            "nope",
            expected,
            "Dead",
        )
    elif api_key == ApiKey.DELETE_GROUPS:
        await _standalone_commit(client, 9, group, {0: 1})
        response = await call(client, api_key, version, groups_names=(group, "nope"))
        assert [(r.group_id, r.error_code) for r in response.results] == [
            (group, ErrorCode.none),
            ("nope", ErrorCode.group_id_not_found),
        ]
    elif api_key == ApiKey.OFFSET_DELETE:
        await _standalone_commit(client, 9, group, {0: 1, 1: 2})
        topic_cls = item_class(request_class(api_key, version), "topics")
        partition = make(item_class(topic_cls, "partitions"), partition_index=0)
        topic = make(topic_cls, name="t", partitions=(partition,))
        response = await call(client, api_key, version, group_id=group, topics=(topic,))
        assert response.error_code == ErrorCode.none
        assert [
            (t.name, [(p.partition_index, p.error_code) for p in t.partitions])
            for t in response.topics
        ] == [("t", [(0, ErrorCode.none)])]
        assert await _fetch(client, 9, group, {"t": (0, 1)}) == (
            ErrorCode.none,
            {("t", 0): -1, ("t", 1): 2},
        )
    else:
        pytest.fail(f"no case for api {api_key}")
    if response is not None:
        assert to_ms(getattr(response, "throttle_time", 0)) == 0


async def _standalone_commit(
    client: WireClient, version: int, group: str, offsets: dict[int, int], **member: Any
) -> Any:
    """OffsetCommit to topic "t" without group membership (generation -1, member "")."""
    topic_cls = item_class(request_class(ApiKey.OFFSET_COMMIT, version), "topics")
    partition_cls = item_class(topic_cls, "partitions")
    partitions = tuple(
        make(
            partition_cls,
            partition_index=p,
            committed_offset=o,
            committed_leader_epoch=-1,
            committed_metadata=f"m{o}",
        )
        for p, o in offsets.items()
    )
    topic = nested(ApiKey.OFFSET_COMMIT, version, "topics", name="t", partitions=partitions)
    values = {"generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None}
    values.update(member)
    return await call(
        client,
        ApiKey.OFFSET_COMMIT,
        version,
        group_id=group,
        topics=(topic,),
        retention_time=_td(-1),
        **values,
    )


async def _fetch(
    client: WireClient, version: int, group: str, topics: dict[str, tuple[int, ...]] | None
) -> tuple[ErrorCode, dict[tuple[str, int], int]]:
    """OffsetFetch at `version` -> (error code, {(topic, partition): offset})."""
    api = ApiKey.OFFSET_FETCH
    if version >= 8:
        group_cls = item_class(request_class(api, version), "groups")
        topic_cls = item_class(group_cls, "topics")
        t_items = (
            None
            if topics is None
            else tuple(make(topic_cls, name=n, partition_indexes=ps) for n, ps in topics.items())
        )
        entry = make(group_cls, group_id=group, member_id=None, topics=t_items)
        response = await call(client, api, version, groups=(entry,))
        (answer,) = response.groups
        assert answer.group_id == group
        code, answer_topics = answer.error_code, answer.topics
    else:
        t_items = (
            None
            if topics is None
            else tuple(
                nested(api, version, "topics", name=n, partition_indexes=ps)
                for n, ps in topics.items()
            )
        )
        response = await call(client, api, version, group_id=group, topics=t_items)
        code, answer_topics = getattr(response, "error_code", ErrorCode.none), response.topics
    offsets = {}
    for t in answer_topics:
        for p in t.partitions:
            if version < 2 and p.error_code != ErrorCode.none:
                code = p.error_code
            offsets[(t.name, p.partition_index)] = p.committed_offset
    return code, offsets


# ------------------------------------------------------------------------------ flows
@pytest.mark.parametrize(
    ("join_v", "sync_v", "hb_v", "leave_v", "commit_v"),
    [(0, 0, 0, 0, 2), (5, 3, 3, 3, 7), (9, 5, 4, 5, 9)],
)
async def test_member_lifecycle(
    gb: GroupBroker,
    client: WireClient,
    join_v: int,
    sync_v: int,
    hb_v: int,
    leave_v: int,
    commit_v: int,
) -> None:
    """Join, sync (leader assigns), heartbeat, commit as a member, describe, refuse to
    delete a live group, leave, delete."""
    group = f"life-{join_v}"
    joined = await join(client, join_v, group)
    assert joined.error_code == ErrorCode.none
    member, generation = joined.member_id, joined.generation_id
    assignment = nested(
        ApiKey.SYNC_GROUP, sync_v, "assignments", member_id=member, assignment=b"all-yours"
    )
    synced = await call(
        client,
        ApiKey.SYNC_GROUP,
        sync_v,
        group_id=group,
        generation_id=generation,
        member_id=member,
        group_instance_id=None,
        protocol_type="consumer",
        protocol_name="range",
        assignments=(assignment,),
    )
    assert (synced.error_code, synced.assignment) == (ErrorCode.none, b"all-yours")
    if sync_v >= 5:
        assert (synced.protocol_type, synced.protocol_name) == ("consumer", "range")
    beat = await call(
        client,
        ApiKey.HEARTBEAT,
        hb_v,
        group_id=group,
        generation_id=generation,
        member_id=member,
        group_instance_id=None,
    )
    assert beat.error_code == ErrorCode.none
    # A stale generation is fenced.
    stale = await call(
        client,
        ApiKey.HEARTBEAT,
        hb_v,
        group_id=group,
        generation_id=generation + 5,
        member_id=member,
    )
    assert stale.error_code == ErrorCode.illegal_generation

    committed = await _standalone_commit(
        client,
        commit_v,
        group,
        {0: 10, 3: 30},
        generation_id_or_member_epoch=generation,
        member_id=member,
    )
    assert {p.error_code for t in committed.topics for p in t.partitions} == {ErrorCode.none}
    # A non-member may not commit to a live group.
    refused = await _standalone_commit(client, commit_v, group, {0: 99})
    assert refused.topics[0].partitions[0].error_code == ErrorCode.unknown_member_id
    for fetch_v in (1, 5, 7, 8, 9):
        assert await _fetch(client, fetch_v, group, {"t": (0, 3)}) == (
            ErrorCode.none,
            {("t", 0): 10, ("t", 3): 30},
        )
    # v2+ with null topics: every committed partition.
    assert await _fetch(client, 7, group, None) == (
        ErrorCode.none,
        {("t", 0): 10, ("t", 3): 30},
    )

    described = await call(client, ApiKey.DESCRIBE_GROUPS, 5, groups=(group,))
    (g,) = described.groups
    assert (g.group_state, g.protocol_type, g.protocol_data) == ("Stable", "consumer", "range")
    (mem,) = g.members
    assert (mem.member_id, mem.client_id, mem.client_host) == (member, "wire-test", "/127.0.0.1")
    assert (mem.member_metadata, mem.member_assignment) == (b"meta", b"all-yours")
    listed = await call(client, ApiKey.LIST_GROUPS, 5, states_filter=("stable",))
    assert [(x.group_id, x.group_state, x.group_type) for x in listed.groups] == [
        (group, "Stable", "classic")
    ]
    other_type = await call(client, ApiKey.LIST_GROUPS, 5, types_filter=("consumer",))
    assert other_type.groups == ()

    busy = await call(client, ApiKey.DELETE_GROUPS, 2, groups_names=(group,))
    assert busy.results[0].error_code == ErrorCode.non_empty_group

    member_entry = (
        nested(ApiKey.LEAVE_GROUP, leave_v, "members", member_id=member, group_instance_id=None)
        if leave_v >= 3
        else None
    )
    left = await call(
        client,
        ApiKey.LEAVE_GROUP,
        leave_v,
        group_id=group,
        member_id=member,
        members=(member_entry,),
    )
    assert left.error_code == ErrorCode.none
    if leave_v >= 3:
        assert [(x.member_id, x.error_code) for x in left.members] == [(member, ErrorCode.none)]
    deleted = await call(client, ApiKey.DELETE_GROUPS, 2, groups_names=(group,))
    assert deleted.results[0].error_code == ErrorCode.none
    assert await _fetch(client, 8, group, {"t": (0,)}) == (ErrorCode.none, {("t", 0): -1})


async def test_find_coordinator_key_types_and_batches(gb: GroupBroker, client: WireClient) -> None:
    batch = ("a", "b", "", "ünïcode-group")
    response = await call(client, ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=batch)
    assert [(c.key, c.error_code, c.port) for c in response.coordinators] == [
        (k, ErrorCode.none, gb.port) for k in batch
    ]
    txn = await call(client, ApiKey.FIND_COORDINATOR, 3, key="txn-1", key_type=1)
    assert (txn.error_code, txn.node_id, txn.port) == (ErrorCode.coordinator_not_available, -1, -1)
    share = await call(client, ApiKey.FIND_COORDINATOR, 6, key_type=2, coordinator_keys=("s",))
    assert share.coordinators[0].error_code == ErrorCode.invalid_request


async def test_not_coordinator_errors_per_version(gb: GroupBroker, client: WireClient) -> None:
    """Groups on an offsets partition this node does not lead: v1 OffsetFetch puts the
    error on every partition, v2+ at the top level; member APIs answer NOT_COORDINATOR."""
    group = "moved-away"
    partition = gb.service.shell.coordinator.partition_for(group)
    gb.service.shell.resign(partition)
    code, offsets = await _fetch(client, 1, group, {"t": (0, 1)})
    assert (code, offsets) == (ErrorCode.not_coordinator, {("t", 0): -1, ("t", 1): -1})
    assert await _fetch(client, 5, group, {"t": (0,)}) == (ErrorCode.not_coordinator, {})
    assert await _fetch(client, 9, group, {"t": (0,)}) == (ErrorCode.not_coordinator, {})
    assert (await join(client, 9, group)).error_code == ErrorCode.not_coordinator
    left = await call(client, ApiKey.LEAVE_GROUP, 1, group_id=group, member_id="m")
    assert left.error_code == ErrorCode.not_coordinator
    described = await call(client, ApiKey.DESCRIBE_GROUPS, 6, groups=(group,))
    assert described.groups[0].error_code == ErrorCode.not_coordinator
    await gb.service.shell.become_coordinator(partition)
    assert await _fetch(client, 5, group, {"t": (0,)}) == (ErrorCode.none, {("t", 0): -1})


async def test_coordinator_unavailable_until_the_service_runs(nursery: trio.Nursery) -> None:
    service = InProcessGroupService(port=9092)
    assert await service.coordinator_for("g") == (ErrorCode.coordinator_not_available, -1, "", -1)
    await nursery.start(service.run)
    location = await service.coordinator_for("g")
    assert location == CoordinatorLocation(ErrorCode.none, 0, "127.0.0.1", 9092)
    assert location.port == 9092


FUZZ_SEED = 20240917
FUZZ_CASES = 80


async def test_random_group_bodies_never_break_the_server(gb: GroupBroker) -> None:
    """Valid headers of group APIs followed by random bodies: the server answers or closes
    that connection, and keeps serving groups. Replays exactly from FUZZ_SEED."""
    import random
    import struct

    from tests.kafka.wire import raw_header

    rng = random.Random(FUZZ_SEED)
    table = sorted((k, lo, hi) for k, (lo, hi) in GROUP_VERSION_TABLE.items())
    for case in range(FUZZ_CASES):
        api_key, lo, hi = rng.choice(table)
        version = rng.randint(lo, hi)
        body = rng.randbytes(rng.randint(0, 48))
        payload = raw_header(api_key, version, case) + body
        wire = await WireClient.connect(gb.port)
        await wire.send_raw(struct.pack(">i", len(payload)) + payload)
        with trio.fail_after(STEP_DEADLINE_S):
            try:
                await wire.stream.receive_some(65536)  # a response, or b"" when closed
            except trio.BrokenResourceError:
                pass
        await wire.aclose()
        print(f"seed={FUZZ_SEED} case={case} api={api_key} v{version} ok")
    wire = await WireClient.connect(gb.port)
    response = await call(wire, ApiKey.FIND_COORDINATOR, 6, coordinator_keys=("after-fuzz",))
    assert response.coordinators[0].error_code == ErrorCode.none
    await wire.aclose()
