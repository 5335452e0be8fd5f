"""MetadataService while the node stops."""

import trio
from trio.testing import wait_all_tasks_blocked

from raftlog.config import NodeConfig
from raftlog.metadata.raft.messages import Entry
from raftlog.metadata.service import MetadataService


class _Store:
    def __init__(self) -> None:
        self.saved: list[object] = []

    def save_snapshot(self, snapshot: object) -> None:
        self.saved.append(snapshot)

    def compact_to(self, end_offset: int) -> None:
        pass


class _Quorum:
    def __init__(self) -> None:
        self.store = _Store()
        self.told: list[int] = []

    def snapshot_written(self, end_offset: int, epoch: int, data: bytes) -> None:
        self.told.append(end_offset)


async def test_snapshot_started_after_run_stopped_is_skipped_not_raised():
    svc = MetadataService(NodeConfig(), "cluster")
    quorum = _Quorum()
    svc.quorum = quorum  # type: ignore[assignment]
    async with trio.open_nursery() as nursery:
        await nursery.start(svc.run)
        svc._take_snapshot(Entry(0, 1, b""))  # while running: persisted in the background
        await wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert len(quorum.store.saved) == 1
    # The quorum task can apply one more Ready after the service's nursery closed (a worker
    # thread it awaited returns first); a snapshot then must not raise into that task.
    svc._take_snapshot(Entry(1, 1, b""))
    assert quorum.told == [1, 2]
    assert len(quorum.store.saved) == 1
