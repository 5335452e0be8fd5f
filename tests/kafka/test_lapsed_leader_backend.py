"""What a broker whose session lease lapsed tells clients: NOT_LEADER_OR_FOLLOWER to every
produce, no leader where its (stale) image names itself, itself left out of the brokers, and
produces already parked on its partitions answered at the lapse; unless its followers still
fetch from it (then the controller, not this broker, is what is cut off) or no other replica
is in sync (nobody could replace it)."""

from types import SimpleNamespace

import pytest

from raftlog.broker import FENCED_BROKER_LISTED_MS, BrokerBackend
from raftlog.config import NodeConfig
from raftlog.constants import NO_LEADER
from raftlog.errors import ErrorCode
from raftlog.net.kafka.backend import FetchResult, ProduceResult
from tests.metadata.test_controller import (
    SESSION_MS,
    cluster,
    create,
    heartbeat,
    register_request,
)

NODE_ID = 1


class _Lifecycle:
    def __init__(self) -> None:
        self.lapsed = False
        self.lease_listeners: list = []

    def lease_lapsed(self) -> bool:
        return self.lapsed

    def lapse(self) -> None:
        self.lapsed = True
        for listener in self.lease_listeners:
            listener(True)


NOW_MS = 100_000
# A follower fetch this long ago still counts (replica_fetch_wait_max_ms + heartbeat interval).
RECENT_MS = 100
LONG_AGO_MS = 5_000


def _leader(isr: set[int], last_fetch_ago_ms: int | None) -> SimpleNamespace:
    followers = {
        r: SimpleNamespace(
            last_fetch_time_ms=-1 if last_fetch_ago_ms is None else NOW_MS - last_fetch_ago_ms
        )
        for r in (2, 3)
    }
    return SimpleNamespace(isr=frozenset(isr), followers=followers)


def _backend(isr: frozenset[int] = frozenset({1, 2, 3}), last_fetch_ago_ms: int | None = None):
    controller = cluster(3)
    create(controller, "t", partitions=2, rf=3)
    image = controller.image
    produced: list[tuple] = []
    failed: list[tuple] = []

    async def produce(*args):
        produced.append(args)
        return ProduceResult(base_offset=0)

    async def fetch(*args):
        produced.append(("fetch", *args))
        return FetchResult(high_watermark=7)

    leading = SimpleNamespace(replica=SimpleNamespace(leader=_leader(set(isr), last_fetch_ago_ms)))
    following = SimpleNamespace(replica=SimpleNamespace(leader=None))
    replicas = SimpleNamespace(
        writes=SimpleNamespace(produce=produce),
        reads=SimpleNamespace(fetch=fetch, list_offset=None, offset_for_leader_epoch=None),
        replicas=SimpleNamespace(
            data_event=None,
            partitions={("t", 0): leading, ("t", 1): following},
            fail_waiters=failed.append,
            clock_ms=lambda: NOW_MS,
        ),
        unsafe_partitions=tuple,
        delete_records=None,
    )
    lifecycle = _Lifecycle()
    backend = BrokerBackend(
        NodeConfig(node_id=NODE_ID),
        SimpleNamespace(image=image, add_listener=lambda listener: None),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        lifecycle,  # type: ignore[arg-type]
        replicas,  # type: ignore[arg-type]
    )
    return backend, lifecycle, produced, failed


def _leaders(backend) -> dict[int, tuple[int, ErrorCode]]:
    (topic,) = backend.topics(["t"])
    return {p.partition: (p.leader_id, p.error) for p in topic.partitions}


@pytest.mark.parametrize("last_fetch_ago_ms", [None, LONG_AGO_MS])
async def test_a_lapsed_broker_refuses_produces_and_names_no_leader_of_its_own(last_fetch_ago_ms):
    backend, lifecycle, produced, failed = _backend(last_fetch_ago_ms=last_fetch_ago_ms)
    before = _leaders(backend)
    assert NODE_ID in {leader for leader, _ in before.values()}, before
    assert NODE_ID in {b.node_id for b in backend.brokers()}
    assert (await backend.produce("t", 0, b"x", -1, 1000)).error == ErrorCode.none
    assert len(produced) == 1

    lifecycle.lapse()
    # Parked produces on the partitions it leads are answered at once, not at timeout.
    assert failed == [("t", 0)]
    result = await backend.produce("t", 0, b"x", -1, 1000)
    assert result.error == ErrorCode.not_leader_or_follower
    assert result.error_message == "this broker lost contact with the controller"
    # DeleteRecords too (the replica manager's delete_records is never reached).
    deleted = await backend.delete_records("t", 0, 1)
    assert (deleted.error, deleted.error_message) == (ErrorCode.not_leader_or_follower, None)
    # Consumers too are sent to look for the new leader (its high watermark is stuck here).
    fetched = await backend.fetch("t", 0, 0, 1024, -1)
    assert fetched.error == ErrorCode.not_leader_or_follower
    assert len(produced) == 1  # neither reached the log
    after = _leaders(backend)
    for partition, (leader, error) in before.items():
        if leader == NODE_ID:
            assert after[partition] == (NO_LEADER, ErrorCode.leader_not_available)
        else:
            assert after[partition] == (leader, error)
    # It counts itself fenced: a client's next metadata request goes to another broker.
    assert NODE_ID not in {b.node_id for b in backend.brokers()}
    assert {b.node_id for b in backend.brokers()} == {2, 3}


@pytest.mark.parametrize(
    ("isr", "last_fetch_ago_ms"),
    [(frozenset({1, 2, 3}), RECENT_MS), (frozenset({1}), None)],
    ids=["followers-still-fetch", "no-other-replica-in-sync"],
)
async def test_a_lapsed_broker_keeps_a_partition_nobody_could_have_taken(isr, last_fetch_ago_ms):
    """Followers still fetching have not been told of another leader (a silent controller,
    not a cut-off leader); an ISR of this broker alone has no one to elect."""
    backend, lifecycle, produced, failed = _backend(isr, last_fetch_ago_ms)
    before = _leaders(backend)
    lifecycle.lapse()
    assert failed == []
    assert (await backend.produce("t", 0, b"x", -1, 1000)).error == ErrorCode.none
    assert (await backend.fetch("t", 0, 0, 1024, -1)).high_watermark == 7
    assert len(produced) == 2
    assert _leaders(backend) == before
    assert NODE_ID in {b.node_id for b in backend.brokers()}


async def test_a_broker_without_a_lifecycle_serves_as_before():
    """Data-path tests build a backend without a controller: no lease, nothing refused."""
    backend, _lifecycle, produced, _failed = _backend()
    backend.lifecycle = None  # type: ignore[assignment]
    assert not backend.lease_lapsed()
    assert (await backend.produce("t", 1, b"x", -1, 1000)).error == ErrorCode.none
    assert len(produced) == 1


def test_a_broker_fenced_moments_ago_stays_listed_for_a_while():
    """librdkafka drops a broker missing from Metadata in the same step as it moves the
    partition off it, and that race costs it another metadata scan: a broker this node saw
    fenced stays listed for FENCED_BROKER_LISTED_MS. One never seen unfenced is not."""
    backend, _lifecycle, _produced, _failed = _backend()
    now_s = [100.0]
    backend.clock_s = lambda: now_s[0]
    controller = cluster(3)
    backend._note_fences(controller.image, None)
    # Brokers 1 and 3 heartbeat on; broker 2 goes silent and is fenced at session expiry.
    heartbeat(controller, 1, now_ms=SESSION_MS - 1)
    heartbeat(controller, 3, now_ms=SESSION_MS - 1)
    controller.tick(SESSION_MS + 1)
    assert controller.image.brokers[2].fenced
    backend.metadata.image = controller.image
    backend._note_fences(controller.image, None)
    assert {b.node_id for b in backend.brokers()} == {1, 2, 3}
    now_s[0] += FENCED_BROKER_LISTED_MS / 1000
    assert {b.node_id for b in backend.brokers()} == {1, 3}

    fresh, _lifecycle, _produced, _failed = _backend()
    fresh.metadata.image = controller.image
    fresh._note_fences(controller.image, None)
    assert {b.node_id for b in fresh.brokers()} == {1, 3}


def test_a_restarted_broker_is_not_listed_until_it_is_unfenced_again():
    """The lingering listing is for the process that was serving: a new incarnation (a
    restart) registers fenced and stays out of Metadata until it is unfenced, as KRaft does,
    so "every broker listed" still means every broker can take replicas."""
    backend, _lifecycle, _produced, _failed = _backend()
    now_s = [100.0]
    backend.clock_s = lambda: now_s[0]
    controller = cluster(3)
    backend.metadata.image = controller.image
    backend._note_fences(controller.image, None)
    # The old process is gone (its session ran out); the new one registers.
    reply = controller.handle(register_request(2, generation=1), SESSION_MS + 1).reply
    assert reply.error_code == ErrorCode.none
    assert controller.image.brokers[2].fenced
    backend.metadata.image = controller.image
    backend._note_fences(controller.image, None)
    assert {b.node_id for b in backend.brokers()} == {1, 3}
    heartbeat(controller, 2, now_ms=SESSION_MS + 2)
    assert not controller.image.brokers[2].fenced
    backend.metadata.image = controller.image
    backend._note_fences(controller.image, None)
    assert {b.node_id for b in backend.brokers()} == {1, 2, 3}
