"""Drive a pure TxnCoordinator by hand: an in-memory `__transaction_state` log, partitions
that record the markers they were sent, tokens and collected replies."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raftlog.errors import ErrorCode
from raftlog.txn import log_format as fmt
from raftlog.txn.coordinator import TxnCoordinator
from raftlog.txn.effects import Append, Effects, WriteMarkers
from raftlog.txn.messages import (
    AddOffsetsToTxnRequest,
    AddPartitionsTxn,
    AddPartitionsTxnResult,
    EndTxnRequest,
    EndTxnResult,
    InitProducerIdRequest,
    InitProducerIdResult,
)
from raftlog.txn.settings import TxnConfig

TIMEOUT_MS = 60_000
START_MS = 1_000_000


def txn_id_on(partition: int, config: TxnConfig, prefix: str = "tx") -> str:
    """A transactional id that `config` routes to `partition`."""
    for n in range(100_000):
        candidate = f"{prefix}-{n}"
        if config.partition_for(candidate) == partition:
            return candidate
    raise AssertionError("no id found")


@dataclass
class Harness:
    """One `__transaction_state` partition (0) and its coordinator.

    With auto=True every append succeeds and every marker is written as soon as a request's
    effects come back; otherwise they queue until `flush_appends` / `write_markers`.
    """

    config: TxnConfig = field(
        default_factory=lambda: TxnConfig(transaction_state_log_num_partitions=1)
    )
    auto: bool = True
    now_ms: int = START_MS
    coordinator_epoch: int = 0

    def __post_init__(self) -> None:
        self.log: list[fmt.Record] = []
        self.replies: dict[Any, Any] = {}
        self.appends: list[Append] = []
        self.markers: list[WriteMarkers] = []
        # Every marker a partition acknowledged: (partition, producer id, epoch, commit).
        self.written: list[tuple[fmt.TopicPartition, int, int, bool]] = []
        self._token = 0
        self._next_pid = 1000
        self.allocator_dry = False
        self.coord = self._new_coordinator()
        self.apply(self.coord.load([], self.now_ms))

    def _allocate(self) -> int | None:
        if self.allocator_dry:
            return None
        self._next_pid += 1
        return self._next_pid

    def _new_coordinator(self) -> TxnCoordinator:
        return TxnCoordinator(0, self.coordinator_epoch, self.config, self._allocate)

    # ------------------------------------------------------------------ effects
    def apply(self, fx: Effects) -> None:
        for token, response in fx.replies:
            assert token not in self.replies, f"token {token} answered twice"
            self.replies[token] = response
        self.appends.extend(fx.appends)
        self.markers.extend(fx.markers)
        if self.auto:
            self.settle()

    def settle(self) -> None:
        while self.appends or self.markers:
            self.flush_appends()
            self.write_markers()

    def flush_appends(self, code: ErrorCode = ErrorCode.none) -> None:
        appends, self.appends = self.appends, []
        auto, self.auto = self.auto, False
        try:
            for append in appends:
                if code is ErrorCode.none:
                    self.log.extend(append.records)
                self.apply(self.coord.on_append_done(append.append_id, code, self.now_ms))
        finally:
            self.auto = auto

    def write_markers(
        self, code: ErrorCode = ErrorCode.none, failing: frozenset[fmt.TopicPartition] = frozenset()
    ) -> None:
        """Answer every queued marker write: `code` for the partitions in `failing` (all of
        them when `failing` is empty and code is an error), NONE for the rest."""
        markers, self.markers = self.markers, []
        auto, self.auto = self.auto, False
        try:
            for marker in markers:
                results = {}
                for partition in marker.partitions:
                    fails = code is not ErrorCode.none and (not failing or partition in failing)
                    results[partition] = code if fails else ErrorCode.none
                    if not fails:
                        self.written.append(
                            (partition, marker.producer_id, marker.producer_epoch, marker.commit)
                        )
                self.apply(self.coord.on_markers_done(marker.marker_id, results, self.now_ms))
        finally:
            self.auto = auto

    def tick(self, advance_ms: int = 0) -> None:
        self.now_ms += advance_ms
        self.apply(self.coord.tick(self.now_ms))

    def failover(self) -> None:
        """The partition's leadership moves and comes back: a new coordinator (a higher
        coordinator epoch) loads the log as it is now."""
        self.apply(self.coord.resign(self.now_ms))
        self.appends.clear()
        self.markers.clear()
        self.coordinator_epoch += 1
        self.coord = self._new_coordinator()
        self.apply(self.coord.load(list(self.log), self.now_ms))

    # ------------------------------------------------------------------ requests
    def call(self, method: str, *args: Any) -> int:
        self._token += 1
        token = self._token
        self.apply(getattr(self.coord, method)(token, *args, self.now_ms))
        return token

    def reply(self, token: int) -> Any:
        return self.replies.get(token)

    def init(
        self,
        txn_id: str,
        timeout_ms: int = TIMEOUT_MS,
        producer_id: int = -1,
        producer_epoch: int = -1,
        api_version: int = 5,
    ) -> InitProducerIdResult | None:
        req = InitProducerIdRequest(txn_id, timeout_ms, producer_id, producer_epoch, api_version)
        result: InitProducerIdResult | None = self.reply(self.call("init_producer_id", req))
        return result

    def add(
        self,
        txn_id: str,
        pid: int,
        epoch: int,
        *partitions: fmt.TopicPartition,
        verify_only: bool = False,
        api_version: int = 3,
    ) -> ErrorCode | None:
        """AddPartitionsToTxn of one transaction; its single error code (all partitions
        share it) or None while unanswered."""
        req = AddPartitionsTxn(txn_id, pid, epoch, tuple(partitions), verify_only, api_version)
        results: list[AddPartitionsTxnResult] | None = self.reply(
            self.call("add_partitions_to_txn", [req])
        )
        if results is None:
            return None
        codes = set(results[0].errors.values())
        assert len(codes) == 1, results
        return codes.pop()

    def add_offsets(self, txn_id: str, pid: int, epoch: int, group_id: str) -> ErrorCode | None:
        req = AddOffsetsToTxnRequest(txn_id, pid, epoch, group_id)
        code: ErrorCode | None = self.reply(self.call("add_offsets_to_txn", req))
        return code

    def end(
        self, txn_id: str, pid: int, epoch: int, commit: bool, api_version: int = 3
    ) -> ErrorCode | None:
        result: EndTxnResult | None = self.reply(
            self.call("end_txn", EndTxnRequest(txn_id, pid, epoch, commit, api_version))
        )
        return None if result is None else result.error_code

    def state_of(self, txn_id: str) -> fmt.TransactionState:
        return self.coord.transactions[txn_id].state

    def stored(self) -> dict[str, fmt.TransactionLogValue]:
        return fmt.replay(self.log)
