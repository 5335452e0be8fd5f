"""One pass over a history that builds what every analysis needs: per key, what is known to
sit at each offset, who wrote each value, who read it, and how far reads got.

Sources of "value v is at offset o of key k" (the version order):
- an ``ok`` send that reported its offset;
- every [offset, value] pair an ``ok`` poll returned.
Failed and info polls return nothing in this harness, so they add nothing. Info sends have no
offset, so they place nothing either; their values join the order only when a poll reads them.

Keys are normalised to ``str`` (JSON object keys are strings, send keys may be ints) and
values to something hashable, so the same record compares equal wherever it appears.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from jepsen.history import FAIL, FINAL_POLL, INFO, INVOKE, OK, READ_FS, SEND, History, Op, Process


def norm_value(value: Any) -> Any:
    """Values are ints or strings in practice; anything else is frozen to its JSON text."""
    if isinstance(value, int | str):
        return value
    return json.dumps(value, sort_keys=True)


def send_key_value(op: Op) -> tuple[str, Any] | None:
    value = op.value
    if not isinstance(value, list | tuple) or len(value) != 2:
        return None
    return str(value[0]), norm_value(value[1])


@dataclass(slots=True)
class Write:
    """The completion of the send that wrote ``value`` to ``key``."""

    key: str
    value: Any
    type: str
    offset: int | None
    index: int  # completion's history index (the invoke's when it never completed)
    process: Process


@dataclass(slots=True)
class KeyLog:
    """Everything known about one key (one topic-partition)."""

    value_at: dict[int, Any] = field(default_factory=dict)  # offset -> first value seen
    # offset -> every distinct value seen there; only offsets with more than one
    conflicts: dict[int, set[Any]] = field(default_factory=dict)
    offset_of: dict[Any, int] = field(default_factory=dict)  # value -> first offset seen
    # value -> every distinct offset it was seen at; only values seen at more than one
    dup_offsets: dict[Any, set[int]] = field(default_factory=dict)
    first_reader: dict[Any, int] = field(default_factory=dict)  # value -> first ok poll index
    final_values: set[Any] = field(default_factory=set)  # values returned by ok final polls
    max_read_offset: int = -1
    max_read_index: int = -1  # the ok poll that read max_read_offset
    # Filled by finish(): the known offsets in order, and each one's dense position. Dense
    # positions ignore holes (offsets nobody reported), so "skipped" means skipped over a
    # record we know exists, never over an offset that may hold nothing visible.
    offsets: list[int] = field(default_factory=list)
    dense: dict[int, int] = field(default_factory=dict)

    def place(self, offset: int, value: Any) -> None:
        seen = self.value_at.setdefault(offset, value)
        if seen != value:
            self.conflicts.setdefault(offset, {seen}).add(value)
        first = self.offset_of.setdefault(value, offset)
        if first != offset:
            self.dup_offsets.setdefault(value, {first}).add(offset)

    def finish(self) -> None:
        self.offsets = sorted(self.value_at)
        self.dense = {o: i for i, o in enumerate(self.offsets)}


@dataclass
class Index:
    keys: dict[str, KeyLog] = field(default_factory=dict)
    writes: dict[str, dict[Any, Write]] = field(default_factory=dict)  # key -> value -> Write
    has_final_polls: bool = False  # any final-poll invoked
    final_polls_ok: int = 0
    # ok poll history index -> {key: offsets read, in returned order}, for the order checks
    poll_offsets: dict[int, dict[str, list[int]]] = field(default_factory=dict)

    def key(self, key: str) -> KeyLog:
        log = self.keys.get(key)
        if log is None:
            log = self.keys[key] = KeyLog()
        return log


# When the same value is sent twice (a workload bug, or a retried send recorded twice), the
# most informative completion wins: ok says it happened, fail that it did not.
_WRITE_RANK = {OK: 3, INFO: 2, FAIL: 1}


def build_index(history: History) -> Index:
    idx = Index()
    open_sends: dict[Process, Op] = {}
    for op in history.ops:
        if op.is_nemesis:
            continue
        if op.f == SEND:
            if op.type == INVOKE:
                open_sends[op.process] = op
                continue
            inv = open_sends.pop(op.process, None)
            kv = send_key_value(op) or (send_key_value(inv) if inv is not None else None)
            if kv is None:
                continue
            _add_write(idx, Write(kv[0], kv[1], op.type, op.offset, op.index, op.process))
            if op.type == OK and op.offset is not None:
                idx.key(kv[0]).place(op.offset, kv[1])
        elif op.f in READ_FS:
            if op.type == INVOKE:
                idx.has_final_polls = idx.has_final_polls or op.f == FINAL_POLL
                continue
            if op.type != OK:
                continue
            is_final = op.f == FINAL_POLL
            idx.final_polls_ok += is_final
            per_key: dict[str, list[int]] = {}
            idx.poll_offsets[op.index] = per_key
            value = op.value
            if not isinstance(value, dict):
                continue
            for raw_key, pairs in value.items():
                key = str(raw_key)
                log = idx.key(key)
                per_key[key] = offsets = []
                # Inlined KeyLog.place over the raw JSON pairs: this loop runs once per
                # record read (millions), so no intermediate lists and type() over isinstance.
                value_at, offset_of, first_reader = log.value_at, log.offset_of, log.first_reader
                final_values = log.final_values if is_final else None
                for offset, v in pairs or ():
                    if offset is None:
                        continue
                    if type(v) is not int and type(v) is not str:
                        v = norm_value(v)
                    offsets.append(offset)
                    if final_values is not None:
                        final_values.add(v)
                    seen = value_at.setdefault(offset, v)
                    if seen != v:
                        log.conflicts.setdefault(offset, {seen}).add(v)
                    first = offset_of.setdefault(v, offset)
                    if first != offset:
                        log.dup_offsets.setdefault(v, {first}).add(offset)
                    if v not in first_reader:
                        first_reader[v] = op.index
                # max, not the last pair: a broken poll may return offsets out of order.
                top = max(offsets, default=-1)
                if top > log.max_read_offset:
                    log.max_read_offset = top
                    log.max_read_index = op.index
    # Sends still open when the history ended: outcome unknown, exactly like info.
    for inv in open_sends.values():
        kv = send_key_value(inv)
        if kv is not None:
            _add_write(idx, Write(kv[0], kv[1], INFO, None, inv.index, inv.process))
    for log in idx.keys.values():
        log.finish()
    return idx


def _add_write(idx: Index, write: Write) -> None:
    by_value = idx.writes.setdefault(write.key, {})
    old = by_value.get(write.value)
    if old is None or _WRITE_RANK[write.type] > _WRITE_RANK[old.type]:
        by_value[write.value] = write
