"""How a transaction's client outcome becomes ok / fail / info (no cluster: the producer and
consumer are stand-ins that answer as librdkafka does)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from jepsen.txn_workload import TxnClient, TxnOutcome


@dataclass
class FakeMessage:
    partition_: int
    offset_: int
    value_: bytes

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def value(self) -> bytes:
        return self.value_


@dataclass
class FakeProducer:
    """Each transactional call pops its next answer: None succeeds, an error raises."""

    commit_answers: list[KafkaError | None] = field(default_factory=lambda: [None])
    abort_answers: list[KafkaError | None] = field(default_factory=lambda: [None])
    delivery_error: KafkaError | None = None
    calls: list[str] = field(default_factory=list)
    _pending: list[Any] = field(default_factory=list)
    _next_offset: int = 10

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(
        self, topic: str, value: bytes, key: bytes, partition: int, on_delivery: Any
    ) -> None:
        self._pending.append((partition, value, on_delivery))

    def flush(self, timeout: float) -> int:
        for partition, value, on_delivery in self._pending:
            self._next_offset += 1
            on_delivery(self.delivery_error, FakeMessage(partition, self._next_offset, value))
        self._pending.clear()
        return 0

    def send_offsets_to_transaction(self, positions: Any, metadata: Any, timeout: float) -> None:
        self.calls.append(f"send_offsets {[(tp.partition, tp.offset) for tp in positions]}")

    def _answer(self, answers: list[KafkaError | None], name: str) -> None:
        self.calls.append(name)
        err = answers.pop(0)
        if err is not None:
            raise KafkaException(err)

    def commit_transaction(self, timeout: float) -> None:
        self._answer(self.commit_answers, "commit")

    def abort_transaction(self, timeout: float) -> None:
        self._answer(self.abort_answers, "abort")


class FakeConsumer:
    def __init__(self, records: list[tuple[int, int, int]]) -> None:
        self.records = [FakeMessage(p, o, str(v).encode()) for p, o, v in records]

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        out, self.records = self.records, []
        return out

    def assignment(self) -> list[Any]:
        from confluent_kafka import TopicPartition

        return [TopicPartition("jepsen", 0), TopicPartition("jepsen", 1)]

    def position(self, tps: list[Any]) -> list[Any]:
        from confluent_kafka import TopicPartition

        return [TopicPartition("jepsen", 0, 8), TopicPartition("jepsen", 1, -1001)]

    def consumer_group_metadata(self) -> str:
        return "group-metadata"


def client(producer: FakeProducer, records: Sequence[tuple[int, int, int]] = ()) -> TxnClient:
    c = TxnClient.__new__(TxnClient)
    c.topic, c.keys, c.mops, c.abandoned = "jepsen", 6, [], False
    c.producer = producer  # type: ignore[assignment]
    c.consumer = FakeConsumer(list(records))  # type: ignore[assignment]
    return c


ABORTABLE = KafkaError(KafkaError._STATE, "abortable", txn_requires_abort=True)
RETRIABLE = KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True)
FATAL = KafkaError(KafkaError._FENCED, "fenced", fatal=True)


def run(producer: FakeProducer, commit: bool = True, read: bool = False) -> TxnOutcome:
    return client(producer, [(0, 7, 99)]).run([(0, 1), (3, 2)], read, commit)


def test_a_commit_is_ok_with_offsets_and_reads_recorded() -> None:
    p = FakeProducer()
    out = run(p, read=True)
    assert out.type == "ok" and not out.rebuild
    assert out.mops == [["poll", {"0": [[7, 99]]}], ["send", 0, 1, 11], ["send", 3, 2, 12]]
    # Only positions the consumer knows go to the transaction.
    assert p.calls == ["begin", "send_offsets [(0, 8)]", "commit"]


def test_an_abort_on_purpose_fails_and_keeps_the_clients_unless_it_read() -> None:
    out = run(FakeProducer(), commit=False)
    assert (out.type, out.error, out.rebuild) == ("fail", "aborted on purpose", False)
    assert run(FakeProducer(), commit=False, read=True).rebuild


def test_a_transaction_that_never_asked_to_commit_fails_even_if_the_abort_fails() -> None:
    p = FakeProducer(abort_answers=[FATAL], delivery_error=KafkaError(KafkaError._MSG_TIMED_OUT))
    out = run(p)
    assert out.type == "fail" and out.rebuild and "commit" not in p.calls


@pytest.mark.parametrize(
    ("commits", "aborts", "expected"),
    [
        ([ABORTABLE], [None], "fail"),  # the coordinator aborted it
        ([ABORTABLE], [RETRIABLE], "info"),  # asked to commit, abort unconfirmed
        ([RETRIABLE, None], [], "ok"),  # a retried commit went through
        ([RETRIABLE, RETRIABLE], [], "info"),  # retries spent
        ([FATAL], [], "info"),
    ],
)
def test_commit_errors(commits: list[Any], aborts: list[Any], expected: str) -> None:
    out = run(FakeProducer(commit_answers=commits, abort_answers=aborts))
    assert out.type == expected, out
    # After a confirmed abort the producer goes on (its consumer did not read here).
    assert out.rebuild == (expected == "info")


def test_an_abandoned_transaction_aborts_instead_of_committing() -> None:
    p = FakeProducer()
    c = client(p)
    c.abandoned = True
    out = c.run([(0, 1)], False, True)
    assert out.type == "fail" and "commit" not in p.calls and "abort" in p.calls
