"""Property tests of the group handlers' version translation, without sockets.

The handlers are called with kio requests of a random advertised version and a scripted shell;
their answer is built and encoded as that version's response with kio and decoded again, so
what is checked is what a client of that version would read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from raftlog.config import NodeConfig
from raftlog.groups import messages as m
from raftlog.groups.service import CoordinatorLocation
from raftlog.net.kafka import codec
from raftlog.net.kafka.apis import ApiKey
from raftlog.net.kafka.context import NoQuotas, RequestContext
from raftlog.net.kafka.handlers_groups import GROUP_VERSION_TABLE, GroupHandlers
from tests.kafka.test_groups_wire import item_class, make, nested, req
from tests.kafka.wire import decode_response

EXAMPLES = 60
PORT = 9092
NODE_ID = 7

names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
codes = st.sampled_from(
    [
        ErrorCode.none,
        ErrorCode.unknown_member_id,
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.fenced_instance_id,
    ]
)


def versions(api_key: int) -> st.SearchStrategy[int]:
    lo, hi = GROUP_VERSION_TABLE[api_key]
    return st.integers(lo, hi)


@dataclasses.dataclass
class FakeConnection:
    peer: str = "10.1.2.3:4567"
    client_id: str = "prop"
    user: str = "ANONYMOUS"

    def mute(self, duration_ms: int) -> None:
        pass


class ScriptedShell:
    """Answers from tables the test fills in, and records what it was asked."""

    def __init__(self) -> None:
        self.leave_codes: dict[str, ErrorCode] = {}
        self.leave_top_level = ErrorCode.none
        self.fetch_response = m.OffsetFetchResponse(ErrorCode.none)
        self.asked: list[Any] = []

    async def leave_group(self, req: m.LeaveGroupRequest) -> m.LeaveGroupResponse:
        self.asked.append(req)
        if self.leave_top_level is not ErrorCode.none:
            return m.LeaveGroupResponse(self.leave_top_level)
        return m.LeaveGroupResponse(
            ErrorCode.none,
            tuple(
                m.LeaveMemberResult(x.member_id, x.group_instance_id, self.leave_codes[x.member_id])
                for x in req.members
            ),
        )

    async def offset_fetch(self, req: m.OffsetFetchRequest) -> m.OffsetFetchResponse:
        self.asked.append(req)
        return self.fetch_response


class ScriptedService:
    def __init__(self) -> None:
        self.shell = ScriptedShell()
        self.located: list[str] = []

    async def coordinator_for(self, group_id: str) -> CoordinatorLocation:
        self.located.append(group_id)
        return CoordinatorLocation(ErrorCode.none, NODE_ID, "broker.example", PORT)


async def roundtrip(api_key: int, version: int, request: Any, service: ScriptedService) -> Any:
    """Handle `request` and return the response as a client of `version` decodes it."""
    ctx = RequestContext(
        backend=None,  # type: ignore[arg-type]  # group handlers never touch the backend
        config=NodeConfig(),
        quotas=NoQuotas(),
        connection=FakeConnection(),
        api_key=api_key,
        api_version=version,
        correlation_id=1,
        client_id="prop",
    )
    handler = getattr(GroupHandlers(service), _HANDLER_NAMES[api_key])  # type: ignore[arg-type]
    result = await handler(ctx, request)
    response = codec.build(codec.response_class(api_key, version), {**result, "throttle_time": 0})
    payload = b"".join(codec.encode_response(response, 1))  # type: ignore[arg-type]
    correlation_id, decoded = decode_response(payload, api_key, version)
    assert correlation_id == 1
    return decoded


_HANDLER_NAMES = {
    ApiKey.FIND_COORDINATOR: "find_coordinator",
    ApiKey.LEAVE_GROUP: "leave_group",
    ApiKey.OFFSET_FETCH: "offset_fetch",
}


@settings(max_examples=EXAMPLES, deadline=None)
@given(version=versions(ApiKey.FIND_COORDINATOR), keys=st.lists(names, max_size=8))
async def test_find_coordinator_answers_every_key_in_order(version: int, keys: list[str]) -> None:
    service = ScriptedService()
    if version < 4:
        keys = keys[:1] or [""]
    request = req(ApiKey.FIND_COORDINATOR, version, key=keys[0] if keys else "", key_type=0)
    request = dataclasses.replace(
        request, **({"coordinator_keys": tuple(keys)} if version >= 4 else {})
    )
    response = await roundtrip(ApiKey.FIND_COORDINATOR, version, request, service)
    answers = response.coordinators if version >= 4 else [response]
    assert service.located == keys
    assert [(a.error_code, a.node_id, a.host, a.port) for a in answers] == [
        (ErrorCode.none, NODE_ID, "broker.example", PORT)
    ] * len(keys)
    if version >= 4:
        assert [a.key for a in answers] == keys


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    version=versions(ApiKey.LEAVE_GROUP),
    members=st.lists(st.tuples(names, codes), min_size=1, max_size=6, unique_by=lambda x: x[0]),
    top_level=st.sampled_from([ErrorCode.none, ErrorCode.not_coordinator]),
)
async def test_leave_group_per_version(
    version: int, members: list[tuple[str, ErrorCode]], top_level: ErrorCode
) -> None:
    service = ScriptedService()
    if version < 3:
        members = members[:1]
    service.shell.leave_codes = dict(members)
    service.shell.leave_top_level = top_level
    items = tuple(
        nested(ApiKey.LEAVE_GROUP, version, "members", member_id=mid, group_instance_id=None)
        for mid, _ in members
        if version >= 3  # v0-2 name one member at the top level
    )
    request = req(ApiKey.LEAVE_GROUP, version, group_id="g", member_id=members[0][0], members=items)
    response = await roundtrip(ApiKey.LEAVE_GROUP, version, request, service)
    (asked,) = service.shell.asked
    assert [x.member_id for x in asked.members] == [mid for mid, _ in members]
    if version >= 3:
        assert response.error_code == top_level
        expected = [] if top_level is not ErrorCode.none else members
        assert [(x.member_id, x.error_code) for x in response.members] == expected
    else:
        # One member, one code: the top level carries whichever error there is.
        expected_code = top_level if top_level is not ErrorCode.none else members[0][1]
        assert response.error_code == expected_code


committed = st.dictionaries(
    st.tuples(st.sampled_from(["t1", "t2"]), st.integers(0, 3)),
    st.tuples(st.integers(-1, 2**40), st.integers(-1, 50), names),
    max_size=6,
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    version=versions(ApiKey.OFFSET_FETCH),
    offsets=committed,
    group_error=st.sampled_from([ErrorCode.none, ErrorCode.not_coordinator]),
)
async def test_offset_fetch_per_version(
    version: int, offsets: dict[tuple[str, int], tuple[int, int, str]], group_error: ErrorCode
) -> None:
    service = ScriptedService()
    by_topic: dict[str, list[tuple[int, tuple[int, int, str]]]] = {}
    for (topic, partition), value in sorted(offsets.items()):
        by_topic.setdefault(topic, []).append((partition, value))
    fetched = tuple(
        m.FetchedTopic(t, tuple(m.FetchedOffset(p, o, e, md) for p, (o, e, md) in ps))
        for t, ps in by_topic.items()
    )
    service.shell.fetch_response = (
        m.OffsetFetchResponse(group_error)
        if group_error is not ErrorCode.none
        else m.OffsetFetchResponse(ErrorCode.none, fetched)
    )
    wanted = {t: tuple(p for p, _ in ps) for t, ps in by_topic.items()}
    if version >= 8:
        group_cls = item_class(codec.request_class(ApiKey.OFFSET_FETCH, version), "groups")
        topic_cls = item_class(group_cls, "topics")
        topics = tuple(make(topic_cls, name=t, partition_indexes=ps) for t, ps in wanted.items())
        entry = make(group_cls, group_id="g", member_id=None, topics=topics)
        request = req(ApiKey.OFFSET_FETCH, version, groups=(entry,))
    else:
        topics = tuple(
            nested(ApiKey.OFFSET_FETCH, version, "topics", name=t, partition_indexes=ps)
            for t, ps in wanted.items()
        )
        request = req(ApiKey.OFFSET_FETCH, version, group_id="g", topics=topics)
    response = await roundtrip(ApiKey.OFFSET_FETCH, version, request, service)
    (asked,) = service.shell.asked
    assert asked.group_id == "g"
    assert {t.name: t.partitions for t in asked.topics or ()} == wanted

    answer = response.groups[0] if version >= 8 else response
    got = {
        (t.name, p.partition_index): (
            p.committed_offset,
            p.committed_leader_epoch if version >= 5 else None,
            p.metadata,
            p.error_code,
        )
        for t in answer.topics
        for p in t.partitions
    }
    if group_error is ErrorCode.none:
        assert getattr(answer, "error_code", ErrorCode.none) == ErrorCode.none
        assert got == {
            k: (o, e if version >= 5 else None, md, ErrorCode.none)
            for k, (o, e, md) in offsets.items()
        }
    elif version < 2:
        # No top-level error field: every requested partition carries the group's error.
        assert got == {k: (-1, None, "", group_error) for k in offsets}
    else:
        assert (answer.error_code, got) == (group_error, {})


async def test_handlers_module_covers_the_table() -> None:
    """Every advertised API has a handler that a registry accepts (kio models the range)."""
    from raftlog.net.kafka.apis import ApiRegistry
    from raftlog.net.kafka.handlers_consumer_group import CONSUMER_GROUP_VERSION_TABLE
    from raftlog.net.kafka.handlers_groups import register_group_apis

    registry = ApiRegistry()
    register_group_apis(registry, ScriptedService())  # type: ignore[arg-type]
    assert {k: (lo, hi) for k, lo, hi in registry.table()} == {
        **GROUP_VERSION_TABLE,
        **CONSUMER_GROUP_VERSION_TABLE,
    }
    await trio.lowlevel.checkpoint()
