"""Checker of the transactional workload's histories (jepsen.txn_history), after Jepsen's
Kafka checker: ``check_txn(history)`` -> a results dict shaped like the queue checker's.

What is known, and from where:
- the version order of each key (partition): every [offset, value] any read returned
  (pollers, the polls inside transactions, the final polls), plus the delivery-report
  offsets of committed transactions' sends;
- who wrote each value: the transaction whose send carried it, and that transaction's
  outcome (ok committed, fail definitely not, info either);
- what the final polls returned: after the faults, a read_committed consumer reads every
  partition from the beginning to its end.

Why no write-write (G0) cycles by default: Kafka appends a transaction's records when they
are produced, not when it commits, so two concurrent transactions may land in opposite
orders on two partitions and both commit; Kafka's protocol allows that (Jepsen's own Kafka
test turns its offset-order ww inference off for transactions). The cycles searched instead
(G1c) use only what read_committed promises: a consumer that returns a record at offset o
of partition p has seen every transaction with a record below o in p decided (the last
stable offset passed it). So "T2 read p at or past T1's record" means T1 was decided before
T2 committed, and a cycle of such edges is impossible in any correct execution. Pass
``ww_deps=True`` to count offset-order G0 cycles as anomalies too.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from jepsen.checker.anomalies import DEFAULT_MAX_EXAMPLES, Anomalies
from jepsen.checker.check import RESULTS_SCHEMA, RESULTS_VERSION, fault_summary, op_counts
from jepsen.checker.index import norm_value
from jepsen.history import ASSIGN, CRASH, FAIL, FINAL_POLL, INFO, INVOKE, OK, POLL, History, Op
from jepsen.txn_history import TXN

TXN_ANOMALY_TYPES: dict[str, str] = {
    "aborted-read": "a read returned a value of a transaction that definitely did not commit",
    "phantom-read": "a read returned a value no transaction sent to that partition",
    "lost-write": "a committed transaction none of whose values the final polls returned",
    "torn-transaction": "a transaction (committed or unknown) only some of whose values the "
    "final polls returned",
    "vanished": "a value some read returned that the final polls did not return",
    "duplicate": "one value at more than one offset",
    "inconsistent-offsets": "different values at the same partition and offset",
    "poll-skip": "a consumer's reads of a partition skipped a committed value",
    "nonmonotonic-poll": "a consumer's reads of a partition went backwards or repeated",
    "reconsumed": "a committed transaction polled input its group's earlier committed "
    "transactions had consumed (transactional offsets lost or ignored)",
    "input-skip": "a committed transaction polled past input no committed transaction of its "
    "group consumed",
    "G1c": "a cycle of transactions each of which read a partition at or past a record of "
    "the next (each committed before the other)",
    "G0": "a cycle of offset-order write-write dependencies (only with ww_deps)",
}
# A cycle example names at most this many transactions.
MAX_CYCLE_SHOWN = 12


class TxnAnomalies(Anomalies):
    """The queue checker's collector, over this checker's anomaly table."""

    def add(self, kind: str, example: dict[str, Any]) -> None:
        assert kind in TXN_ANOMALY_TYPES, kind
        self.counts[kind] += 1
        shown = self.examples.setdefault(kind, [])
        if len(shown) < self.max_examples:
            shown.append(example)


@dataclass(slots=True)
class Txn:
    """One transaction op: what it sent and read, and how it ended."""

    index: int  # the invoke's history index: the transaction's name in examples
    process: Any
    type: str  # ok / fail / info
    sends: list[tuple[str, Any, int | None]]  # (key, value, delivery offset)
    reads: dict[str, list[tuple[int, Any]]] | None  # None: it did not poll
    complete_index: int | None


@dataclass
class Index:
    txns: list[Txn] = field(default_factory=list)
    writer: dict[Any, tuple[str, Txn]] = field(default_factory=dict)  # value -> (key, txn)
    # Every read, in history order: (op index, process, f, {key: [(offset, value)]}).
    reads: list[tuple[int, Any, str, dict[str, list[tuple[int, Any]]]]] = field(
        default_factory=list
    )
    value_at: dict[str, dict[int, Any]] = field(default_factory=dict)
    offsets_of: dict[tuple[str, Any], set[int]] = field(default_factory=dict)
    first_read: dict[Any, int] = field(default_factory=dict)  # value -> op index
    final: dict[str, set[Any]] = field(default_factory=dict)
    has_final: bool = False
    # Per key, the visible values in offset order, and each visible offset's position in
    # it (by offset, so a value at two offsets is one duplicate, not also a bad poll).
    order: dict[str, list[Any]] = field(default_factory=dict)
    position: dict[tuple[str, int], int] = field(default_factory=dict)


def _reads_of(value: Any) -> dict[str, list[tuple[int, Any]]]:
    out: dict[str, list[tuple[int, Any]]] = {}
    if isinstance(value, dict):
        for key, pairs in value.items():
            out[str(key)] = [(int(o), norm_value(v)) for o, v in pairs or ()]
    return out


def _txn_of(inv: Op, done: Op | None) -> Txn:
    body = done.value if done is not None and isinstance(done.value, dict) else inv.value
    mops = body.get("mops", []) if isinstance(body, dict) else []
    sends: list[tuple[str, Any, int | None]] = []
    reads = None
    for mop in mops:
        if mop and mop[0] == "send" and len(mop) >= 3:
            offset = mop[3] if len(mop) > 3 and mop[3] is not None else None
            sends.append((str(mop[1]), norm_value(mop[2]), offset))
        elif mop and mop[0] == "poll" and len(mop) > 1:
            reads = _reads_of(mop[1])
    type_ = done.type if done is not None else INFO
    return Txn(inv.index, inv.process, type_, sends, reads, None if done is None else done.index)


def build_index(history: History) -> Index:
    idx = Index()
    open_ops: dict[Any, Op] = {}
    for op in history.ops:
        if op.is_nemesis:
            continue
        if op.type == INVOKE:
            stale = open_ops.pop(op.process, None)
            if stale is not None and stale.f == TXN:
                idx.txns.append(_txn_of(stale, None))
            open_ops[op.process] = op
            continue
        inv = open_ops.pop(op.process, None)
        if op.f == TXN and inv is not None:
            txn = _txn_of(inv, op)
            idx.txns.append(txn)
            if txn.reads is not None:
                idx.reads.append((op.index, op.process, TXN, txn.reads))
        elif op.f in (POLL, FINAL_POLL) and op.type == OK:
            reads = _reads_of(op.value)
            idx.reads.append((op.index, op.process, op.f, reads))
            if op.f == FINAL_POLL:
                idx.has_final = True
                for key, pairs in reads.items():
                    idx.final.setdefault(key, set()).update(v for _, v in pairs)
    idx.txns.extend(_txn_of(inv, None) for inv in open_ops.values() if inv.f == TXN)
    idx.txns.sort(key=lambda t: t.index)
    for txn in idx.txns:
        for key, value, _ in txn.sends:
            idx.writer.setdefault(value, (key, txn))
    for op_index, _, _, reads in idx.reads:
        for key, pairs in reads.items():
            for offset, value in pairs:
                _place(idx, key, offset, value)
                idx.first_read.setdefault(value, op_index)
    for txn in idx.txns:
        if txn.type == OK:
            for key, value, sent_at in txn.sends:
                if sent_at is not None:
                    _place(idx, key, sent_at, value)
    # The visible order: values at known offsets whose writer may have committed.
    for key, at in idx.value_at.items():
        visible = [
            (o, v)
            for o, v in sorted(at.items())
            if v in idx.writer and idx.writer[v][0] == key and idx.writer[v][1].type != FAIL
        ]
        idx.order[key] = [v for _, v in visible]
        for i, (o, _) in enumerate(visible):
            idx.position[(key, o)] = i
    return idx


def _place(idx: Index, key: str, offset: int, value: Any) -> None:
    idx.value_at.setdefault(key, {}).setdefault(offset, value)
    idx.offsets_of.setdefault((key, value), set()).add(offset)


# -- the analyses -----------------------------------------------------------------------------


def check_log_shape(history: History, idx: Index, out: Anomalies) -> None:
    seen: dict[tuple[str, int], set[Any]] = {}
    for _, _, _, reads in idx.reads:
        for key, pairs in reads.items():
            for offset, value in pairs:
                seen.setdefault((key, offset), set()).add(value)
    for txn in idx.txns:
        if txn.type == OK:
            for key, value, sent_at in txn.sends:
                if sent_at is not None:
                    seen.setdefault((key, sent_at), set()).add(value)
    for (key, offset), values in sorted(seen.items()):
        if len(values) > 1:
            out.add(
                "inconsistent-offsets",
                {"key": key, "offset": offset, "values": sorted(values, key=str)},
            )
    for (key, value), offsets in sorted(idx.offsets_of.items(), key=str):
        if len(offsets) > 1:
            out.add("duplicate", {"key": key, "value": value, "offsets": sorted(offsets)})


def check_reads(idx: Index, out: Anomalies) -> None:
    """aborted-read and phantom-read, once per value (its first reader named)."""
    reported: set[Any] = set()
    for op_index, process, f, reads in idx.reads:
        for key, pairs in reads.items():
            for offset, value in pairs:
                if value in reported:
                    continue
                written = idx.writer.get(value)
                example: dict[str, Any] = {
                    "key": key,
                    "value": value,
                    "offset": offset,
                    "reader": op_index,
                }
                example["reader_process"], example["reader_f"] = process, f
                if written is None or written[0] != key:
                    reported.add(value)
                    if written is not None:
                        example["sent_to_key"] = written[0]
                    out.add("phantom-read", example)
                elif written[1].type == FAIL:
                    reported.add(value)
                    example["writer"] = written[1].index
                    out.add("aborted-read", example)


def check_final(idx: Index, out: Anomalies) -> None:
    """lost-write, torn-transaction and vanished, against what the final polls returned.
    Not checked without final polls (the results warn)."""
    if not idx.has_final:
        return
    for txn in idx.txns:
        if txn.type == FAIL or not txn.sends:
            continue
        present = [(k, v) for k, v, _ in txn.sends if v in idx.final.get(k, ())]
        missing = [(k, v, o) for k, v, o in txn.sends if v not in idx.final.get(k, ())]
        if not missing:
            continue
        example: dict[str, Any] = {
            "txn": txn.index,
            "process": txn.process,
            "type": txn.type,
            "missing": [[k, v, o] for k, v, o in missing],
        }
        if present:
            example["present"] = [[k, v] for k, v in present]
            out.add("torn-transaction", example)
        elif txn.type == OK:
            out.add("lost-write", example)
    for key, at in sorted(idx.value_at.items()):
        for offset, value in sorted(at.items()):
            if value in idx.first_read and value not in idx.final.get(key, ()):
                written = idx.writer.get(value)
                if written is not None and written[1].type == FAIL:
                    continue  # an aborted read already, not a loss
                out.add(
                    "vanished",
                    {"key": key, "value": value, "offset": offset, "reader": idx.first_read[value]},
                )


def check_consumer_order(history: History, idx: Index, out: Anomalies) -> None:
    """poll-skip and nonmonotonic-poll: within one consumer's life, its reads of a partition
    must be consecutive in the visible order. A poller's assign with seek_to_beginning starts
    at the first visible value; a crash (or an info poll, after which the workload rebuilds
    the consumer) forgets where the consumer was."""
    reads_at = {op_index: reads for op_index, _, _, reads in idx.reads}
    expected: dict[Any, dict[str, tuple[int, int]]] = {}  # process -> key -> (next, op index)
    for op in history.ops:
        if op.is_nemesis or op.type == INVOKE:
            continue
        p = op.process
        if op.f == CRASH or (op.type == INFO and op.f in (POLL, FINAL_POLL, ASSIGN)):
            expected.pop(p, None)
            continue
        if op.f == ASSIGN and op.type == OK:
            keys = [str(k) for k in (op.value or {}).get("keys", ())]
            if (op.value or {}).get("seek_to_beginning"):
                expected[p] = {k: (0, op.index) for k in keys}
            else:  # kept partitions keep their position; new ones start where we cannot tell
                kept = expected.get(p, {})
                expected[p] = {k: kept[k] for k in keys if k in kept}
            continue
        reads = reads_at.get(op.index)
        if reads is None:
            continue
        state = expected.setdefault(p, {})
        for key, pairs in reads.items():
            for offset, value in pairs:
                at = idx.position.get((key, offset))
                if at is None:
                    continue  # not a visible value: reported as an aborted or phantom read
                prev = state.get(key)
                if prev is not None and at != prev[0]:
                    example: dict[str, Any] = {
                        "key": key,
                        "process": p,
                        "ops": [prev[1], op.index],
                        "expected": idx.order[key][prev[0]]
                        if prev[0] < len(idx.order[key])
                        else None,
                        "got": value,
                    }
                    if at > prev[0]:
                        example["skipped"] = idx.order[key][prev[0] : at][:MAX_CYCLE_SHOWN]
                        out.add("poll-skip", example)
                    else:
                        out.add("nonmonotonic-poll", example)
                state[key] = (at + 1, op.index)


def check_group_offsets(idx: Index, out: Anomalies) -> None:
    """reconsumed and input-skip: each process's transactions consume with one group whose
    offsets commit with them, so the reads of its committed transactions, in order, must
    cover each partition's visible values exactly once from the beginning. An info
    transaction may have committed or not: both continuations stay possible."""
    by_process: dict[Any, list[Txn]] = {}
    for txn in idx.txns:
        if txn.reads is not None and txn.type != FAIL:
            by_process.setdefault(txn.process, []).append(txn)
    for process, txns in by_process.items():
        cursors: dict[str, set[int]] = {}
        for txn in txns:
            for key, pairs in sorted((txn.reads or {}).items()):
                seen = [idx.position[(key, o)] for o, _ in pairs if (key, o) in idx.position]
                if not seen:
                    continue
                first, last = seen[0], seen[-1]
                possible = cursors.setdefault(key, {0})
                if txn.type == INFO:
                    possible.add(last + 1)
                    continue
                if first not in possible:
                    kind = "reconsumed" if first < max(possible) else "input-skip"
                    out.add(
                        kind,
                        {
                            "key": key,
                            "process": process,
                            "txn": txn.index,
                            "first_read": pairs[0][1],
                            "expected_one_of": [
                                idx.order[key][c] if c < len(idx.order[key]) else None
                                for c in sorted(possible)
                            ],
                        },
                    )
                cursors[key] = {last + 1}


def check_cycles(idx: Index, out: Anomalies, ww_deps: bool) -> dict[str, int]:
    """G1c over read-past edges; G0 over offset-order ww edges (an anomaly only with
    ww_deps). Returns counts for the stats."""
    committed = {t.index: t for t in idx.txns if t.type != FAIL}
    # Graph nodes: transactions by invoke index, and ("v", key, position) version slots.
    # A writer points at its version's slot, each slot at the next in the partition, and a
    # slot at every transaction whose poll of the partition ended there: a path from T1
    # into T2 exists exactly when T2 read a partition at or past a record of T1.
    edges: dict[Any, set[Any]] = {}
    for key, order in idx.order.items():
        for i, value in enumerate(order):
            slot = ("v", key, i)
            if i + 1 < len(order):
                edges.setdefault(slot, set()).add(("v", key, i + 1))
            writer = idx.writer[value][1]
            if writer.index in committed:
                edges.setdefault(writer.index, set()).add(slot)
    for txn in committed.values():
        for key, pairs in (txn.reads or {}).items():
            at = [idx.position[(key, o)] for o, _ in pairs if (key, o) in idx.position]
            if at:
                edges.setdefault(("v", key, max(at)), set()).add(txn.index)
    g1c = 0
    for component in strongly_connected(edges):
        members = sorted(n for n in component if isinstance(n, int))
        cyclic = len(component) > 1 or any(n in edges.get(n, ()) for n in component)
        if members and cyclic:
            g1c += 1
            out.add("G1c", {"txns": members[:MAX_CYCLE_SHOWN], "size": len(members)})
    ww: dict[Any, set[Any]] = {}
    for order in idx.order.values():
        for a, b in itertools.pairwise(order):
            ta, tb = idx.writer[a][1].index, idx.writer[b][1].index
            if ta != tb:
                ww.setdefault(ta, set()).add(tb)
    g0 = 0
    for component in strongly_connected(ww):
        if len(component) > 1:
            g0 += 1
            if ww_deps:
                out.add("G0", {"txns": sorted(component)[:MAX_CYCLE_SHOWN], "size": len(component)})
    return {"g1c_components": g1c, "ww_cycle_components": g0}


def strongly_connected(edges: dict[Any, set[Any]]) -> list[list[Any]]:
    """Tarjan's strongly connected components, iterative (histories are deep)."""
    nodes = set(edges)
    for targets in edges.values():
        nodes |= targets
    index_of: dict[Any, int] = {}
    low: dict[Any, int] = {}
    on_stack: set[Any] = set()
    stack: list[Any] = []
    components: list[list[Any]] = []
    counter = 0
    for root in sorted(nodes, key=str):
        if root in index_of:
            continue
        work: list[tuple[Any, list[Any]]] = [(root, sorted(edges.get(root, ()), key=str))]
        index_of[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index_of:
                    index_of[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(edges.get(nxt, ()), key=str)))
                elif nxt in on_stack:
                    low[node] = min(low[node], index_of[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index_of[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components


def check_txn(
    history: History, max_examples: int = DEFAULT_MAX_EXAMPLES, *, ww_deps: bool = False
) -> dict[str, Any]:
    """Check a transactional history; ``valid`` only when no anomaly of any type was found."""
    started = time.perf_counter()
    idx = build_index(history)
    out = TxnAnomalies(max_examples)
    check_log_shape(history, idx, out)
    check_reads(idx, out)
    check_final(idx, out)
    check_consumer_order(history, idx, out)
    check_group_offsets(idx, out)
    cycles = check_cycles(idx, out, ww_deps)
    counts = {kind: out.counts.get(kind, 0) for kind in TXN_ANOMALY_TYPES}
    if not ww_deps:
        del counts["G0"]
    found = [kind for kind, n in counts.items() if n]
    by_type = Counter(t.type for t in idx.txns)
    results: dict[str, Any] = {
        "schema": RESULTS_SCHEMA,
        "version": RESULTS_VERSION,
        "workload": "txn",
        "valid": not found,
        "anomaly_types": found,
        "anomaly_counts": counts,
        "anomalies": {kind: out.examples[kind] for kind in found},
        "ops": op_counts(history),
        "faults": fault_summary(history),
        "stats": {
            "history_entries": len(history),
            "duration_s": round(history.duration_ns / 1e9, 3),
            "keys": len(idx.order),
            "acknowledged_sends": sum(len(t.sends) for t in idx.txns if t.type == OK),
            "txns": {t: by_type.get(t, 0) for t in (OK, FAIL, INFO)},
            "txns_with_reads_committed": sum(
                1 for t in idx.txns if t.type == OK and t.reads is not None
            ),
            "distinct_values_read": len(idx.first_read),
            **cycles,
        },
        "warnings": _warnings(idx, cycles, ww_deps),
    }
    results["stats"]["check_ms"] = round((time.perf_counter() - started) * 1000, 1)
    return results


def _warnings(idx: Index, cycles: dict[str, int], ww_deps: bool) -> list[str]:
    out = []
    if not any(t.type == OK for t in idx.txns):
        out.append("no committed transactions: nothing to lose, so 'valid' proves little")
    if not idx.has_final and idx.txns:
        out.append("no final-poll ops: lost and torn transactions were not checked")
    if cycles["ww_cycle_components"] and not ww_deps:
        out.append(
            f"{cycles['ww_cycle_components']} offset-order write-write cycle(s) (G0): allowed "
            "by Kafka's transactions, not counted"
        )
    return out


__all__ = ["TXN_ANOMALY_TYPES", "build_index", "check_txn", "strongly_connected"]
