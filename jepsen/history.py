"""The history of a fault-injection run: every client operation and nemesis event, in order.

The shape is Jepsen's. A client operation is two entries: an ``invoke`` when the process
starts it and a completion when it ends, whose type says what we know about its effect:

- ``ok``   it happened (a send was acknowledged at ``offset``; a poll returned ``value``);
- ``fail`` it definitely did not happen (the broker refused it before doing anything);
- ``info`` we cannot tell (timeout, connection lost mid-request): it may or may not have
  happened, now or later. The checker never counts an info send as lost and never calls
  a read of it aborted.

A process runs one operation at a time, so an invoke is completed by the next completion of
the same process. An invoke with no completion when the history ends is treated as ``info``.

Client operations (``f``) and their values, for the Kafka queue workload:

- ``send``        invoke ``[key, value]``; ``ok`` completion repeats it and sets ``offset``.
- ``poll`` and ``final-poll`` (the drain after the faults stop): invoke value ``null``;
  ``ok`` completion value ``{key: [[offset, value], ...]}`` in the order the consumer
  returned them.
- ``assign``      ``{"keys": [...], "seek_to_beginning": bool}``: replaces the consumer's
  partitions; positions of still-assigned keys survive unless it seeks to the beginning.
- ``crash``       the client is torn down and replaced; its consumer position is gone.

Nemesis events have ``process == "nemesis"``, ``f`` ``start`` or ``stop``, type ``info``
(applied) or ``fail`` (could not apply), and value ``{"kind": ..., "targets": [...]}``.

On disk (history.jsonl) the first line is a header carrying the schema version; every other
line is one entry. Times are ``time_ns`` (monotonic nanoseconds since the run started: use it
for ordering and latency) and ``wall_s`` (Unix seconds, to line up with node logs).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

SCHEMA_NAME = "raftlog-jepsen-history"
SCHEMA_VERSION = 1

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
COMPLETION_TYPES = (OK, FAIL, INFO)
ENTRY_TYPES = (INVOKE, *COMPLETION_TYPES)

SEND, POLL, FINAL_POLL, ASSIGN, CRASH = "send", "poll", "final-poll", "assign", "crash"
CLIENT_FS = (SEND, POLL, FINAL_POLL, ASSIGN, CRASH)
READ_FS = (POLL, FINAL_POLL)

NEMESIS = "nemesis"
FAULT_START, FAULT_STOP = "start", "stop"

# A reader refuses lines longer than this rather than building a huge object from one
# corrupt line; a poll of a few thousand records is well under it.
MAX_LINE_BYTES = 16 * 1024 * 1024
# Writers flush once this many entries are buffered, so a crashed harness loses little.
DEFAULT_FLUSH_EVERY_OPS = 1024

Process = int | str


class HistoryError(ValueError):
    """history.jsonl is malformed or from an unknown schema version; the message says where."""


@dataclass(slots=True)
class Op:
    """One history entry. ``index`` is its position in the history (0-based, header excluded)."""

    index: int
    process: Process
    type: str
    f: str
    value: Any = None
    time_ns: int = 0
    wall_s: float = 0.0
    offset: int | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "process": self.process,
            "type": self.type,
            "f": self.f,
            "value": self.value,
            "time_ns": self.time_ns,
            "wall_s": self.wall_s,
        }
        # Optional fields stay out of the line when unset: 50k-op histories add up.
        if self.offset is not None:
            out["offset"] = self.offset
        if self.error is not None:
            out["error"] = self.error
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any], where: str = "") -> Op:
        try:
            op = cls(
                index=int(obj["index"]),
                process=obj["process"],
                type=str(obj["type"]),
                f=str(obj["f"]),
                value=obj.get("value"),
                time_ns=int(obj.get("time_ns", 0)),
                wall_s=float(obj.get("wall_s", 0.0)),
                offset=None if obj.get("offset") is None else int(obj["offset"]),
                error=obj.get("error"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise HistoryError(f"{where}bad entry {obj!r}: {exc!r}") from exc
        if op.type not in ENTRY_TYPES:
            raise HistoryError(f"{where}unknown entry type {op.type!r}")
        return op

    @property
    def is_nemesis(self) -> bool:
        return self.process == NEMESIS


@dataclass(slots=True)
class Completed:
    """A client operation with its invoke and completion joined (what plots and counts use)."""

    process: Process
    f: str
    type: str  # ok / fail / info
    invoke_ns: int
    complete_ns: int | None  # None: never completed before the history ended
    invoke_index: int
    complete_index: int | None

    @property
    def latency_ns(self) -> int | None:
        return None if self.complete_ns is None else self.complete_ns - self.invoke_ns


@dataclass(slots=True)
class FaultWindow:
    """A nemesis fault from its start event to its stop (or the end of the history)."""

    kind: str
    targets: list[str]
    start_ns: int
    stop_ns: int
    healed: bool  # False when the history ended before a stop event closed it


@dataclass
class History:
    """A list of entries plus the header fields, with the derived views every consumer needs."""

    ops: list[Op] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    @property
    def duration_ns(self) -> int:
        return max((op.time_ns for op in self.ops), default=0)

    def client_ops(self) -> list[Op]:
        return [op for op in self.ops if not op.is_nemesis]

    def nemesis_ops(self) -> list[Op]:
        return [op for op in self.ops if op.is_nemesis]

    def completed(self) -> list[Completed]:
        return pair_ops(self.ops)

    def fault_windows(self) -> list[FaultWindow]:
        return fault_windows(self.ops)


def pair_ops(ops: Iterable[Op]) -> list[Completed]:
    """Join each invoke with its process's next completion; dangling invokes become info."""
    pending: dict[Process, Op] = {}
    out: list[Completed] = []
    for op in ops:
        if op.is_nemesis:
            continue
        if op.type == INVOKE:
            stale = pending.pop(op.process, None)
            if stale is not None:
                # A process never has two operations in flight; an invoke over an open one
                # means the harness lost the completion, so the first one's outcome is unknown.
                out.append(_dangling(stale))
            pending[op.process] = op
            continue
        inv = pending.pop(op.process, None)
        if inv is None:
            continue  # completion without an invoke: nothing to time it against
        out.append(
            Completed(op.process, inv.f, op.type, inv.time_ns, op.time_ns, inv.index, op.index)
        )
    out.extend(_dangling(inv) for inv in pending.values())
    out.sort(key=lambda c: c.invoke_index)
    return out


def _dangling(inv: Op) -> Completed:
    return Completed(inv.process, inv.f, INFO, inv.time_ns, None, inv.index, None)


def fault_windows(ops: Iterable[Op]) -> list[FaultWindow]:
    """Fault windows from nemesis start/stop events.

    A stop closes the open windows of its kind whose targets it names, or all open windows
    of its kind when it names no targets (a "heal everything"). Failed events are ignored:
    the fault never took effect.
    """
    open_windows: list[FaultWindow] = []
    closed: list[FaultWindow] = []
    end_ns = 0
    for op in ops:
        end_ns = max(end_ns, op.time_ns)
        if not op.is_nemesis or op.type == FAIL:
            continue
        value = op.value if isinstance(op.value, dict) else {}
        kind = str(value.get("kind", "fault"))
        targets = [str(t) for t in value.get("targets") or []]
        if op.f == FAULT_START:
            open_windows.append(FaultWindow(kind, targets, op.time_ns, op.time_ns, True))
        elif op.f == FAULT_STOP:
            still_open = []
            for w in open_windows:
                if w.kind == kind and (not targets or set(w.targets) <= set(targets)):
                    w.stop_ns = op.time_ns
                    closed.append(w)
                else:
                    still_open.append(w)
            open_windows = still_open
    for w in open_windows:
        w.stop_ns = end_ns
        w.healed = False
        closed.append(w)
    closed.sort(key=lambda w: w.start_ns)
    return closed


# -- reading and writing history.jsonl ---------------------------------------------------------


def header(meta: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"schema": SCHEMA_NAME, "version": SCHEMA_VERSION, **(meta or {})}


def write_history(path: Path, history: History) -> None:
    """Write a whole history (tests, re-rendering). Live runs use HistoryWriter."""
    with HistoryWriter(path, history.meta) as writer:
        for op in history.ops:
            writer.append(op)


def read_history(path: Path) -> History:
    """Read history.jsonl. A torn last line (the harness died mid-write) is dropped; any
    other bad line raises HistoryError naming the line number."""
    with open(path, encoding="utf-8") as fh:
        return parse_history(fh, str(path))


def parse_history(lines: Iterable[str], name: str = "history") -> History:
    it = iter(lines)
    first = next(it, "")
    try:
        head = json.loads(first)
    except json.JSONDecodeError as exc:
        raise HistoryError(f"{name}:1: header is not JSON: {exc}") from exc
    if not isinstance(head, dict) or head.get("schema") != SCHEMA_NAME:
        raise HistoryError(f"{name}:1: not a {SCHEMA_NAME} file (header {head!r})")
    if head.get("version") != SCHEMA_VERSION:
        raise HistoryError(
            f"{name}:1: schema version {head.get('version')!r}, this reader knows {SCHEMA_VERSION}"
        )
    meta = {k: v for k, v in head.items() if k not in ("schema", "version")}
    ops: list[Op] = []
    torn: tuple[int, str] | None = None
    for lineno, line in enumerate(it, start=2):
        if not line.strip():
            continue
        if torn is not None:
            raise HistoryError(f"{name}:{torn[0]}: bad line {torn[1]!r}")
        if len(line) > MAX_LINE_BYTES:
            raise HistoryError(f"{name}:{lineno}: line over {MAX_LINE_BYTES} bytes")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            # Only acceptable as the very last line: remember it and fail if more follow.
            torn = (lineno, line[:80])
            continue
        ops.append(Op.from_json(obj, f"{name}:{lineno}: "))
    return History(ops, meta)


class HistoryWriter:
    """Appends entries to history.jsonl, buffering up to ``flush_every_ops`` lines.

    Plain blocking file I/O: a trio harness calls ``flush`` through trio.to_thread.run_sync
    (and calls ``append`` only with ``flush_every_ops`` high enough that it never writes).
    """

    def __init__(
        self,
        path: Path,
        meta: dict[str, Any] | None = None,
        flush_every_ops: int = DEFAULT_FLUSH_EVERY_OPS,
    ) -> None:
        if flush_every_ops < 1:
            raise ValueError(f"flush_every_ops must be >= 1, got {flush_every_ops}")
        self._fh: TextIO = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._buffer: list[str] = [json.dumps(header(meta))]
        self._flush_every_ops = flush_every_ops
        self.flush()

    def append(self, op: Op) -> None:
        self._buffer.append(json.dumps(op.to_json(), separators=(",", ":")))
        if len(self._buffer) >= self._flush_every_ops:
            self.flush()

    @property
    def buffered_ops(self) -> int:
        return len(self._buffer)

    def flush(self) -> None:
        if self._buffer:
            self._fh.write("\n".join(self._buffer) + "\n")
            self._buffer.clear()
        self._fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
            self.flush()
            self._fh.close()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- recording ---------------------------------------------------------------------------------


class Recorder:
    """Builds a history as operations happen. Sans-IO: the clock is passed in, so the live
    harness gives it trio's clock and tests give it a counter.

    ``now_ns`` returns monotonic nanoseconds since the run started; ``wall_s`` Unix seconds.
    Every recorded entry is also handed to ``sink`` (e.g. HistoryWriter.append) when given.
    """

    def __init__(
        self,
        now_ns: Callable[[], int],
        wall_s: Callable[[], float] = lambda: 0.0,
        sink: Callable[[Op], None] | None = None,
    ) -> None:
        self.history = History()
        self._now_ns = now_ns
        self._wall_s = wall_s
        self._sink = sink
        self._open: dict[Process, Op] = {}

    def _record(self, op: Op) -> Op:
        self.history.ops.append(op)
        if self._sink is not None:
            self._sink(op)
        return op

    def _new(self, process: Process, type_: str, f: str, value: Any, **extra: Any) -> Op:
        return Op(
            len(self.history.ops), process, type_, f, value, self._now_ns(), self._wall_s(), **extra
        )

    def invoke(self, process: Process, f: str, value: Any = None) -> Op:
        if process in self._open:
            raise ValueError(
                f"process {process!r} invoked {f} while {self._open[process].f} is still open"
            )
        if f not in CLIENT_FS:
            raise ValueError(f"unknown client op {f!r}; expected one of {CLIENT_FS}")
        op = self._new(process, INVOKE, f, value)
        self._open[process] = op
        return self._record(op)

    def complete(
        self,
        process: Process,
        type_: str,
        value: Any = None,
        *,
        offset: int | None = None,
        error: str | None = None,
    ) -> Op:
        inv = self._open.pop(process, None)
        if inv is None:
            raise ValueError(f"process {process!r} completed an op it never invoked")
        if type_ not in COMPLETION_TYPES:
            raise ValueError(f"completion type must be one of {COMPLETION_TYPES}, got {type_!r}")
        # A send's completion repeats [key, value] so each line reads on its own.
        if value is None and inv.f in (SEND, ASSIGN):
            value = inv.value
        return self._record(self._new(process, type_, inv.f, value, offset=offset, error=error))

    def ok(self, process: Process, value: Any = None, *, offset: int | None = None) -> Op:
        return self.complete(process, OK, value, offset=offset)

    def fail(self, process: Process, value: Any = None, *, error: str | None = None) -> Op:
        return self.complete(process, FAIL, value, error=error)

    def info(self, process: Process, value: Any = None, *, error: str | None = None) -> Op:
        return self.complete(process, INFO, value, error=error)

    def fault(
        self, event: str, kind: str, targets: Iterable[str] = (), *, applied: bool = True
    ) -> Op:
        if event not in (FAULT_START, FAULT_STOP):
            raise ValueError(f"fault event must be {FAULT_START!r} or {FAULT_STOP!r}")
        value = {"kind": kind, "targets": sorted(str(t) for t in targets)}
        return self._record(self._new(NEMESIS, INFO if applied else FAIL, event, value))


class HistoryBuilder(Recorder):
    """A Recorder for tests: its clock advances ``tick_ns`` per entry, and it has one-call
    helpers for whole operations (``h.send(0, "k", 1, offset=0)``)."""

    def __init__(self, tick_ns: int = 1_000_000) -> None:
        self._t_ns = 0
        self._tick_ns = tick_ns

        def now_ns() -> int:
            self._t_ns += self._tick_ns
            return self._t_ns

        super().__init__(now_ns, lambda: self._t_ns / 1e9)

    def advance(self, ns: int) -> None:
        """Let time pass with nothing recorded (to make gaps and long latencies)."""
        self._t_ns += ns

    def send(
        self, process: Process, key: Any, value: Any, offset: int | None = None, type_: str = OK
    ) -> HistoryBuilder:
        self.invoke(process, SEND, [key, value])
        self.complete(process, type_, offset=offset if type_ == OK else None)
        return self

    def poll(
        self,
        process: Process,
        reads: dict[Any, list[tuple[int, Any]]],
        f: str = POLL,
        type_: str = OK,
    ) -> HistoryBuilder:
        self.invoke(process, f)
        value = {str(k): [[o, v] for o, v in pairs] for k, pairs in reads.items()}
        self.complete(process, type_, value if type_ == OK else None)
        return self

    def assign(
        self, process: Process, keys: Iterable[Any], seek_to_beginning: bool = False
    ) -> HistoryBuilder:
        self.invoke(
            process,
            ASSIGN,
            {"keys": [str(k) for k in keys], "seek_to_beginning": seek_to_beginning},
        )
        self.ok(process)
        return self

    def crash(self, process: Process) -> HistoryBuilder:
        self.invoke(process, CRASH)
        self.info(process, error="crashed by the workload")
        return self

    def build(self) -> History:
        return self.history
