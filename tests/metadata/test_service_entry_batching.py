"""MetadataService batches controller results handled in one scheduler pass into one Raft
entry, in the order they were produced, and splits batches at MAX_RECORDS_PER_ENTRY."""

from __future__ import annotations

import random

import pytest
import trio

from raftlog.config import NodeConfig
from raftlog.metadata import records as r
from raftlog.metadata import service as service_module
from raftlog.metadata.raft.types import NotLeader
from raftlog.metadata.records import decode_entry
from raftlog.metadata.service import MetadataService, NotControllerError


class FakeQuorum:
    """Records proposals; every proposed offset commits at once (or never leads)."""

    def __init__(self, leading: bool = True) -> None:
        self.entries: list[list[r.Record]] = []
        self.leading = leading
        self.resigned = False

    def propose(self, payload: bytes) -> tuple[int, int]:
        if not self.leading:
            raise NotLeader(2, 5)
        self.entries.append(decode_entry(payload))
        return len(self.entries) - 1, 5

    async def wait_committed(self, offset: int, epoch: int) -> bool:
        await trio.lowlevel.checkpoint()
        return offset < len(self.entries) and epoch == 5

    def resign(self) -> bool:
        self.resigned = self.leading
        return self.leading


def config(name: str) -> r.Config:
    return r.Config("topic", name, "retention.ms", "1000")


async def produce(svc: MetadataService, produced: list[r.Record], records: tuple) -> None:
    """What handle() does: the controller's result is appended in the same step."""
    produced.extend(records)
    await svc._append(records)


def service(quorum: FakeQuorum) -> MetadataService:
    svc = MetadataService(NodeConfig(), "cluster")
    svc.quorum = quorum  # type: ignore[assignment]
    return svc


@pytest.mark.parametrize("seed", range(5))
async def test_results_of_one_pass_share_an_entry_in_order(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [rng.randint(1, 3) for _ in range(rng.randint(2, 20))]
    quorum = FakeQuorum()
    svc = service(quorum)
    produced: list[r.Record] = []
    async with trio.open_nursery() as nursery:
        for i, size in enumerate(sizes):
            records = tuple(config(f"t{i}-{k}") for k in range(size))
            nursery.start_soon(produce, svc, produced, records)
    assert len(quorum.entries) == 1, seed
    assert quorum.entries[0] == produced, seed


async def test_a_full_batch_is_proposed_before_the_next(monkeypatch) -> None:
    monkeypatch.setattr(service_module, "MAX_RECORDS_PER_ENTRY", 4)
    quorum = FakeQuorum()
    svc = service(quorum)
    produced: list[r.Record] = []
    async with trio.open_nursery() as nursery:
        for i in range(5):
            records = (config(f"a{i}"), config(f"b{i}"))
            nursery.start_soon(produce, svc, produced, records)
    assert [len(e) for e in quorum.entries] == [4, 4, 2]
    assert [rec for entry in quorum.entries for rec in entry] == produced


async def test_not_leader_fails_every_request_of_the_batch() -> None:
    svc = service(FakeQuorum(leading=False))
    failures: list[BaseException] = []

    async def append(name: str) -> None:
        try:
            await svc._append((config(name),))
        except NotControllerError as exc:
            failures.append(exc)

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(append, f"x{i}")
    assert len(failures) == 3
    assert all(f.leader_id == 2 for f in failures)  # type: ignore[attr-defined]
