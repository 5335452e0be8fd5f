"""Drive a pure GroupCoordinator by hand: an in-memory offsets log, tokens, collected replies."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raftlog.errors import ErrorCode
from raftlog.groups.coordinator import Append, Effects, GroupCoordinator
from raftlog.groups.messages import JoinGroupRequest
from raftlog.groups.offsets_format import LogEntry, TxnEnd, TxnRecord
from raftlog.groups.settings import GroupConfig

CONSUMER = "consumer"
SESSION_MS = 10_000
REBALANCE_MS = 30_000


def join_req(group_id: str, member_id: str = "", **overrides: Any) -> JoinGroupRequest:
    values: dict[str, Any] = {
        "group_id": group_id,
        "member_id": member_id,
        "protocol_type": CONSUMER,
        "protocols": (("range", b"sub-range"), ("roundrobin", b"sub-rr")),
        "session_timeout_ms": SESSION_MS,
        "rebalance_timeout_ms": REBALANCE_MS,
        "client_id": "client",
        "client_host": "/127.0.0.1",
    }
    values.update(overrides)
    return JoinGroupRequest(**values)


@dataclass
class Harness:
    """Owns every offsets partition; appends complete when `flush()` is called."""

    config: GroupConfig = field(default_factory=lambda: GroupConfig(offsets_topic_num_partitions=3))
    now_ms: int = 1_000
    auto_flush: bool = True

    def __post_init__(self) -> None:
        counter = iter(range(1, 1_000_000))
        self.coord = GroupCoordinator(self.config, new_uuid=lambda: f"u{next(counter)}")
        self.log: dict[int, list[LogEntry]] = {}
        self.replies: dict[int, Any] = {}
        self.queued: list[Append] = []
        self._token = 0
        for partition in range(self.config.offsets_topic_num_partitions):
            self.coord.begin_load(partition, self.now_ms)
            self.coord.complete_load(partition, [], self.now_ms)

    def token(self) -> int:
        self._token += 1
        return self._token

    def apply(self, fx: Effects) -> None:
        for token, response in fx.replies:
            assert token not in self.replies, f"token {token} answered twice"
            self.replies[token] = response
        self.queued.extend(fx.appends)
        if self.auto_flush:
            self.flush()

    def flush(self, code: ErrorCode = ErrorCode.none) -> None:
        while self.queued:
            append = self.queued.pop(0)
            if code is ErrorCode.none:
                entries = self.log.setdefault(append.partition, [])
                if append.txn is None:
                    entries.extend(append.records)
                else:
                    pid = append.txn.producer_id
                    entries.extend(TxnRecord(pid, k, v) for k, v in append.records)
            self.apply(self.coord.on_append_done(append.append_id, code, self.now_ms))

    def marker(self, partition: int, producer_id: int, commit: bool) -> None:
        """The transaction driver's part: a COMMIT/ABORT marker lands on `partition`."""
        self.log.setdefault(partition, []).append(TxnEnd(producer_id, commit))
        self.coord.complete_transaction(partition, producer_id, commit, self.now_ms)

    def call(self, method: str, *args: Any) -> int:
        token = self.token()
        self.apply(getattr(self.coord, method)(token, *args, self.now_ms))
        return token

    def advance(self, ms: int) -> None:
        """Move time forward in steps, firing every deadline on the way like the shell."""
        end = self.now_ms + ms
        while True:
            deadline = self.coord.next_deadline_ms()
            if deadline is None or deadline > end:
                break
            self.now_ms = max(self.now_ms, deadline)
            self.apply(self.coord.tick(self.now_ms))
            after = self.coord.next_deadline_ms()
            assert after is None or after > self.now_ms, (
                "tick left an expired deadline: "
                + repr(
                    [
                        (
                            g.group_id,
                            g.state,
                            g.join_deadline_ms,
                            g.sync_deadline_ms,
                            g.pending_members,
                            {
                                m: (x.last_heartbeat_ms, x.join_token, x.sync_token)
                                for m, x in g.members.items()
                            },
                        )
                        for g in self.coord._groups.values()
                        if (g.next_deadline_ms() or 1e18) <= self.now_ms
                    ]
                )
                + f" now={self.now_ms}"
            )
        self.now_ms = end
