"""The analyses of Jepsen's Kafka queue workload, over an Index built in one pass.

Every anomaly is counted in full; only the first ``max_examples`` of each type (in history
order) keep an example, so a badly broken run still produces a small results.json.
Examples name history indices (the ``index`` field of history.jsonl) so they can be found.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from jepsen.checker.index import Index, KeyLog
from jepsen.history import ASSIGN, CRASH, FAIL, INFO, INVOKE, OK, READ_FS, History, Process

# name -> one line on what it means; the order is the order reports list them in.
ANOMALY_TYPES: dict[str, str] = {
    "lost-write": "acknowledged send never read, though reads of its key got past its offset",
    "unseen": "acknowledged send never read by any poll, final polls included",
    "vanished": "a value polls returned that the final polls did not return",
    "duplicate": "one value at more than one offset of its key",
    "inconsistent-offsets": "different values at the same key and offset",
    "aborted-read": "a poll returned a value whose send definitely failed",
    "phantom-read": "a poll returned a value that no send ever wrote",
    "poll-skip": "a consumer's next poll skipped records known to exist",
    "nonmonotonic-poll": "a consumer's next poll started at or before where its last one ended",
    "int-poll-skip": "within one poll, a key's records skip records known to exist",
    "int-nonmonotonic-poll": "within one poll, a key's records go backwards or repeat",
    "nonmonotonic-send": "a producer's acknowledged offsets for a key went backwards",
}

DEFAULT_MAX_EXAMPLES = 8
# A skip example lists at most this many of the skipped records (the count is always full).
MAX_SKIPPED_SHOWN = 16


class Anomalies:
    def __init__(self, max_examples: int = DEFAULT_MAX_EXAMPLES) -> None:
        self.max_examples = max_examples
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[dict[str, Any]]] = {}

    def add(self, kind: str, example: dict[str, Any]) -> None:
        assert kind in ANOMALY_TYPES, kind
        self.counts[kind] += 1
        shown = self.examples.setdefault(kind, [])
        if len(shown) < self.max_examples:
            shown.append(example)


def check_log_shape(idx: Index, out: Anomalies) -> None:
    """inconsistent-offsets and duplicate: the version order itself is contradictory."""
    for key, log in sorted(idx.keys.items()):
        for offset, values in sorted(log.conflicts.items()):
            out.add(
                "inconsistent-offsets",
                {"key": key, "offset": offset, "values": sorted(values, key=str)},
            )
        for value, offsets in log.dup_offsets.items():
            out.add("duplicate", {"key": key, "value": value, "offsets": sorted(offsets)})


def check_reads_against_writes(idx: Index, out: Anomalies) -> None:
    """aborted-read and phantom-read: what polls returned, against what sends attempted."""
    for key, log in sorted(idx.keys.items()):
        writes = idx.writes.get(key, {})
        for value, reader in log.first_reader.items():
            write = writes.get(value)
            if write is None:
                out.add(
                    "phantom-read",
                    {"key": key, "value": value, "offset": log.offset_of[value], "reader": reader},
                )
            elif write.type == FAIL:
                out.add(
                    "aborted-read",
                    {
                        "key": key,
                        "value": value,
                        "offset": log.offset_of[value],
                        "writer": write.index,
                        "reader": reader,
                    },
                )


def check_acknowledged(idx: Index, out: Anomalies) -> None:
    """lost-write and unseen: acknowledged sends that no poll ever returned.

    Lost when some ok poll of the key read at or past the send's offset: the consumer went
    by where the record should have been. Unseen otherwise: nobody polled that far, which
    after the final polls (a fresh consumer reading every key from the beginning) is still a
    failure, but a different one. Info sends are never either: they may not have happened.
    """
    for key, writes in sorted(idx.writes.items()):
        log = idx.keys.get(key) or KeyLog()
        for value, write in writes.items():
            if write.type != OK or value in log.first_reader:
                continue
            example = {"key": key, "value": value, "offset": write.offset, "writer": write.index}
            if write.offset is not None and write.offset <= log.max_read_offset:
                example["max_read_offset"] = log.max_read_offset
                example["max_reader"] = log.max_read_index
                out.add("lost-write", example)
            else:
                out.add("unseen", example)


def check_final_reads(idx: Index, out: Anomalies) -> None:
    """vanished: a value some poll returned (so it was committed, whatever its send's
    outcome) that the final polls, which read every key from the beginning to its end, did
    not return. Catches a log that lost records after they were read, including a truncated
    tail that no later read reaches. Only checked when some final poll succeeded."""
    if not idx.final_polls_ok:
        return
    for key, log in sorted(idx.keys.items()):
        final = log.final_values
        for value, reader in log.first_reader.items():
            if value not in final:
                out.add(
                    "vanished",
                    {"key": key, "value": value, "offset": log.offset_of[value], "reader": reader},
                )


def check_consumer_order(history: History, idx: Index, out: Anomalies) -> None:
    """poll-skip / nonmonotonic-poll across a consumer's consecutive polls, and the int-
    variants within one poll. Positions are dense indices into the key's known offsets.

    A consumer's position is forgotten when it is replaced: a crash op, or any info
    completion (the workload rebuilds a client whose request hung, as Jepsen gives the
    process a new identity). An ok assign keeps positions only for keys still assigned, and
    none when it seeks to the beginning. A failed poll leaves the position alone.
    """
    positions: dict[Process, dict[str, tuple[int, int]]] = {}  # key -> (offset, op index)
    for op in history.ops:
        if op.is_nemesis or op.type == INVOKE:
            continue
        p = op.process
        if op.f == CRASH or op.type == INFO:
            positions.pop(p, None)
            continue
        if op.f == ASSIGN and op.type == OK:
            _reassign(positions, p, op.value)
            continue
        if op.f not in READ_FS or op.type != OK:
            continue
        state = positions.setdefault(p, {})
        for key, offsets in idx.poll_offsets[op.index].items():
            if not offsets:
                continue
            log = idx.keys[key]
            prev = state.get(key)
            if prev is not None:
                _compare(out, "", key, log, prev[0], offsets[0], [prev[1], op.index], p)
            # The hot loop (every record read): compare dense positions inline and call out
            # only for the rare anomaly.
            dense = log.dense
            o1 = offsets[0]
            i1 = dense[o1]
            for o2 in offsets[1:]:
                i2 = dense[o2]
                if i2 - i1 != 1:
                    _compare(out, "int-", key, log, o1, o2, [op.index], p)
                o1, i1 = o2, i2
            state[key] = (offsets[-1], op.index)


def _reassign(positions: dict[Process, dict[str, tuple[int, int]]], p: Process, value: Any) -> None:
    state = positions.get(p)
    if not state:
        return
    if not isinstance(value, dict) or value.get("seek_to_beginning"):
        positions.pop(p, None)
        return
    keep = {str(k) for k in value.get("keys") or ()}
    positions[p] = {k: v for k, v in state.items() if k in keep}


def _compare(
    out: Anomalies,
    prefix: str,
    key: str,
    log: KeyLog,
    o1: int,
    o2: int,
    ops: list[int],
    process: Process,
) -> None:
    i1, i2 = log.dense[o1], log.dense[o2]
    delta = i2 - i1
    if delta == 1:
        return
    example: dict[str, Any] = {
        "key": key,
        "offsets": [o1, o2],
        "delta": delta,
        "ops": ops,
        "process": process,
    }
    if delta > 1:
        skipped = log.offsets[i1 + 1 : i2]
        example["skipped"] = [[o, log.value_at[o]] for o in skipped[:MAX_SKIPPED_SHOWN]]
        out.add(prefix + "poll-skip", example)
    else:
        out.add(prefix + "nonmonotonic-poll", example)


def check_producer_order(idx: Index, out: Anomalies) -> None:
    """nonmonotonic-send: each process's ok sends to a key, in completion order, must get
    increasing offsets. A send completes before the same process starts its next one, so a
    lower offset means the log moved backwards under an acknowledged write."""
    last: dict[tuple[Process, str], tuple[int, int, Any]] = {}  # -> (offset, index, value)
    ordered = sorted(
        (w for writes in idx.writes.values() for w in writes.values()),
        key=lambda w: w.index,
    )
    for w in ordered:
        if w.type != OK or w.offset is None:
            continue
        slot = (w.process, w.key)
        prev = last.get(slot)
        if prev is not None and w.offset <= prev[0]:
            out.add(
                "nonmonotonic-send",
                {
                    "key": w.key,
                    "process": w.process,
                    "offsets": [prev[0], w.offset],
                    "values": [prev[2], w.value],
                    "ops": [prev[1], w.index],
                },
            )
        last[slot] = (w.offset, w.index, w.value)


def run_all(history: History, idx: Index, max_examples: int = DEFAULT_MAX_EXAMPLES) -> Anomalies:
    out = Anomalies(max_examples)
    check_log_shape(idx, out)
    check_reads_against_writes(idx, out)
    check_acknowledged(idx, out)
    check_final_reads(idx, out)
    check_consumer_order(history, idx, out)
    check_producer_order(idx, out)
    return out


__all__ = ["ANOMALY_TYPES", "DEFAULT_MAX_EXAMPLES", "Anomalies", "run_all"]
