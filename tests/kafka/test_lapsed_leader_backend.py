"""What a broker whose session lease lapsed tells clients: NOT_LEADER_OR_FOLLOWER to every
produce, no leader where its (stale) image names itself, itself left out of the brokers, and
produces already parked on its partitions answered at the lapse."""

from types import SimpleNamespace

from raftlog.broker import BrokerBackend
from raftlog.config import NodeConfig
from raftlog.constants import NO_LEADER
from raftlog.errors import ErrorCode
from raftlog.net.kafka.backend import ProduceResult
from tests.metadata.test_controller import cluster, create

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


def _backend():
    controller = cluster(3)
    create(controller, "t", partitions=2, rf=3)
    image = controller.image
    produced: list[tuple] = []
    failed: list[tuple] = []

    async def produce(*args):
        produced.append(args)
        return ProduceResult(base_offset=0)

    leading = SimpleNamespace(replica=SimpleNamespace(leader=object()))
    following = SimpleNamespace(replica=SimpleNamespace(leader=None))
    replicas = SimpleNamespace(
        writes=SimpleNamespace(produce=produce),
        reads=SimpleNamespace(fetch=None, list_offset=None, offset_for_leader_epoch=None),
        replicas=SimpleNamespace(
            data_event=None,
            partitions={("t", 0): leading, ("t", 1): following},
            fail_waiters=failed.append,
        ),
        unsafe_partitions=tuple,
    )
    lifecycle = _Lifecycle()
    backend = BrokerBackend(
        NodeConfig(node_id=NODE_ID),
        SimpleNamespace(image=image),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        lifecycle,  # type: ignore[arg-type]
        replicas,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
    )
    return backend, lifecycle, produced, failed


def _leaders(backend) -> dict[int, tuple[int, ErrorCode]]:
    (topic,) = backend.topics(["t"])
    return {p.partition: (p.leader_id, p.error) for p in topic.partitions}


async def test_a_lapsed_broker_refuses_produces_and_names_no_leader_of_its_own():
    backend, lifecycle, produced, failed = _backend()
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
    assert len(produced) == 1  # never reached the log
    after = _leaders(backend)
    for partition, (leader, error) in before.items():
        if leader == NODE_ID:
            assert after[partition] == (NO_LEADER, ErrorCode.leader_not_available)
        else:
            assert after[partition] == (leader, error)
    # It counts itself fenced: a client's next metadata request goes to another broker.
    assert NODE_ID not in {b.node_id for b in backend.brokers()}
    assert {b.node_id for b in backend.brokers()} == {2, 3}


async def test_a_broker_without_a_lifecycle_serves_as_before():
    """Data-path tests build a backend without a controller: no lease, nothing refused."""
    backend, _lifecycle, produced, _failed = _backend()
    backend.lifecycle = None  # type: ignore[assignment]
    assert not backend.lease_lapsed()
    assert (await backend.produce("t", 1, b"x", -1, 1000)).error == ErrorCode.none
    assert len(produced) == 1
