from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlog.errors import ErrorCode
from raftlog.records import Record, build_batch, iter_batches
from raftlog.replication.producer_state import (
    MAX_SEQUENCE,
    BatchMetadata,
    ProduceCheck,
    ProducerStateConfig,
    ProducerStateTable,
    Verdict,
    after_log_truncation,
    list_snapshots,
    load_latest,
    rebuild,
    snapshot_path,
    snapshot_payload,
    write_payload,
    write_snapshot,
)
from raftlog.storage import LogConfig, PartitionLog

SMALL = LogConfig(segment_bytes=3000, index_interval_bytes=300)
OOO = ErrorCode.out_of_order_sequence_number


def request(pid: int, epoch: int, seq: int, count: int = 1, *, ts_ms: int = 1000) -> bytes:
    records = [Record(value=f"{pid}-{epoch}-{seq}-{i}".encode()) for i in range(count)]
    return build_batch(
        records, producer_id=pid, producer_epoch=epoch, base_sequence=seq, now_ms=ts_ms
    )


def plain(count: int = 1) -> bytes:
    return build_batch([Record(value=b"x")] * count, now_ms=1000)


def produce(plog: PartitionLog, table: ProducerStateTable, data: bytes) -> ProduceCheck:
    """The leader's produce path: check, append, record (no await in between)."""
    check = table.check_batches(data)
    if check.verdict is Verdict.OK:
        info = plog.append_as_leader(data, leader_epoch=1, now_ms=0)
        table.update_leader_append(data, info.first_offset)
    return check


def in_memory_append(table: ProducerStateTable, data: bytes) -> int:
    first = table.next_offset
    table.update_leader_append(data, first)
    return first


# (pid, epoch, seq, count) appended first, then the request, then the expected answer:
# Verdict.OK, an ErrorCode, or ("dup", first_offset, last_offset).
P = 7
SEQUENCE_CASES = {
    "first batch at seq 0": ([], [(P, 0, 0, 1)], Verdict.OK),
    "unknown producer any seq (KIP-360)": ([], [(P, 0, 42, 1)], Verdict.OK),
    "next seq continues": ([(P, 0, 0, 3)], [(P, 0, 3, 2)], Verdict.OK),
    "gap": ([(P, 0, 0, 3)], [(P, 0, 4, 1)], OOO),
    "seq behind, not cached": ([(P, 0, 0, 3)], [(P, 0, 1, 1)], OOO),
    "duplicate of the last batch": ([(P, 0, 0, 3), (P, 0, 3, 2)], [(P, 0, 3, 2)], ("dup", 3, 4)),
    "duplicate of the 5th last": (
        [(P, 0, s, 1) for s in range(6)],
        [(P, 0, 1, 1)],
        ("dup", 1, 1),
    ),
    "6th last is no longer cached": ([(P, 0, s, 1) for s in range(6)], [(P, 0, 0, 1)], OOO),
    "same first seq, other length": ([(P, 0, 0, 3)], [(P, 0, 0, 2)], OOO),
    "old epoch": ([(P, 2, 0, 1)], [(P, 1, 1, 1)], ErrorCode.invalid_producer_epoch),
    "retry under an old epoch": (
        [(P, 1, 0, 1), (P, 2, 0, 1)],
        [(P, 1, 0, 1)],
        ErrorCode.invalid_producer_epoch,
    ),
    "new epoch at seq 0": ([(P, 1, 0, 5)], [(P, 2, 0, 1)], Verdict.OK),
    "new epoch not at seq 0": ([(P, 1, 0, 5)], [(P, 2, 5, 1)], OOO),
    "new epoch forgets old batches": ([(P, 1, 0, 1), (P, 2, 0, 1)], [(P, 2, 1, 1)], Verdict.OK),
    "wrap at Int.MaxValue": ([(P, 0, MAX_SEQUENCE, 1)], [(P, 0, 0, 1)], Verdict.OK),
    "batch crossing the wrap": ([(P, 0, MAX_SEQUENCE - 1, 3)], [(P, 0, 1, 1)], Verdict.OK),
    "no wrap before Int.MaxValue": ([(P, 0, MAX_SEQUENCE - 2, 1)], [(P, 0, 0, 1)], OOO),
    "duplicate across the wrap": (
        [(P, 0, MAX_SEQUENCE - 1, 3)],
        [(P, 0, MAX_SEQUENCE - 1, 3)],
        ("dup", 0, 2),
    ),
    "other producers do not interfere": ([(P, 0, 0, 1), (8, 0, 0, 1)], [(P, 0, 1, 1)], Verdict.OK),
    "two batches in sequence": ([(P, 0, 0, 1)], [(P, 0, 1, 2), (P, 0, 3, 1)], Verdict.OK),
    "two batches with a gap": ([(P, 0, 0, 1)], [(P, 0, 1, 2), (P, 0, 4, 1)], OOO),
    "duplicate inside a bigger request": ([(P, 0, 0, 1)], [(P, 0, 0, 1), (P, 0, 1, 1)], OOO),
    "producer id without sequence": ([], [(P, 0, -1, 1)], ErrorCode.invalid_record),
    "producer id without epoch": ([], [(P, -1, 0, 1)], ErrorCode.invalid_record),
}


@pytest.mark.parametrize("name", list(SEQUENCE_CASES))
def test_sequence_rules(name: str) -> None:
    before, req, expected = SEQUENCE_CASES[name]
    table = ProducerStateTable()
    for pid, epoch, seq, count in before:
        in_memory_append(table, request(pid, epoch, seq, count))
    data = b"".join(request(*spec) for spec in req)
    check = table.check_batches(data)
    if expected is Verdict.OK:
        assert check.verdict is Verdict.OK, check
    elif isinstance(expected, tuple):
        assert check.verdict is Verdict.DUPLICATE, check
        assert check.duplicate_of is not None
        assert (check.duplicate_of.first_offset, check.duplicate_of.last_offset) == expected[1:]
    else:
        assert (check.verdict, check.error) == (Verdict.ERROR, expected), check
        assert check.message


def test_batches_without_producer_id_pass_and_only_advance_the_offset() -> None:
    table = ProducerStateTable()
    assert table.check_batches(plain(3) + plain(2)).verdict is Verdict.OK
    in_memory_append(table, plain(3) + plain(2))
    assert len(table) == 0 and table.next_offset == 5


def test_strict_unknown_producer_answers_unknown_producer_id() -> None:
    table = ProducerStateTable(ProducerStateConfig(strict_unknown_producer=True))
    check = table.check_batches(request(P, 0, 5))
    assert check.error == ErrorCode.unknown_producer_id
    assert table.check_batches(request(P, 0, 0)).verdict is Verdict.OK


def test_garbage_is_an_error_not_an_exception() -> None:
    check = ProducerStateTable().check_batches(b"\x00" * 30)
    assert (check.verdict, check.error) == (Verdict.ERROR, ErrorCode.corrupt_message)


def test_entry_keeps_five_batches_and_original_offsets() -> None:
    table = ProducerStateTable()
    in_memory_append(table, plain(10))
    for seq in range(0, 14, 2):
        in_memory_append(table, request(P, 3, seq, 2, ts_ms=2000 + seq))
    entry = table.get(P)
    assert entry is not None and entry.epoch == 3 and entry.last_seq == 13
    assert [b.first_seq for b in entry.batches] == [4, 6, 8, 10, 12]
    assert entry.batches[0] == BatchMetadata(4, 5, 14, 15, 2004)
    assert entry.last_timestamp_ms == 2012


def test_follower_updates_track_without_validating() -> None:
    leader, follower = ProducerStateTable(), ProducerStateTable()
    stored = []
    for spec in [(P, 1, 0, 2), (P, 1, 2, 1), (9, 0, 0, 1)]:
        data = request(*spec)
        first = in_memory_append(leader, data)
        stored.append(build_batch_at(data, first))
    follower.update_follower_append(b"".join(stored))
    assert follower.as_tuple() == leader.as_tuple()
    # a follower stores what its leader wrote, even an epoch it would refuse itself
    follower.update_follower_append(build_batch_at(request(P, 0, 9), follower.next_offset))
    entry = follower.get(P)
    assert entry is not None and entry.epoch == 1


def build_batch_at(data: bytes, base_offset: int) -> bytes:
    (_, header), *_ = list(iter_batches(data))
    records = [Record(value=b"v")] * header.record_count
    return build_batch(
        records,
        base_offset,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        now_ms=header.base_timestamp_ms,
    )


def test_control_batch_bumps_the_epoch_without_a_sequence() -> None:
    table = ProducerStateTable()
    in_memory_append(table, request(P, 0, 0))
    in_memory_append(table, plain())
    marker = build_batch(
        [Record(value=b"m")], producer_id=P, producer_epoch=1, is_control=True, now_ms=1000
    )
    assert table.check_batches(marker).verdict is Verdict.OK
    in_memory_append(table, marker)
    entry = table.get(P)
    assert entry is not None and (entry.epoch, entry.last_seq, entry.last_batch_offset) == (
        1,
        -1,
        2,
    )
    assert table.check_batches(request(P, 1, 0)).verdict is Verdict.OK
    assert table.check_batches(request(P, 1, 3)).error == OOO
    assert table.check_batches(request(P, 0, 1)).error == ErrorCode.invalid_producer_epoch
    # the marker at offset 2 changed P: only a rebuild can undo it
    assert table.truncate_to(2) is False and table.truncate_to(3) is True


def test_update_refuses_offsets_it_already_covers() -> None:
    table = ProducerStateTable()
    in_memory_append(table, request(P, 0, 0, 3))
    with pytest.raises(ValueError, match="below"):
        table.update_leader_append(request(P, 0, 3), 1)


def test_bounded_producer_ids_evict_least_recently_written() -> None:
    table = ProducerStateTable(ProducerStateConfig(max_producer_ids=3))
    for pid in (1, 2, 3):
        in_memory_append(table, request(pid, 0, 0))
    in_memory_append(table, request(1, 0, 1))  # 1 is now the most recent writer
    in_memory_append(table, request(4, 0, 0))
    assert sorted(e.producer_id for e in table.entries()) == [1, 3, 4]


def test_expiry_on_snapshot_write(tmp_path: Path) -> None:
    table = ProducerStateTable(ProducerStateConfig(producer_id_expiration_ms=1000))
    in_memory_append(table, request(1, 0, 0, ts_ms=5000))
    in_memory_append(table, request(2, 0, 0, ts_ms=5800))
    path = write_snapshot(table, tmp_path, now_ms=6000)
    assert path == snapshot_path(tmp_path, 2)
    assert [e.producer_id for e in table.entries()] == [2]
    loaded = load_latest(tmp_path, 10, table.config)
    assert loaded is not None and loaded.as_tuple() == table.as_tuple()


def test_snapshots_are_pruned_and_chosen_below_max_offset(tmp_path: Path) -> None:
    table = ProducerStateTable(ProducerStateConfig(max_snapshots=2))
    for seq in range(4):
        in_memory_append(table, request(P, 0, seq))
        write_snapshot(table, tmp_path, now_ms=1000)
    assert [o for o, _ in list_snapshots(tmp_path)] == [3, 4]
    older = load_latest(tmp_path, 3)
    assert older is not None and older.next_offset == 3 and older.get(P).last_seq == 2
    assert load_latest(tmp_path, 2) is None
    with pytest.raises(ValueError, match="already holds"):
        write_snapshot(table, tmp_path, now_ms=1000, up_to_offset=2)


# ---------------------------------------------------------------------- with a real log


def fill(plog: PartitionLog, table: ProducerStateTable, rounds: int, seed: int) -> None:
    """Three producers (one with an epoch bump), plain batches, retries in between; each
    producer continues where the table says it stopped."""
    seqs = {pid: 0 for pid in (1, 2, 3)}
    epochs = {pid: 0 for pid in (1, 2, 3)}
    for entry in table.entries():
        epochs[entry.producer_id] = entry.epoch
        seqs[entry.producer_id] = entry.last_seq + 1
    for i in range(rounds):
        pid = 1 + (i * 7 + seed) % 3
        if pid == 3 and i == rounds // 2:
            epochs[3], seqs[3] = epochs[3] + 1, 0
        count = 1 + (i + seed) % 3
        data = request(pid, epochs[pid], seqs[pid], count, ts_ms=1000 + i)
        assert produce(plog, table, data).verdict is Verdict.OK, (seed, i)
        assert produce(plog, table, data).verdict is Verdict.DUPLICATE, (seed, i)
        seqs[pid] += count
        if i % 4 == 0:
            produce(plog, table, plain(2))


def test_rebuild_after_crash_equals_live_table(tmp_path: Path) -> None:
    seed = 11
    plog = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    live = ProducerStateTable()
    fill(plog, live, 60, seed)
    assert len(plog.segments) > 2
    plog.flush_now()  # "crash": no close, no snapshot; the log itself is durable
    reopened = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    rebuilt = rebuild(reopened, reopened.directory)
    assert rebuilt.as_tuple() == live.as_tuple(), seed
    assert rebuilt.next_offset == reopened.log_end_offset


def test_snapshot_plus_replay_equals_full_replay(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    live = ProducerStateTable()
    fill(plog, live, 30, seed=3)
    write_snapshot(live, plog.directory, now_ms=2000)
    fill(plog, live, 30, seed=5)  # producers continue past the snapshot
    from_snapshot = rebuild(plog, plog.directory)
    full = rebuild(plog, tmp_path / "no-snapshots")
    assert from_snapshot.as_tuple() == full.as_tuple() == live.as_tuple()


def test_truncation_matches_replay_of_the_kept_prefix(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    live = ProducerStateTable()
    fill(plog, live, 20, seed=2)
    write_snapshot(live, plog.directory, now_ms=2000)
    cut = plog.log_end_offset
    fill(plog, live, 20, seed=4)
    write_snapshot(live, plog.directory, now_ms=2000)
    plog.truncate_to(cut + 5)
    table = after_log_truncation(live, plog, plog.directory)
    assert [o for o, _ in list_snapshots(plog.directory)] == [cut]
    assert table.as_tuple() == rebuild(plog, tmp_path / "none").as_tuple()
    assert table.next_offset == plog.log_end_offset
    # the kept batches' retries are duplicates again; the dropped ones may be re-sent
    entry = table.get(1)
    assert entry is not None and entry.last_offset < plog.log_end_offset


async def test_snapshot_and_rebuild_off_the_event_loop(tmp_path: Path) -> None:
    """The driver's way: capture the payload on the loop, fsync in a worker thread."""
    plog = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    live = ProducerStateTable()
    fill(plog, live, 12, seed=8)
    plog.flush_now()
    offset, payload = snapshot_payload(live, now_ms=2000, up_to_offset=plog.flushed_offset)
    produce(plog, live, request(1, 0, live.get(1).last_seq + 1))  # the loop goes on meanwhile
    path = await trio.to_thread.run_sync(
        write_payload, plog.directory, offset, payload, live.config.max_snapshots
    )
    assert path == snapshot_path(plog.directory, offset)
    rebuilt = await trio.to_thread.run_sync(rebuild, plog, plog.directory)
    assert rebuilt.as_tuple() == live.as_tuple()


def test_truncation_without_producer_data_is_in_memory(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    live = ProducerStateTable()
    produce(plog, live, request(P, 0, 0, 2))
    produce(plog, live, plain(3))
    before = live.as_tuple()
    plog.truncate_to(2)
    assert after_log_truncation(live, plog, plog.directory) is live
    assert live.next_offset == 2 and live.as_tuple()[1] == before[1]
    assert live.truncate_to(1) is False  # P wrote at offset 1: only a rebuild is exact


def test_corrupt_snapshot_is_logged_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    live = ProducerStateTable()
    fill(plog, live, 10, seed=1)
    write_snapshot(live, plog.directory, now_ms=2000)
    fill(plog, live, 10, seed=6)
    newest = write_snapshot(live, plog.directory, now_ms=2000)
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x40
    newest.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="raftlog.replication.producer_state"):
        rebuilt = rebuild(plog, plog.directory)
    assert rebuilt.as_tuple() == live.as_tuple()
    assert "corrupt producer snapshot" in caplog.text and newest.name in caplog.text
    assert not newest.exists()
    # every snapshot corrupt: a full replay
    for _, path in list_snapshots(plog.directory):
        path.write_bytes(b"garbage")
    assert rebuild(plog, plog.directory).as_tuple() == live.as_tuple()
    assert list_snapshots(plog.directory) == []


def test_snapshot_above_the_log_end_is_dropped(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    table = ProducerStateTable()
    produce(plog, table, request(P, 0, 0, 2))
    table.update_leader_append(request(P, 0, 2), 2)  # state of a batch the log lost
    write_snapshot(table, plog.directory, now_ms=1000)
    rebuilt = rebuild(plog, plog.directory)
    assert rebuilt.get(P).last_seq == 1 and list_snapshots(plog.directory) == []


def test_rebuild_after_log_start_moves_past_the_snapshot(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    live = ProducerStateTable()
    fill(plog, live, 8, seed=0)
    snapshot_offset = live.next_offset
    fill(plog, live, 40, seed=9)
    assert plog.segments[1].base_offset > snapshot_offset
    plog.advance_log_start(plog.segments[1].base_offset)
    rebuilt = rebuild(plog, plog.directory)
    assert rebuilt.as_tuple() == live.as_tuple()


# ---------------------------------------------------------------------- property


@dataclass
class Client:
    """An idempotent producer: batches retried until answered, none sent more than 5
    batches after the oldest unanswered one (max.in.flight = 5: the broker keeps the last 5
    batches of a producer to recognise retries)."""

    pid: int
    epoch: int = 0
    next_seq: int = 0
    sent_batches: int = 0
    in_flight: list[tuple[int, bytes]] = field(default_factory=list)  # (batch number, request)

    def may_send(self) -> bool:
        return not self.in_flight or self.sent_batches - self.in_flight[0][0] < 5


OPS = st.lists(
    st.tuples(
        st.sampled_from(["send", "send", "retry", "retry", "bump", "crash", "snapshot"]),
        st.integers(0, 1),  # which client
        st.integers(0, 4),  # which in-flight batch / record count
        st.booleans(),  # the request (send) or the response (retry) is lost
    ),
    max_size=40,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, strict=st.booleans())
def test_retries_never_duplicate_records_in_the_log(ops: list, strict: bool) -> None:
    config = ProducerStateConfig(strict_unknown_producer=strict)
    with tempfile.TemporaryDirectory() as tmp:
        plog = PartitionLog.open(Path(tmp) / "t-0", SMALL, now_ms=0)
        table = ProducerStateTable(config)
        clients = [Client(pid=100), Client(pid=200)]
        acked: dict[bytes, int] = {}  # request -> base offset the broker answered
        for op, which, arg, lost in ops:
            client = clients[which]
            if op == "send" and client.may_send():
                data = request(client.pid, client.epoch, client.next_seq, 1 + arg % 3)
                client.next_seq += 1 + arg % 3
                client.in_flight.append((client.sent_batches, data))
                client.sent_batches += 1
                if not lost:
                    produce(plog, table, data)  # its answer is treated as lost: retried
            elif op == "retry" and client.in_flight:
                _, data = client.in_flight[arg % len(client.in_flight)]
                check = produce(plog, table, data)
                if check.verdict is not Verdict.ERROR and not lost:
                    base = (
                        check.duplicate_of.first_offset
                        if check.duplicate_of
                        else plog.log_end_offset - len(list(_records(data)))
                    )
                    acked[data] = base
                    client.in_flight = [f for f in client.in_flight if f[1] != data]
            elif op == "bump" and not client.in_flight:
                client.epoch, client.next_seq = client.epoch + 1, 0
            elif op == "crash":
                plog.close()  # what it wrote is durable (flush.policy=always)
                plog = PartitionLog.open(plog.directory, SMALL, now_ms=0)
                table = rebuild(plog, plog.directory, config)
            elif op == "snapshot":
                write_snapshot(table, plog.directory, now_ms=1000)
        # Drain: every client retries what it still has in flight, oldest first; each must be
        # appended or recognised as a duplicate, or the producer would be stuck.
        for client in clients:
            for _, data in sorted(client.in_flight):
                check = produce(plog, table, data)
                if check.verdict is Verdict.ERROR:
                    # Only possible without strict: the first request of a new producer id
                    # was lost and a later one was taken as its first (KIP-360 semantics).
                    assert not strict and check.error == OOO, (check, ops)
                    firsts = [
                        h.base_sequence
                        for _, h in iter_batches(plog.read(0, 10**9).read_bytes())
                        if h.producer_id == client.pid and h.producer_epoch == client.epoch
                    ]
                    assert firsts and firsts[0] != 0, (check, ops)
                    break
        stored = plog.read(0, 10**9).read_bytes()
        seen: dict[tuple[int, int, int], int] = {}
        last: dict[tuple[int, int], int] = {}
        for _, header in iter_batches(stored):
            key = (header.producer_id, header.producer_epoch, header.base_sequence)
            assert key not in seen, f"duplicate batch {key} in the log; ops={ops}"
            seen[key] = header.base_offset
            run = (header.producer_id, header.producer_epoch)
            # Sequences of one producer epoch are stored in order, without gaps. Only a
            # producer id the broker knows nothing about may start anywhere (KIP-360), unless
            # strict: a lost first request lets its successor in first.
            if run in last or strict or any(r[0] == run[0] for r in last):
                assert header.base_sequence == last.get(run, -1) + 1, (strict, ops)
            last[run] = header.base_sequence + header.last_offset_delta
        for data, base in acked.items():
            (_, header), *_ = list(iter_batches(data))
            key = (header.producer_id, header.producer_epoch, header.base_sequence)
            assert seen.get(key) == base, f"acked batch {key} not at {base}; ops={ops}"
        plog.close()


def _records(data: bytes) -> list[int]:
    (_, header), *_ = list(iter_batches(data))
    return list(range(header.record_count))
