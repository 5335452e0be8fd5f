"""What the hot paths update: counters and histograms, with Kafka's names in Prometheus style.

The naming scheme, used for every metric (docs/operations.md, "Metrics", has the table): Kafka's
JMX name `kafka.<domain>:type=<Type>,name=<Name>` becomes `raftlog_<domain>_<type>_<name>` in
snake case; a `...PerSec` meter becomes a counter ending in `_total` (take rate() of it) and a
`...TimeMs` timer a histogram in seconds. So kafka.server:type=ReplicaManager,
name=UnderReplicatedPartitions is raftlog_server_replica_manager_under_replicated_partitions.

Each node has its own CollectorRegistry (several nodes may share a process in tests). Label
children are bound once and cached, so a hot-path update is a dict lookup and an increment.
Label values a client chooses (client ids, users) or that grow with the cluster (topics) are
bounded: past `MAX_LABEL_SETS` distinct values in one family the rest share `OTHER_LABEL`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram

from raftlog.errors import ErrorCode

# Distinct label sets one family binds before further ones are lumped together.
MAX_LABEL_SETS = 1000
OTHER_LABEL = "_other"
# Raft entries proposed but not yet committed whose start time is remembered (commit latency);
# past it new proposals are not timed until some commit or a role change frees room.
MAX_TIMED_PROPOSALS = 10_000
# How deep the walk for error codes goes into a response (Produce and Fetch nest them in
# topics -> partitions) and how many it looks at, so a huge response costs a bounded walk.
ERROR_WALK_MAX_DEPTH = 3
ERROR_WALK_MAX_ITEMS = 10_000

# Request and commit latencies on loopback are sub-millisecond; acks=all produces park for a
# replication round trip; a long-poll Fetch waits up to fetch.max.wait.ms (500 ms by default).
LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


class HasOffset(Protocol):
    @property
    def offset(self) -> int: ...


class BoundedChildren:
    """label values -> the family's child, at most `max_children` of them (see the module
    docstring); lookups of bound values cost one dict access."""

    def __init__(self, family: Any, max_children: int = MAX_LABEL_SETS) -> None:
        assert max_children >= 1
        self._family = family
        self._max_children = max_children
        self._children: dict[tuple[str, ...], Any] = {}
        self._other: Any = None

    def get(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is not None:
            return child
        if len(self._children) >= self._max_children:
            if self._other is None:
                self._other = self._family.labels(*([OTHER_LABEL] * len(values)))
            return self._other
        child = self._children[values] = self._family.labels(*values)
        return child

    def __len__(self) -> int:
        return len(self._children)


def api_label(snake_name: str) -> str:
    """Kafka's request label from an API's snake-case name: list_offsets -> ListOffsets."""
    return "".join(part[:1].upper() + part[1:] for part in snake_name.split("_"))


def error_label(code: int) -> str:
    """Kafka's error label: the code's name in capitals (NOT_LEADER_OR_FOLLOWER)."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return str(code)


def response_error_codes(response: object) -> list[int]:
    """Every non-zero `error_code` in a response dict and its nested lists of dicts, as
    Kafka's RequestMetrics counts them (one per partition, topic or the top level); none
    for anything else (no response: acks=0)."""
    found: list[int] = []
    if not isinstance(response, Mapping):
        return found
    budget = ERROR_WALK_MAX_ITEMS
    stack: list[tuple[Mapping[str, Any], int]] = [(response, 0)]
    while stack and budget > 0:
        node, depth = stack.pop()
        budget -= 1
        code = node.get("error_code")
        if isinstance(code, int) and code != 0:
            found.append(code)
        if depth >= ERROR_WALK_MAX_DEPTH:
            continue
        for value in node.values():
            if isinstance(value, list | tuple):
                for item in value:
                    if isinstance(item, Mapping):
                        stack.append((item, depth + 1))
    return found


class _ApiChildren:
    __slots__ = ("label", "requests", "total_time")

    def __init__(self, label: str, requests: Any, total_time: Any) -> None:
        self.label = label
        self.requests = requests
        self.total_time = total_time


class RequestMetrics:
    """kafka.network:type=RequestMetrics per API (quota throttle time is read from the quota
    manager's sensors at scrape time: collectors.py)."""

    def __init__(self, registry: CollectorRegistry, api_name: Callable[[int], str]) -> None:
        self._api_name = api_name
        self._requests = Counter(
            "raftlog_network_request_metrics_requests",
            "Requests handled, per API (Kafka RequestsPerSec).",
            ["request"],
            registry=registry,
        )
        self._errors = Counter(
            "raftlog_network_request_metrics_errors",
            "Error codes answered, per API and error (Kafka ErrorsPerSec); a failed handler "
            "counts its code once, a response each non-zero error_code it carries.",
            ["request", "error"],
            registry=registry,
        )
        self._total_time = Histogram(
            "raftlog_network_request_metrics_total_time_seconds",
            "Time from reading a request to its response being ready, per API (Kafka "
            "TotalTimeMs; includes waits for acks and fetch long-polls).",
            ["request"],
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self._apis: dict[int, _ApiChildren] = {}
        self._error_children = BoundedChildren(self._errors)

    def _bind(self, api_key: int) -> _ApiChildren:
        label = api_label(self._api_name(api_key))
        bound = _ApiChildren(label, self._requests.labels(label), self._total_time.labels(label))
        # API keys come from a registry of the APIs this node serves: a bounded set.
        self._apis[api_key] = bound
        return bound

    def observe(self, api_key: int, seconds: float, errors: Iterable[int] = ()) -> None:
        """One request of `api_key` answered after `seconds`, with these error codes."""
        bound = self._apis.get(api_key) or self._bind(api_key)
        bound.requests.inc()
        bound.total_time.observe(seconds)
        for code in errors:
            self._error_children.get(bound.label, error_label(code)).inc()


class _TopicChildren:
    __slots__ = ("bytes_in", "bytes_out", "messages_in", "messages_out")

    def __init__(self, bytes_in: Any, messages_in: Any, bytes_out: Any, messages_out: Any):
        self.bytes_in = bytes_in
        self.messages_in = messages_in
        self.bytes_out = bytes_out
        self.messages_out = messages_out


def _log_flush_histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram(
        "raftlog_log_log_flush_stats_log_flush_time_seconds",
        "Time to make appended data durable (a group-commit fsync round, including the "
        "wait for a round already running), partition leaders and the metadata log "
        "(Kafka LogFlushRateAndTimeMs).",
        buckets=LATENCY_BUCKETS_S,
        registry=registry,
    )


class ReplicationMetrics:
    """kafka.server:type=BrokerTopicMetrics per topic, ISR changes, leader flushes."""

    def __init__(self, registry: CollectorRegistry, log_flush: Histogram | None = None) -> None:
        families = [
            Counter(
                f"raftlog_server_broker_topic_metrics_{name}",
                text,
                ["topic"],
                registry=registry,
            )
            for name, text in (
                ("bytes_in", "Bytes appended by producers as leader, per topic (BytesInPerSec)."),
                (
                    "messages_in",
                    "Records appended by producers as leader, per topic (MessagesInPerSec).",
                ),
                ("bytes_out", "Bytes sent to consumers, per topic (BytesOutPerSec)."),
                (
                    "messages_out",
                    "Offsets sent to consumers, per topic (raftlog; Kafka has no such meter).",
                ),
            )
        ]
        self._families = families
        self._topics: dict[str, _TopicChildren] = {}
        self.isr_shrinks = Counter(
            "raftlog_server_replica_manager_isr_shrinks",
            "ISR shrinks this broker made as leader (IsrShrinksPerSec).",
            registry=registry,
        )
        self.isr_expands = Counter(
            "raftlog_server_replica_manager_isr_expands",
            "ISR expansions this broker made as leader (IsrExpandsPerSec).",
            registry=registry,
        )
        self.log_flush = log_flush if log_flush is not None else _log_flush_histogram(registry)

    @classmethod
    def detached(cls) -> ReplicationMetrics:
        """Instruments nobody scrapes: the default until a node wires its registry in."""
        return cls(CollectorRegistry(auto_describe=False))

    def _topic(self, topic: str) -> _TopicChildren:
        bound = self._topics.get(topic)
        if bound is None:
            label = topic if len(self._topics) < MAX_LABEL_SETS else OTHER_LABEL
            bound = _TopicChildren(*(family.labels(label) for family in self._families))
            if label != OTHER_LABEL:
                self._topics[topic] = bound
        return bound

    def produced(self, topic: str, size_bytes: int, records: int) -> None:
        bound = self._topic(topic)
        bound.bytes_in.inc(size_bytes)
        bound.messages_in.inc(records)

    def fetched(self, topic: str, size_bytes: int, records: int) -> None:
        bound = self._topic(topic)
        bound.bytes_out.inc(size_bytes)
        bound.messages_out.inc(records)

    def forget_topic(self, topic: str) -> None:
        """A deleted topic's series stop being exported (its label would live for ever)."""
        if self._topics.pop(topic, None) is not None:
            for family in self._families:
                family.remove(topic)

    def isr_changed(self, old_isr: Iterable[int], new_isr: Iterable[int]) -> None:
        """An AlterPartition this leader sent was accepted: count a shrink, an expansion, or
        both (one replica swapped for another)."""
        old, new = set(old_isr), set(new_isr)
        if old - new:
            self.isr_shrinks.inc()
        if new - old:
            self.isr_expands.inc()


class RaftMetrics:
    """kafka.server:type=raft-metrics: commit latency and leader changes (the epoch, leader
    and high watermark are read from the Raft core at scrape time, collectors.py)."""

    def __init__(self, registry: CollectorRegistry, log_flush: Histogram | None = None) -> None:
        self.commit_latency = Histogram(
            "raftlog_server_raft_metrics_commit_latency_seconds",
            "Time from a metadata entry's append on the leader to its commit (Kafka "
            "commit-latency-avg/max).",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.leader_changes = Counter(
            "raftlog_server_raft_metrics_leader_changes",
            "Times this node saw the metadata quorum's leader change to a known leader.",
            registry=registry,
        )
        self.log_flush = log_flush if log_flush is not None else _log_flush_histogram(registry)
        self._proposed_at_ms: dict[int, int] = {}
        self._leader_id: int | None = None

    @classmethod
    def detached(cls) -> RaftMetrics:
        return cls(CollectorRegistry(auto_describe=False))

    def proposed(self, offset: int, now_ms: int) -> None:
        if len(self._proposed_at_ms) < MAX_TIMED_PROPOSALS:
            self._proposed_at_ms[offset] = now_ms

    def committed(self, entries: Iterable[HasOffset], now_ms: int) -> None:
        if not self._proposed_at_ms:
            return  # a follower, or nothing timed: no cost per entry
        for entry in entries:
            started_ms = self._proposed_at_ms.pop(entry.offset, None)
            if started_ms is not None:
                self.commit_latency.observe(max(0, now_ms - started_ms) / 1000)

    def role_changed(self, leader_id: int | None) -> None:
        # Entries proposed in an earlier term commit (if at all) under another leader: their
        # times would measure the election, not a commit.
        self._proposed_at_ms.clear()
        if leader_id is not None and leader_id != self._leader_id:
            self.leader_changes.inc()
        self._leader_id = leader_id


class NodeMetrics:
    """One node's registry and the instruments its hot paths update."""

    def __init__(self, api_name: Callable[[int], str]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        log_flush = _log_flush_histogram(self.registry)
        self.requests = RequestMetrics(self.registry, api_name)
        self.replication = ReplicationMetrics(self.registry, log_flush)
        self.raft = RaftMetrics(self.registry, log_flush)
