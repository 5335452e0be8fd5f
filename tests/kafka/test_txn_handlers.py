"""The transaction handlers, called with kio requests of each advertised version, without
sockets: the answer is built and encoded as that version's response with kio and decoded
again, so what is checked is what a client of that version reads.

Behind the handlers: InProcessTxnService (real TxnCoordinators, appends in memory) and the
in-memory test backend, whose partitions keep a real ProducerStateTable and take the
coordinator's markers as control batches.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.groups.settings import OFFSETS_TOPIC
from raftlog.metadata.controller.messages import NewTopic
from raftlog.net.kafka import authz, codec
from raftlog.net.kafka.apis import ApiKey, ApiRegistry, default_registry
from raftlog.net.kafka.context import NoQuotas, RequestContext
from raftlog.net.kafka.handlers_txn import TXN_VERSION_TABLE, register_txn_apis
from raftlog.records import Record, build_batch
from raftlog.security.acl import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from raftlog.security.authorizer import Authorizer
from raftlog.txn.log_format import MAX_TRANSACTIONAL_ID_BYTES
from tests.kafka.memory_backend import MemoryBackend
from tests.kafka.wire import decode_response
from tests.txn.inprocess_service import InProcessTxnService
from tests.waiting import wait_until

E = ErrorCode
TIMEOUT_MS = 60_000
TOPIC = "orders"
PARTITIONS = 3


@dataclasses.dataclass
class FakeConnection:
    peer: str = "10.1.2.3:4567"
    client_id: str = "txn-test"
    user: str = "alice"
    principal: str = "User:alice"
    listener: str = "PLAINTEXT"

    def mute(self, duration_ms: int) -> None:
        pass


@dataclasses.dataclass
class Env:
    backend: MemoryBackend
    service: InProcessTxnService
    registry: ApiRegistry
    authorizer: Authorizer | None = None
    last_payload: bytes = b""

    def set_acls(self, *bindings: AclBinding) -> None:
        self.authorizer = Authorizer(
            bindings, super_users=frozenset(), allow_everyone_if_no_acl_found=False
        )

    async def call(self, api_key: int, version: int, *, decode: bool = True, **values: Any) -> Any:
        """Handle the request as `version` and return the response a client decodes (with
        decode=False: the response as encoded, for what kio's reader refuses)."""
        spec = self.registry.get(api_key)
        assert spec is not None and spec.supports(version), (api_key, version)
        request = codec.build(codec.request_class(api_key, version), values)
        ctx = RequestContext(
            backend=self.backend,  # type: ignore[arg-type]  # no ACL or SCRAM methods
            config=NodeConfig(),
            quotas=NoQuotas(),
            connection=FakeConnection(),
            api_key=api_key,
            api_version=version,
            correlation_id=1,
            client_id="txn-test",
            authorizer=self.authorizer,
        )
        with trio.fail_after(10):
            result = await spec.handler(ctx, request)
        assert result is not None
        response_cls = codec.response_class(api_key, version)
        response = codec.build(response_cls, {**result, "throttle_time": 0})
        payload = b"".join(codec.encode_response(response, 1))  # type: ignore[arg-type]
        self.last_payload = payload
        if not decode:
            return response
        correlation_id, decoded = decode_response(payload, api_key, version)
        assert correlation_id == 1
        return decoded

    # ------------------------------------------------------------------ requests
    async def init(
        self, txn_id: str | None, version: int = 4, *, pid: int = -1, epoch: int = -1
    ) -> Any:
        return await self.call(
            ApiKey.INIT_PRODUCER_ID,
            version,
            transactional_id=txn_id,
            transaction_timeout=TIMEOUT_MS,
            producer_id=pid,
            producer_epoch=epoch,
        )

    async def add(
        self,
        txn_id: str,
        pid: int,
        epoch: int,
        partitions: Sequence[tuple[str, int]],
        version: int = 3,
    ) -> dict[tuple[str, int], ErrorCode]:
        topics = _topics(partitions, "partitions")
        if version >= 4:
            response = await self.call(
                ApiKey.ADD_PARTITIONS_TO_TXN,
                version,
                transactions=[
                    {
                        "transactional_id": txn_id,
                        "producer_id": pid,
                        "producer_epoch": epoch,
                        "verify_only": False,
                        "topics": topics,
                    }
                ],
            )
            assert response.error_code == E.none
            (result,) = response.results_by_transaction
            return _add_codes(result.topic_results)
        response = await self.call(
            ApiKey.ADD_PARTITIONS_TO_TXN,
            version,
            v3_and_below_transactional_id=txn_id,
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=topics,
        )
        return _add_codes(response.results_by_topic_v3_and_below)

    async def add_offsets(
        self, txn_id: str, pid: int, epoch: int, group: str = "g", version: int = 3
    ) -> ErrorCode:
        response = await self.call(
            ApiKey.ADD_OFFSETS_TO_TXN,
            version,
            transactional_id=txn_id,
            producer_id=pid,
            producer_epoch=epoch,
            group_id=group,
        )
        return ErrorCode(response.error_code)

    async def end(
        self, txn_id: str, pid: int, epoch: int, commit: bool = True, version: int = 3
    ) -> ErrorCode:
        response = await self.call(
            ApiKey.END_TXN,
            version,
            transactional_id=txn_id,
            producer_id=pid,
            producer_epoch=epoch,
            committed=commit,
        )
        return ErrorCode(response.error_code)

    async def markers(self, *markers: dict[str, Any]) -> list[dict[tuple[str, int], ErrorCode]]:
        response = await self.call(ApiKey.WRITE_TXN_MARKERS, 1, markers=list(markers))
        return [
            {(t.name, p.partition_index): p.error_code for t in m.topics for p in t.partitions}
            for m in response.markers
        ]

    async def producers(self, *partitions: tuple[str, int]) -> dict[tuple[str, int], Any]:
        response = await self.call(
            ApiKey.DESCRIBE_PRODUCERS, 0, topics=_topics(partitions, "partition_indexes")
        )
        return {(t.name, p.partition_index): p for t in response.topics for p in t.partitions}

    async def describe(self, *txn_ids: str) -> list[Any]:
        # Not decoded: a transaction not open has start time -1 on the wire, as in Kafka,
        # which kio's reader refuses (Kafka's clients read it).
        response = await self.call(
            ApiKey.DESCRIBE_TRANSACTIONS, 0, decode=False, transactional_ids=list(txn_ids)
        )
        return list(response.transaction_states)

    async def produce_txn(self, pid: int, epoch: int, partition: int = 0, seq: int = 0) -> int:
        result = await self.backend.produce(
            TOPIC, partition, txn_batch(pid, epoch, seq), -1, 5000, _producer()
        )
        assert result.error == E.none
        return result.base_offset

    async def begin(self, txn_id: str, *partitions: int) -> tuple[int, int]:
        """InitProducerId, then partitions of TOPIC added and written to."""
        init = await self.init(txn_id)
        assert init.error_code == E.none, init
        pid, epoch = init.producer_id, init.producer_epoch
        if partitions:
            added = await self.add(txn_id, pid, epoch, [(TOPIC, p) for p in partitions])
            assert set(added.values()) == {E.none}, added
            for p in partitions:
                await self.produce_txn(pid, epoch, p)
        return pid, epoch


def _producer() -> Any:
    from raftlog.net.kafka.backend import ProducerInfo

    return ProducerInfo()


def txn_batch(pid: int, epoch: int, seq: int = 0) -> bytes:
    return build_batch(
        [Record(key=b"k", value=b"v"), Record(key=b"k2", value=b"v2")],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        is_transactional=True,
        now_ms=1_700_000_000_000,
    )


def _topics(partitions: Sequence[tuple[str, int]], field: str) -> list[dict[str, Any]]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return [{"name": t, field: ps} for t, ps in by_topic.items()]


def _add_codes(topic_results: Any) -> dict[tuple[str, int], ErrorCode]:
    return {
        (t.name, p.partition_index): p.partition_error_code
        for t in topic_results
        for p in t.results_by_partition
    }


def acl(
    resource_type: ResourceType,
    name: str,
    operation: AclOperation,
    permission: AclPermissionType = AclPermissionType.ALLOW,
) -> AclBinding:
    return AclBinding(
        resource_type, name, PatternType.LITERAL, "User:alice", "*", operation, permission
    )


@pytest.fixture
async def env(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Env]:
    backend = MemoryBackend(tmp_path)
    await backend.create_topics([NewTopic(TOPIC, PARTITIONS, 1)], 5000, False)
    await backend.create_topics([NewTopic("other", 1, 1)], 5000, False)
    service = InProcessTxnService(backend.write_txn_markers)
    await nursery.start(service.run)
    registry = default_registry()
    register_txn_apis(registry, service)
    yield Env(backend, service, registry)
    backend.close()


def versions(api_key: int) -> range:
    lo, hi = TXN_VERSION_TABLE[api_key]
    return range(lo, hi + 1)


# ---------------------------------------------------------------- the table
def test_registered_versions_and_rules() -> None:
    registry = default_registry()
    register_txn_apis(registry, None)  # type: ignore[arg-type]  # handlers bind lazily
    table = {k: (lo, hi) for k, lo, hi in registry.table()}
    for api_key, span in TXN_VERSION_TABLE.items():
        assert table[api_key] == span
        # Every API says what it checks (authz.API_RULES is the one list of checks).
        assert authz.API_RULES[codec.api_name(api_key)], api_key
    # EndTxn v5 is KIP-890 part 2 (an epoch bump per transaction); Produce v12 with it.
    assert TXN_VERSION_TABLE[ApiKey.END_TXN] == (0, 5)
    assert table[ApiKey.PRODUCE][1] == 13


# ---------------------------------------------------------------- a transaction per version
@pytest.mark.parametrize("version", versions(ApiKey.INIT_PRODUCER_ID))
async def test_init_producer_id_per_version(env: Env, version: int) -> None:
    first = await env.init("tx-init", version)
    assert (first.error_code, first.producer_epoch) == (E.none, 0)
    again = await env.init("tx-init", version)
    assert (again.error_code, again.producer_id) == (E.none, first.producer_id)
    assert again.producer_epoch == 1  # the first producer is fenced
    # Without a transactional id the backend hands out an idempotent id, as before.
    idempotent = await env.init(None, version)
    assert idempotent.error_code == E.none and idempotent.producer_id > 1000
    assert idempotent.producer_id != first.producer_id


@pytest.mark.parametrize("version", versions(ApiKey.ADD_PARTITIONS_TO_TXN)[:4])
async def test_commit_per_add_partitions_version(env: Env, version: int) -> None:
    pid, epoch = (await env.init(f"tx-{version}")).producer_id, 0
    added = await env.add(f"tx-{version}", pid, epoch, [(TOPIC, 0), (TOPIC, 2)], version)
    assert added == {(TOPIC, 0): E.none, (TOPIC, 2): E.none}
    first = await env.produce_txn(pid, epoch, 0)
    open_ = await env.producers((TOPIC, 0))
    (state,) = open_[(TOPIC, 0)].active_producers
    assert (state.producer_id, state.current_txn_start_offset) == (pid, first)
    assert await env.end(f"tx-{version}", pid, epoch, commit=True) == E.none
    await wait_until(
        "the commit completes", lambda: env.service.state_of(f"tx-{version}") == "CompleteCommit"
    )
    # Both partitions got the COMMIT marker; the open transaction on partition 0 ended.
    (marker,) = env.backend.markers_written
    assert marker.commit and marker.producer_id == pid
    assert set(marker.partitions) == {(TOPIC, 0), (TOPIC, 2)}
    done = await env.producers((TOPIC, 0), (TOPIC, 2))
    for key in ((TOPIC, 0), (TOPIC, 2)):
        (state,) = done[key].active_producers
        assert (state.current_txn_start_offset, state.coordinator_epoch) == (-1, 0)


@pytest.mark.parametrize("version", versions(ApiKey.END_TXN))
async def test_abort_and_fencing_per_end_txn_version(env: Env, version: int) -> None:
    pid, old_epoch = await env.begin("tx-end", 1)
    assert await env.end("tx-end", pid, old_epoch, commit=False, version=version) == E.none
    await wait_until("aborted", lambda: env.service.state_of("tx-end") == "CompleteAbort")
    assert not env.backend.markers_written[-1].commit
    # A new producer with the same id fences the old one (after v5's own bump at the end).
    bumps = 2 if version >= 5 else 1
    assert (await env.init("tx-end")).producer_epoch == old_epoch + bumps
    fenced = E.producer_fenced if version >= 2 else E.invalid_producer_epoch
    assert await env.end("tx-end", pid, old_epoch, version=version) == fenced


@pytest.mark.parametrize("version", versions(ApiKey.ADD_OFFSETS_TO_TXN))
async def test_add_offsets_per_version(env: Env, version: int) -> None:
    pid, epoch = await env.begin("tx-offsets")
    assert await env.add_offsets("tx-offsets", pid, epoch, "group-1", version) == E.none
    (described,) = await env.describe("tx-offsets")
    assert described.transaction_state == "Ongoing"
    assert [t.topic for t in described.topics] == [OFFSETS_TOPIC]
    assert await env.add_offsets("tx-offsets", pid, epoch, "", version) == E.invalid_group_id
    huge = "g" * 40_000
    assert await env.add_offsets("tx-offsets", pid, epoch, huge, version) == E.invalid_group_id
    await env.init("tx-offsets")  # fences, aborting the open transaction
    fenced = E.producer_fenced if version >= 2 else E.invalid_producer_epoch
    assert await env.add_offsets("tx-offsets", pid, epoch, "group-1", version) in (
        fenced,
        E.concurrent_transactions,
    )


@pytest.mark.parametrize("version", versions(ApiKey.ADD_PARTITIONS_TO_TXN)[:4])
async def test_add_partitions_fenced_per_version(env: Env, version: int) -> None:
    pid, epoch = await env.begin("tx-fence")
    await env.init("tx-fence")
    codes = await env.add("tx-fence", pid, epoch, [(TOPIC, 0)], version)
    assert codes == {(TOPIC, 0): E.producer_fenced if version >= 2 else E.invalid_producer_epoch}


# ---------------------------------------------------------------- topic checks
async def test_unknown_topics_and_partitions_fail_the_whole_transaction(env: Env) -> None:
    pid, epoch = await env.begin("tx-unknown")
    codes = await env.add(
        "tx-unknown", pid, epoch, [(TOPIC, 0), (TOPIC, PARTITIONS), (TOPIC, -1), ("ghost", 0)]
    )
    assert codes == {
        (TOPIC, 0): E.operation_not_attempted,
        (TOPIC, PARTITIONS): E.unknown_topic_or_partition,
        (TOPIC, -1): E.unknown_topic_or_partition,
        ("ghost", 0): E.unknown_topic_or_partition,
    }
    # Nothing reached the coordinator: no transaction is open.
    (described,) = await env.describe("tx-unknown")
    assert described.transaction_state == "Empty"


@pytest.mark.parametrize("internal", [OFFSETS_TOPIC, "__transaction_state", "__cluster_metadata"])
async def test_clients_may_not_add_internal_topics(env: Env, internal: str) -> None:
    pid, epoch = await env.begin("tx-internal")
    codes = await env.add("tx-internal", pid, epoch, [(internal, 0), (TOPIC, 0)])
    assert codes == {
        (internal, 0): E.topic_authorization_failed,
        (TOPIC, 0): E.operation_not_attempted,
    }


async def test_duplicate_partitions_are_answered_once(env: Env) -> None:
    pid, epoch = await env.begin("tx-dup")
    codes = await env.add("tx-dup", pid, epoch, [(TOPIC, 1), (TOPIC, 1), (TOPIC, 1)])
    assert codes == {(TOPIC, 1): E.none}


# ---------------------------------------------------------------- hostile fields
@pytest.mark.parametrize(
    ("pid", "epoch", "expected"),
    [
        (-1, 0, E.invalid_request),
        (-(2**63), 0, E.invalid_request),
        (5, -1, E.invalid_request),
        (5, -(2**15), E.invalid_request),
        (2**63 - 1, 0, E.invalid_producer_id_mapping),  # in range, never handed out
        (2**63 - 1, 2**15 - 1, E.invalid_producer_id_mapping),
    ],
)
async def test_producer_ids_and_epochs_are_range_checked(
    env: Env, pid: int, epoch: int, expected: ErrorCode
) -> None:
    await env.begin("tx-range")
    assert await env.add("tx-range", pid, epoch, [(TOPIC, 0)]) == {(TOPIC, 0): expected}
    assert await env.add_offsets("tx-range", pid, epoch) == expected
    assert await env.end("tx-range", pid, epoch) == expected


@pytest.mark.parametrize("txn_id", ["", "x" * (MAX_TRANSACTIONAL_ID_BYTES + 1), "é" * 20_000])
async def test_empty_and_oversized_transactional_ids(env: Env, txn_id: str) -> None:
    assert (await env.init(txn_id)).error_code == E.invalid_request
    assert await env.add(txn_id, 1, 0, [(TOPIC, 0)]) == {(TOPIC, 0): E.invalid_request}
    assert await env.add_offsets(txn_id, 1, 0) == E.invalid_request
    assert await env.end(txn_id, 1, 0) == E.invalid_request
    (described,) = await env.describe(txn_id)
    assert described.error_code == E.invalid_request
    assert not env.service.logs  # nothing was stored


async def test_init_producer_id_hostile_fields(env: Env) -> None:
    for timeout_ms in (0, -1, -(2**31)):
        answer = await env.call(
            ApiKey.INIT_PRODUCER_ID,
            4,
            transactional_id="tx-hostile",
            transaction_timeout=timeout_ms,
            producer_id=-1,
            producer_epoch=-1,
        )
        assert answer.error_code == E.invalid_transaction_timeout
    too_long = await env.call(
        ApiKey.INIT_PRODUCER_ID,
        4,
        transactional_id="tx-hostile",
        transaction_timeout=2**31 - 1,
        producer_id=-1,
        producer_epoch=-1,
    )
    assert too_long.error_code == E.invalid_transaction_timeout
    # KIP-360: an id without an epoch (or out of range) is refused.
    for pid, epoch in ((7, -1), (-1, 0), (-5, 3), (7, -7)):
        assert (await env.init("tx-hostile", pid=pid, epoch=epoch)).error_code == E.invalid_request
    # An id and epoch the coordinator never handed out fences nothing.
    assert (await env.init("tx-hostile")).error_code == E.none
    stranger = await env.init("tx-hostile", pid=2**63 - 1, epoch=0)
    assert stranger.error_code == E.producer_fenced


async def test_a_million_partitions_are_refused_without_echoing_them(env: Env) -> None:
    pid, epoch = await env.begin("tx-huge")
    huge = [{"name": TOPIC, "partitions": list(range(1_000_000))}]
    v3 = await env.call(
        ApiKey.ADD_PARTITIONS_TO_TXN,
        3,
        v3_and_below_transactional_id="tx-huge",
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=huge,
    )
    assert v3.results_by_topic_v3_and_below == ()
    txn = {"transactional_id": "tx-huge", "producer_id": pid, "producer_epoch": epoch}
    v4 = await env.call(
        ApiKey.ADD_PARTITIONS_TO_TXN,
        4,
        transactions=[{**txn, "verify_only": False, "topics": huge}],
    )
    assert (v4.error_code, v4.results_by_transaction) == (E.invalid_request, ())
    many = [{**txn, "verify_only": True, "topics": []}] * 10_001
    v4 = await env.call(ApiKey.ADD_PARTITIONS_TO_TXN, 4, transactions=many)
    assert v4.error_code == E.invalid_request
    markers = await env.call(
        ApiKey.WRITE_TXN_MARKERS,
        1,
        markers=[
            {
                "producer_id": pid,
                "producer_epoch": epoch,
                "transaction_result": True,
                "coordinator_epoch": 0,
                "topics": [{"name": TOPIC, "partition_indexes": list(range(1_000_000))}],
            }
        ],
    )
    assert markers.markers == ()
    producers = await env.call(
        ApiKey.DESCRIBE_PRODUCERS,
        0,
        topics=[{"name": TOPIC, "partition_indexes": list(range(1_000_000))}],
    )
    assert producers.topics == ()
    described = await env.call(ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=["t"] * 10_001)
    assert described.transaction_states == ()
    listed = await env.call(
        ApiKey.LIST_TRANSACTIONS, 1, state_filters=["Ongoing"] * 101, producer_id_filters=[]
    )
    assert listed.error_code == E.invalid_request
    assert not env.backend.markers_written
    # The transaction itself is untouched.
    assert env.service.state_of("tx-huge") == "Empty"


# ---------------------------------------------------------------- v4: brokers' batches
async def test_v4_batches_and_verification(env: Env) -> None:
    a_pid, a_epoch = await env.begin("tx-a")
    b_pid, b_epoch = await env.begin("tx-b")

    def txn(txn_id: str, pid: int, epoch: int, verify: bool, *partitions: int) -> dict[str, Any]:
        return {
            "transactional_id": txn_id,
            "producer_id": pid,
            "producer_epoch": epoch,
            "verify_only": verify,
            "topics": [{"name": TOPIC, "partitions": list(partitions)}],
        }

    async def batch(*transactions: dict[str, Any]) -> dict[str, dict[tuple[str, int], Any]]:
        response = await env.call(ApiKey.ADD_PARTITIONS_TO_TXN, 4, transactions=list(transactions))
        assert response.error_code == E.none
        return {
            r.transactional_id: _add_codes(r.topic_results) for r in response.results_by_transaction
        }

    # KIP-890 verification: not yet in the transaction.
    assert await batch(txn("tx-a", a_pid, a_epoch, True, 0)) == {
        "tx-a": {(TOPIC, 0): E.invalid_txn_state}
    }
    assert await batch(
        txn("tx-a", a_pid, a_epoch, False, 0), txn("tx-b", b_pid, b_epoch, False, 1, 2)
    ) == {"tx-a": {(TOPIC, 0): E.none}, "tx-b": {(TOPIC, 1): E.none, (TOPIC, 2): E.none}}
    assert await batch(
        txn("tx-a", a_pid, a_epoch, True, 0), txn("tx-b", b_pid, b_epoch, True, 0)
    ) == {"tx-a": {(TOPIC, 0): E.none}, "tx-b": {(TOPIC, 0): E.invalid_txn_state}}
    # Brokers may verify the offsets partition of a transactional offset commit.
    assert await batch(
        {
            **txn("tx-a", a_pid, a_epoch, True),
            "topics": [{"name": OFFSETS_TOPIC, "partitions": [0]}],
        }
    ) == {"tx-a": {(OFFSETS_TOPIC, 0): E.unknown_topic_or_partition}}


# ---------------------------------------------------------------- WriteTxnMarkers
def marker(
    pid: int, epoch: int, commit: bool, *partitions: tuple[str, int], cepoch: int = 0
) -> dict[str, Any]:
    return {
        "producer_id": pid,
        "producer_epoch": epoch,
        "transaction_result": commit,
        "coordinator_epoch": cepoch,
        "topics": _topics(partitions, "partition_indexes"),
    }


async def test_write_txn_markers(env: Env) -> None:
    """What `kafka-transactions.sh abort` sends: an ABORT marker ends a hanging transaction
    written by a producer the coordinator does not know."""
    first = await env.produce_txn(77, 3, 0)
    await env.produce_txn(77, 3, 1)
    (state,) = (await env.producers((TOPIC, 0)))[(TOPIC, 0)].active_producers
    assert state.current_txn_start_offset == first
    env.backend.not_leader[(TOPIC, 2)] = env.backend.not_leader.get((TOPIC, 2)) or _hint()
    answers = await env.markers(
        marker(77, 3, False, (TOPIC, 0), (TOPIC, 1), (TOPIC, 2), ("ghost", 0), (TOPIC, 9)),
        marker(77, 3, False, ("__transaction_state", 0), ("__cluster_metadata", 0)),
        marker(-1, 3, True, (TOPIC, 0)),
        marker(77, -3, True, (TOPIC, 0)),
        marker(77, 3, True, (TOPIC, 0), cepoch=-1),
    )
    assert answers == [
        {
            (TOPIC, 0): E.none,
            (TOPIC, 1): E.none,
            (TOPIC, 2): E.not_leader_or_follower,
            ("ghost", 0): E.unknown_topic_or_partition,
            (TOPIC, 9): E.unknown_topic_or_partition,
        },
        {
            ("__transaction_state", 0): E.invalid_topic_exception,
            ("__cluster_metadata", 0): E.invalid_topic_exception,
        },
        {(TOPIC, 0): E.invalid_request},
        {(TOPIC, 0): E.invalid_request},
        {(TOPIC, 0): E.invalid_request},
    ]
    done = await env.producers((TOPIC, 0), (TOPIC, 1))
    for key in ((TOPIC, 0), (TOPIC, 1)):
        (state,) = done[key].active_producers
        assert (state.producer_id, state.producer_epoch, state.current_txn_start_offset) == (
            77,
            3,
            -1,
        )
    # An older producer epoch or coordinator epoch is refused by the partition.
    stale = await env.markers(marker(77, 2, True, (TOPIC, 0)))
    assert stale == [{(TOPIC, 0): E.invalid_producer_epoch}]
    await env.markers(marker(77, 3, False, (TOPIC, 1), cepoch=5))
    stale = await env.markers(marker(77, 3, True, (TOPIC, 1), cepoch=4))
    assert stale == [{(TOPIC, 1): E.transaction_coordinator_fenced}]


def _hint() -> Any:
    from raftlog.net.kafka.backend import LeaderHint

    return LeaderHint(2, 1)


# ---------------------------------------------------------------- describe and list
async def test_describe_and_list_transactions(env: Env) -> None:
    pid, _ = await env.begin("tx-open", 0, 1)
    await env.begin("tx-idle")
    states = {s.transactional_id: s for s in await env.describe("tx-open", "tx-idle", "tx-none")}
    assert states["tx-open"].transaction_state == "Ongoing"
    assert states["tx-open"].producer_id == pid
    assert states["tx-open"].transaction_timeout.total_seconds() * 1000 == TIMEOUT_MS
    assert states["tx-open"].transaction_start_time is not None
    assert [(t.topic, list(t.partitions)) for t in states["tx-open"].topics] == [(TOPIC, [0, 1])]
    assert states["tx-idle"].transaction_state == "Empty"
    # -1 on the wire: none open.
    assert states["tx-idle"].transaction_start_time.timestamp() * 1000 == -1
    await env.describe("tx-idle")
    assert struct.pack(">q", -1) in env.last_payload
    assert states["tx-none"].error_code == E.transactional_id_not_found

    async def listed(version: int, **filters: Any) -> tuple[ErrorCode, dict[str, str], list[str]]:
        values = {"state_filters": [], "producer_id_filters": [], **filters}
        response = await env.call(ApiKey.LIST_TRANSACTIONS, version, **values)
        return (
            response.error_code,
            {t.transactional_id: t.transaction_state for t in response.transaction_states},
            list(response.unknown_state_filters),
        )

    for version in versions(ApiKey.LIST_TRANSACTIONS):
        assert await listed(version) == (
            E.none,
            {"tx-open": "Ongoing", "tx-idle": "Empty"},
            [],
        )
        assert await listed(version, state_filters=["Ongoing", "Bogus"]) == (
            E.none,
            {"tx-open": "Ongoing"},
            ["Bogus"],
        )
        assert await listed(version, producer_id_filters=[pid]) == (
            E.none,
            {"tx-open": "Ongoing"},
            [],
        )
    # v1 (KIP-994): only transactions running for at least the duration.
    assert (await listed(1, duration_filter=0))[1] == {"tx-open": "Ongoing"}
    assert (await listed(1, duration_filter=10 * 60_000))[1] == {}
    assert (await listed(1, duration_filter=-2))[0] == E.invalid_request


async def test_describe_producers(env: Env) -> None:
    await env.produce_txn(41, 2, 0, seq=0)
    await env.produce_txn(41, 2, 0, seq=2)
    found = await env.producers((TOPIC, 0), (TOPIC, 1), (TOPIC, 7), ("ghost", 0))
    (state,) = found[(TOPIC, 0)].active_producers
    assert (state.producer_id, state.producer_epoch, state.last_sequence) == (41, 2, 3)
    assert state.current_txn_start_offset == 0 and state.coordinator_epoch == -1
    assert found[(TOPIC, 1)].error_code == E.none and found[(TOPIC, 1)].active_producers == ()
    assert found[(TOPIC, 7)].error_code == E.unknown_topic_or_partition
    assert found[("ghost", 0)].error_code == E.unknown_topic_or_partition
    assert all(p.error_message is None for p in found.values())


# ---------------------------------------------------------------- authorization
T, G, C, X = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
Op = AclOperation
XAF, TAF, GAF, CAF = (
    E.transactional_id_authorization_failed,
    E.topic_authorization_failed,
    E.group_authorization_failed,
    E.cluster_authorization_failed,
)


async def test_transaction_apis_need_write_on_the_transactional_id(env: Env) -> None:
    pid, epoch = await env.begin("tx-auth")
    env.set_acls(acl(T, TOPIC, Op.WRITE), acl(G, "g", Op.READ))
    assert (await env.init("tx-auth")).error_code == XAF
    assert await env.add("tx-auth", pid, epoch, [(TOPIC, 0)]) == {(TOPIC, 0): XAF}
    assert await env.add_offsets("tx-auth", pid, epoch) == XAF
    assert await env.end("tx-auth", pid, epoch) == XAF
    # WRITE on the id, but not on the topic: that topic is refused, the rest not attempted.
    env.set_acls(acl(X, "tx-auth", Op.WRITE), acl(T, TOPIC, Op.WRITE))
    assert await env.add("tx-auth", pid, epoch, [(TOPIC, 0), ("other", 0)]) == {
        (TOPIC, 0): E.operation_not_attempted,
        ("other", 0): TAF,
    }
    # An unauthorized topic looks the same whether it exists or not.
    assert await env.add("tx-auth", pid, epoch, [("ghost", 0)]) == {("ghost", 0): TAF}
    assert await env.add_offsets("tx-auth", pid, epoch) == GAF
    env.set_acls(acl(X, "tx-auth", Op.WRITE), acl(T, TOPIC, Op.WRITE), acl(G, "g", Op.READ))
    assert await env.add("tx-auth", pid, epoch, [(TOPIC, 0)]) == {(TOPIC, 0): E.none}
    assert await env.add_offsets("tx-auth", pid, epoch) == E.none
    # A new producer aborts the open transaction first (the client retries), then is in.
    assert (await env.init("tx-auth")).error_code == E.concurrent_transactions
    await wait_until("aborted", lambda: env.service.state_of("tx-auth") == "CompleteAbort")
    assert (await env.init("tx-auth")).error_code == E.none


async def test_broker_apis_need_cluster_action(env: Env) -> None:
    pid, epoch = await env.begin("tx-broker")
    env.set_acls(acl(X, "tx-broker", Op.WRITE), acl(T, TOPIC, Op.WRITE))
    v4 = await env.call(
        ApiKey.ADD_PARTITIONS_TO_TXN,
        4,
        transactions=[
            {
                "transactional_id": "tx-broker",
                "producer_id": pid,
                "producer_epoch": epoch,
                "verify_only": False,
                "topics": [{"name": TOPIC, "partitions": [0]}],
            }
        ],
    )
    assert (v4.error_code, v4.results_by_transaction) == (CAF, ())
    assert await env.markers(marker(pid, epoch, True, (TOPIC, 0), (TOPIC, 1))) == [
        {(TOPIC, 0): CAF, (TOPIC, 1): CAF}
    ]
    assert not env.backend.markers_written
    env.set_acls(acl(C, "kafka-cluster", Op.CLUSTER_ACTION))
    assert await env.markers(marker(pid, epoch, True, (TOPIC, 0))) == [{(TOPIC, 0): E.none}]


async def test_describe_apis_filter_by_describe(env: Env) -> None:
    await env.begin("tx-seen", 0)
    await env.begin("tx-hidden")
    env.set_acls(acl(X, "tx-seen", Op.DESCRIBE))
    seen, hidden = await env.describe("tx-seen", "tx-hidden")
    assert seen.error_code == E.none and seen.transaction_state == "Ongoing"
    assert seen.topics == ()  # no DESCRIBE on the topic: left out of the answer
    assert hidden.error_code == XAF and hidden.transaction_state == ""
    env.set_acls(acl(X, "tx-seen", Op.DESCRIBE), acl(T, TOPIC, Op.DESCRIBE))
    (seen,) = await env.describe("tx-seen")
    assert [t.topic for t in seen.topics] == [TOPIC]
    listed = await env.call(ApiKey.LIST_TRANSACTIONS, 1, state_filters=[], producer_id_filters=[])
    assert [t.transactional_id for t in listed.transaction_states] == ["tx-seen"]
    # DescribeProducers needs READ on the topic, checked before existence.
    found = await env.producers((TOPIC, 0), ("ghost", 0))
    assert {k: p.error_code for k, p in found.items()} == {(TOPIC, 0): TAF, ("ghost", 0): TAF}
    env.set_acls(acl(T, TOPIC, Op.READ))
    found = await env.producers((TOPIC, 0))
    assert found[(TOPIC, 0)].error_code == E.none


async def test_without_txn_apis_a_transactional_id_finds_no_coordinator(tmp_path: Path) -> None:
    backend = MemoryBackend(tmp_path)
    env = Env(backend, None, default_registry())  # type: ignore[arg-type]
    answer = await env.init("tx")
    assert answer.error_code == E.coordinator_not_available
    assert (await env.init(None)).error_code == E.none
    backend.close()


# ---------------------------------------------------------------- BrokerBackend
async def test_broker_backend_markers_and_producers_over_real_replicas(tmp_path: Path) -> None:
    """The node's backend: markers go through ReplicaManager.write_txn_markers (committed
    like acks=all), producer state comes from the leader's ProducerStateTable, and a
    follower answers NOT_LEADER_OR_FOLLOWER."""
    from raftlog.broker import BrokerBackend
    from raftlog.net.kafka.backend import TxnMarkerWrite
    from tests.replication.test_manager import BROKERS, start_cluster
    from tests.replication.test_manager import TOPIC as REPLICATED

    async with trio.open_nursery() as nursery:
        cluster = await start_cluster(tmp_path, nursery)
        await wait_until("a leader", lambda: cluster.leader_id in cluster.managers)

        def backend(broker_id: int) -> BrokerBackend:
            return BrokerBackend(
                cluster.config,
                None,  # type: ignore[arg-type]  # only the replicas are asked here
                None,  # type: ignore[arg-type]
                None,  # type: ignore[arg-type]
                cluster.managers[broker_id],
            )

        leader = backend(cluster.leader_id)
        follower = backend(next(b for b in BROKERS if b != cluster.leader_id))
        written = await cluster.managers[cluster.leader_id].writes.produce(
            REPLICATED, 0, txn_batch(61, 4, 0), -1, 10_000, None
        )
        assert written.error == E.none
        found = await leader.describe_producers(REPLICATED, 0)
        (state,) = found.producers
        assert (found.error, state.producer_id, state.producer_epoch, state.last_sequence) == (
            E.none,
            61,
            4,
            1,
        )
        assert state.current_txn_start_offset == written.base_offset
        assert (await follower.describe_producers(REPLICATED, 0)).error == (
            E.not_leader_or_follower
        )
        assert (await leader.describe_producers("ghost", 0)).error == E.unknown_topic_or_partition
        (answer,) = await leader.write_txn_markers(
            [TxnMarkerWrite(61, 4, 2, False, ((REPLICATED, 0), ("ghost", 0)))]
        )
        assert answer == {(REPLICATED, 0): E.none, ("ghost", 0): E.unknown_topic_or_partition}
        (state,) = (await leader.describe_producers(REPLICATED, 0)).producers
        assert (state.current_txn_start_offset, state.coordinator_epoch) == (-1, 2)
        # A coordinator epoch older than the last marker's is fenced by the partition.
        (answer,) = await leader.write_txn_markers(
            [TxnMarkerWrite(61, 4, 1, True, ((REPLICATED, 0),))]
        )
        assert answer == {(REPLICATED, 0): E.transaction_coordinator_fenced}
        await cluster.stop_all()


async def test_limits_are_inclusive(env: Env) -> None:
    from raftlog.net.kafka.handlers_txn_partitions import (
        MAX_DESCRIBED_PARTITIONS,
        MAX_PARTITIONS_PER_REQUEST,
    )

    pid, epoch = await env.begin("tx-limit")
    at_limit = [(TOPIC, p) for p in range(MAX_PARTITIONS_PER_REQUEST)]
    codes = await env.add("tx-limit", pid, epoch, at_limit)
    assert len(codes) == MAX_PARTITIONS_PER_REQUEST
    assert codes[(TOPIC, 0)] == E.operation_not_attempted  # the rest do not exist
    assert await env.add("tx-limit", pid, epoch, [*at_limit, ("other", 0)]) == {}
    found = await env.producers(*((TOPIC, p) for p in range(MAX_DESCRIBED_PARTITIONS)))
    assert len(found) == MAX_DESCRIBED_PARTITIONS
    found = await env.producers(*((TOPIC, p) for p in range(MAX_DESCRIBED_PARTITIONS + 1)))
    assert found == {}


async def test_a_failing_service_answers_unknown_server_error(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid, epoch = await env.begin("tx-broken", 0)

    async def broken(*args: Any) -> Any:
        raise RuntimeError("bug")

    for name in ("init_producer_id", "add_partitions_to_txn", "add_offsets_to_txn", "end_txn"):
        monkeypatch.setattr(env.service, name, broken)
    assert (await env.init("tx-broken")).error_code == E.unknown_server_error
    assert await env.add("tx-broken", pid, epoch, [(TOPIC, 1)]) == {
        (TOPIC, 1): E.unknown_server_error
    }
    assert await env.add_offsets("tx-broken", pid, epoch) == E.unknown_server_error
    assert await env.end("tx-broken", pid, epoch) == E.unknown_server_error


async def test_a_fail_over_mid_transaction(env: Env) -> None:
    """The coordinator of the transaction's partition changes: the next one loads the
    in-memory log and the handlers serve the same transaction through it."""
    pid, epoch = await env.begin("tx-move", 0)
    env.service.fail_over(env.service.config.partition_for("tx-move"))
    (described,) = await env.describe("tx-move")
    assert (described.transaction_state, described.producer_id) == ("Ongoing", pid)
    assert await env.end("tx-move", pid, epoch) == E.none
    await wait_until("committed", lambda: env.service.state_of("tx-move") == "CompleteCommit")
