"""History entries of the transactional workload (``--workload txn``), after Jepsen's Kafka
``:txn`` operations. Same file format and entry types as the queue workload (jepsen.history);
what is new is one client op, ``txn``, and its micro-operations:

- ``txn`` invoke value ``{"mops": [["poll"], ["send", key, value], ...], "commit": bool}``:
  an optional poll of the process's read_committed consumer first, then sends, then
  ``commit_transaction`` (``commit`` true) or ``abort_transaction`` on purpose (false). A
  transaction that polled also sends its consumer's positions to the transaction
  (``send_offsets_to_transaction``), so its group's offsets commit or abort with it.
- the completion's value has the same shape with what happened: ``["poll", {key: [[offset,
  value], ...]}]`` and ``["send", key, value, offset]`` (offset from the delivery report, or
  null) for every send handed to the client. Types: ``ok`` committed; ``fail`` definitely
  not committed (aborted on purpose, or ``commit_transaction`` was never reached, or the
  abort after an abortable error succeeded); ``info`` unknown (commit attempted, outcome
  not known).
- ``init`` (init_transactions of a new producer) ok / info, for the record.

Pollers use the queue workload's ``poll``, ``final-poll``, ``assign`` and ``crash`` entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jepsen.history import (
    ASSIGN,
    CLIENT_FS,
    CRASH,
    FINAL_POLL,
    INVOKE,
    OK,
    POLL,
    HistoryBuilder,
    Op,
    Process,
    Recorder,
)

TXN, INIT = "txn", "init"
TXN_FS = (*CLIENT_FS, TXN, INIT)
WORKLOAD_NAME = "txn"

__all__ = [
    "ASSIGN",
    "CRASH",
    "FINAL_POLL",
    "INIT",
    "POLL",
    "TXN",
    "TXN_FS",
    "WORKLOAD_NAME",
    "TxnHistoryBuilder",
    "TxnRecorder",
]


class TxnRecorder(Recorder):
    """A Recorder that also accepts the transactional workload's ops."""

    def invoke(self, process: Process, f: str, value: Any = None) -> Op:
        if f not in TXN_FS:
            raise ValueError(f"unknown client op {f!r}; expected one of {TXN_FS}")
        if process in self._open:
            raise ValueError(
                f"process {process!r} invoked {f} while {self._open[process].f} is still open"
            )
        op = self._new(process, INVOKE, f, value)
        self._open[process] = op
        return self._record(op)


class TxnHistoryBuilder(TxnRecorder, HistoryBuilder):
    """HistoryBuilder for transactional histories (tests): ``h.txn(0, sends=[(0, 1, 5)])``."""

    def txn(
        self,
        process: Process,
        sends: Sequence[tuple[int, int, int | None]] = (),
        reads: dict[int, list[tuple[int, int]]] | None = None,
        type_: str = OK,
        commit: bool = True,
        complete: bool = True,
    ) -> TxnHistoryBuilder:
        """One transaction: (key, value, offset) sends, an optional poll's reads."""
        inv: list[list[Any]] = [["poll"]] if reads is not None else []
        inv += [["send", k, v] for k, v, _ in sends]
        self.invoke(process, TXN, {"mops": inv, "commit": commit})
        if not complete:
            return self
        done: list[list[Any]] = []
        if reads is not None:
            done.append(["poll", {str(k): [[o, v] for o, v in rs] for k, rs in reads.items()}])
        done += [["send", k, v, o] for k, v, o in sends]
        self.complete(process, type_, {"mops": done, "commit": commit})
        return self
