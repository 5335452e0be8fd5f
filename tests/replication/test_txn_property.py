"""Random interleavings of transactions on one partition log (real segment files): whatever
the order of transactional batches, plain batches, COMMIT/ABORT markers, HW advances and
reopenings, a read_committed reader that fetches in pieces up to the LSO (the read path's
rules: records below the LSO, aborted transactions from the txn index) sees exactly the
records of committed transactions and plain batches below the LSO; the LSO never passes an
open transaction, never exceeds the HW and never goes back; the txn index and the producer
table rebuilt from the log match the live ones."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlog.records import Record, build_batch, build_txn_marker
from raftlog.replication.producer_state import ProducerStateTable, rebuild
from raftlog.storage import LogConfig, PartitionLog
from raftlog.storage.txn_index import AbortedTxn, replay_aborted_txns
from tests.replication.txn_reader import CommittedReader

CONFIG = LogConfig(segment_bytes=500, index_interval_bytes=100)
PIDS = (1, 2, 3)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("data"), st.sampled_from(PIDS)),
        st.tuples(st.just("end"), st.sampled_from(PIDS), st.booleans()),
        st.tuples(st.just("plain")),
        st.tuples(st.just("hw")),
        st.tuples(st.just("reopen")),
    ),
    min_size=8,
    max_size=40,
)


def _data(pid: int, seq: int, values: list[bytes]) -> bytes:
    return build_batch(
        [Record(value=v) for v in values],
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
        is_transactional=True,
        now_ms=1000,
    )


def _read_committed(plog: PartitionLog, lso: int, max_bytes: int) -> list[bytes]:
    reader = CommittedReader()
    reader.next_offset = plog.log_start_offset
    while reader.next_offset < lso:
        result = plog.read(reader.next_offset, max_bytes, max_offset=lso)
        data = result.read_bytes()
        if not data:
            break
        aborted = plog.collect_aborted_txns(reader.next_offset, result.next_offset)
        reader.consume(data, [(t.producer_id, t.first_offset) for t in aborted])
        assert reader.next_offset == result.next_offset
    return [r.value or b"" for r in reader.records]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, max_bytes=st.sampled_from([1, 150, 1 << 20]))
def test_read_committed_sees_exactly_the_committed_records(ops: list, max_bytes: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        directory = Path(root) / "t-0"
        plog = PartitionLog.open(directory, CONFIG, now_ms=0)
        table = ProducerStateTable()
        seqs = dict.fromkeys(PIDS, 0)
        # pid -> (offset, value) of its open transaction's records
        pending: dict[int, list[tuple[int, bytes]]] = {}
        committed: list[tuple[int, bytes]] = []  # (offset, value) readable once below the LSO
        hw = last_lso = 0
        for index, op in enumerate(ops):
            kind = op[0]
            if kind == "hw":
                hw = plog.log_end_offset
            elif kind == "reopen":
                plog.close()
                plog = PartitionLog.open(directory, CONFIG, now_ms=0)
                table = rebuild(plog, directory)
            else:
                values = [f"{kind}-{index}-a".encode(), f"{kind}-{index}-b".encode()]
                if kind == "data":
                    data = _data(op[1], seqs[op[1]], values)
                    seqs[op[1]] += 2
                elif kind == "end":
                    data = build_txn_marker(
                        producer_id=op[1],
                        producer_epoch=0,
                        coordinator_epoch=0,
                        commit=op[2],
                        timestamp_ms=1000,
                    )
                else:
                    data = build_batch([Record(value=v) for v in values], now_ms=1000)
                info = plog.append_as_leader(data, leader_epoch=1, now_ms=0)
                completed = table.update_leader_append(data, info.first_offset)
                plog.append_aborted_txns(
                    [
                        AbortedTxn(
                            c.producer_id, c.first_offset, c.last_offset, c.last_stable_offset
                        )
                        for c in completed
                        if c.aborted
                    ]
                )
                written = list(zip((info.first_offset, info.first_offset + 1), values, strict=True))
                if kind == "data":
                    pending.setdefault(op[1], []).extend(written)
                elif kind == "end":
                    ended = pending.pop(op[1], [])
                    if op[2]:
                        committed.extend(ended)
                else:
                    committed.extend(written)
            lso = table.last_stable_offset(hw)
            assert last_lso <= lso <= hw
            last_lso = lso
            for records in pending.values():
                assert lso <= records[0][0]  # never past an open transaction
            expected = [v for o, v in sorted(committed) if o < lso]
            assert _read_committed(plog, lso, max_bytes) == expected, (ops[: index + 1], lso)
        # The index and the table rebuilt from the log match the live ones.
        live_index = [[e for e in s.txn_index.entries] for s in plog.segments]
        replayed = replay_aborted_txns(plog.segments, plog.log_start_offset)
        assert [
            [(e.producer_id, e.first_offset, e.last_offset) for e in seg] for seg in live_index
        ] == [[(e.producer_id, e.first_offset, e.last_offset) for e in seg] for seg in replayed]
        assert rebuild(plog, directory / "none").as_tuple() == table.as_tuple()
        plog.close()
