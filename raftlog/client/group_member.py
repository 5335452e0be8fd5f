"""A member of a classic consumer group: join, get partitions, heartbeat, commit, leave.

    member = GroupMember(cluster, "billing", ["orders"], listener)
    async with member.joined():          # returns once the first assignment is in
        ...                              # member.assignment, await member.commit({...})

The protocol is Kafka's classic one, as its Java consumer runs it with the eager "range"
assignor: FindCoordinator, JoinGroup (v4+: a first JoinGroup without a member id is answered
MEMBER_ID_REQUIRED with the id to use, KIP-394), the leader computes every member's
partitions from the subscriptions in its JoinGroup answer (consumer_protocol.range_assign),
SyncGroup hands each member its share, then Heartbeat every heartbeat interval. A heartbeat
that says the group moved on starts a rejoin; before it, the listener is told its partitions
are revoked so it can commit what it consumed — while the generation still allows that
(REBALANCE_IN_PROGRESS, a coordinator move), not after ILLEGAL_GENERATION or
UNKNOWN_MEMBER_ID, where the coordinator would refuse the commit anyway.

Group requests travel on a connection of the member's own to the coordinator (as Kafka's
clients do): the broker answers a connection's requests in order, and a JoinGroup parked for
a rebalance must not hold up fetches queued behind it. JoinGroup and SyncGroup get the
rebalance timeout plus slack as their request timeout; every other call its own bound.

Structured concurrency: `joined()` owns a nursery holding the run task (join, heartbeat,
rejoin) and the coordinator connection. Leaving runs shielded, under its own deadline, on a
fresh connection opened inside the shield — whatever cancelled the member (Ctrl-C, a
deadline) has cancelled the nursery's connection too. Rejoining is bounded
(`max_join_attempts`); a member that cannot get back into its group fails with
GroupMemberError instead of retrying forever.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio

from raftlog.client.cluster import Cluster, raise_for
from raftlog.client.connection import (
    BrokerConnection,
    ConnectionClosed,
    RequestTimeout,
    UnsupportedVersion,
    open_connection,
    serve_connection,
)
from raftlog.client.consumer_protocol import (
    CONSUMER_PROTOCOL_TYPE,
    RANGE_ASSIGNOR,
    ConsumerProtocolError,
    GroupMemberMetadata,
    Subscription,
    TopicPartition,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    range_assign,
)
from raftlog.client.groups import (
    COORDINATOR_RETRIABLE,
    GroupAdmin,
    call,
    offset_commit_values,
    raise_for_commit,
)
from raftlog.client.member_state import (
    GENERATION_LOST_CODES,
    LEAVE_REASON,
    REJOIN_CODES,
    CommitFailed,
    Generation,
    GroupMemberError,
    MemberConfig,
    Outcome,
    RebalanceListener,
    commit_allowed_after,
    heartbeat_outcome,
)
from raftlog.client.protocol import error_of
from raftlog.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

# Failures that mean "the coordinator is unreachable right now": find it again and retry.
_TRANSPORT_ERRORS = (ConnectionClosed, RequestTimeout, OSError)


class GroupMember:
    """One member of `group_id` subscribed to `topics`; run it with `async with joined()`."""

    def __init__(
        self,
        cluster: Cluster,
        group_id: str,
        topics: Sequence[str],
        listener: RebalanceListener,
        config: MemberConfig | None = None,
    ) -> None:
        if not group_id:
            raise ValueError("group_id must not be empty")
        if not topics:
            raise ValueError("a member must subscribe to at least one topic")
        self.cluster = cluster
        self.group_id = group_id
        self.topics = tuple(dict.fromkeys(topics))
        self.listener = listener
        self.config = config or MemberConfig()
        self.member_id = ""
        self.coordinator_id = -1
        # The current generation; None while (re)joining.
        self.generation: Generation | None = None
        # Generations this member has completed a SyncGroup in (observability for tests/logs).
        self.generations_joined = 0
        self._groups = GroupAdmin(cluster)
        self._nursery: trio.Nursery | None = None
        self._connection: BrokerConnection | None = None
        self._coordinator_address: tuple[str, int] | None = None
        # Partitions handed to the listener and not yet revoked.
        self._owned: frozenset[TopicPartition] = frozenset()
        self._commit_allowed = False
        self._commit_lock = trio.Lock()
        self._run_scope = trio.CancelScope()
        self._run_done = trio.Event()
        self._closing = False

    # ------------------------------------------------------------------ public
    @property
    def assignment(self) -> frozenset[TopicPartition]:
        return self._owned

    @property
    def stable(self) -> bool:
        """In a generation whose commits the coordinator accepts (as far as it knows)."""
        return self.generation is not None and self._commit_allowed

    @asynccontextmanager
    async def joined(self) -> AsyncIterator[GroupMember]:
        """Join (returns after the first assignment), keep the membership, leave on exit."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                await nursery.start(self._run)
                yield self
            finally:
                await self._close()
                nursery.cancel_scope.cancel()

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit offsets (next offset to read, per partition) as this generation's member.

        CommitFailed when the group has moved on; KafkaError/ConnectionClosed when the
        coordinator stays unreachable through the bounded retries.
        """
        if not offsets:
            return
        async with self._commit_lock:
            generation = self.generation
            if generation is None or not self._commit_allowed:
                raise CommitFailed(
                    ErrorCode.rebalance_in_progress,
                    f"group {self.group_id!r} is rebalancing; nothing committed",
                )
            values = offset_commit_values(
                self.group_id,
                dict(offsets),
                generation_id=generation.generation_id,
                member_id=generation.member_id,
                group_instance_id=self.config.group_instance_id,
            )
            attempt = 0
            while True:
                try:
                    connection = await self._coordinator_connection()
                    response = await call(connection, "offset_commit", values)
                    raise_for_commit(response, self.group_id)
                    return
                except KafkaError as exc:
                    if exc.code in GENERATION_LOST_CODES:
                        raise CommitFailed(exc.code, exc.message) from exc
                    if exc.code not in COORDINATOR_RETRIABLE or attempt >= self._max_retries:
                        raise
                    await self._drop_coordinator()
                except _TRANSPORT_ERRORS:
                    if attempt >= self._max_retries:
                        raise
                    await self._drop_coordinator()
                attempt += 1
                await self._backoff(attempt)

    # ------------------------------------------------------------------ the run task
    async def _run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        try:
            with self._run_scope:
                while True:
                    generation = await self._join_and_sync()
                    self._owned = generation.assignment
                    await self.listener.on_partitions_assigned(generation.assignment)
                    if not started:
                        started = True
                        task_status.started()
                    outcome = await self._heartbeat_until_rejoin(generation)
                    await self._revoke(outcome)
        finally:
            self._run_done.set()

    async def _heartbeat_until_rejoin(self, generation: Generation) -> Outcome:
        interval_s = self.config.heartbeat_interval_ms / 1000
        while True:
            # The heartbeat period, not a wait for state.
            await trio.sleep(interval_s)
            try:
                connection = await self._coordinator_connection()
                response = await call(
                    connection,
                    "heartbeat",
                    {
                        "group_id": self.group_id,
                        "generation_id": generation.generation_id,
                        "member_id": generation.member_id,
                        "group_instance_id": self.config.group_instance_id,
                    },
                    timeout_ms=self.config.session_timeout_ms,
                )
                code = error_of(response.error_code)
            except KafkaError as exc:  # FindCoordinator itself failed
                code = exc.code
            except _TRANSPORT_ERRORS as exc:
                log.info("group %s: heartbeat failed (%s); finding the coordinator", self, exc)
                return Outcome.FIND_COORDINATOR
            outcome = heartbeat_outcome(code)
            if outcome is Outcome.OK:
                continue
            if outcome is Outcome.FATAL:
                raise GroupMemberError(
                    f"group {self.group_id!r}: heartbeat refused: {code.name.upper()}"
                )
            log.info("group %s: heartbeat answered %s; rejoining", self, code.name)
            return outcome

    async def _revoke(self, outcome: Outcome) -> None:
        self._commit_allowed = commit_allowed_after(outcome)
        if outcome is Outcome.FIND_COORDINATOR:
            await self._drop_coordinator()
        await self.listener.on_partitions_revoked(self._owned)
        self._owned = frozenset()
        self.generation = None
        self._commit_allowed = False
        if outcome is Outcome.UNKNOWN_MEMBER:
            self.member_id = ""

    # ------------------------------------------------------------------ joining
    async def _join_and_sync(self) -> Generation:
        last_error: BaseException | None = None
        attempt = 0
        while attempt < self.config.max_join_attempts:
            attempt += 1
            try:
                connection = await self._coordinator_connection()
                joined = await self._join(connection)
                generation = await self._sync(connection, joined)
                self.generation = generation
                self._commit_allowed = True
                self.generations_joined += 1
                log.info(
                    "group %s: generation %d, %s, assigned %s",
                    self,
                    generation.generation_id,
                    "leader" if generation.is_leader else "follower",
                    ",".join(f"{t}-{p}" for t, p in sorted(generation.assignment)) or "nothing",
                )
                return generation
            except KafkaError as exc:
                last_error = exc
                if exc.code == ErrorCode.unknown_member_id:
                    self.member_id = ""
                elif exc.code in COORDINATOR_RETRIABLE:
                    await self._drop_coordinator()
                elif exc.code not in REJOIN_CODES:
                    raise GroupMemberError(
                        f"cannot join group {self.group_id!r}: {exc.code.name.upper()}"
                    ) from exc
            except _TRANSPORT_ERRORS as exc:
                last_error = exc
                await self._drop_coordinator()
            log.info("group %s: join attempt %d failed: %s", self, attempt, last_error)
            await self._backoff(attempt)
        raise GroupMemberError(
            f"could not join group {self.group_id!r} in {self.config.max_join_attempts} "
            f"attempts (last error: {last_error})"
        )

    async def _join(self, connection: BrokerConnection) -> Any:
        """JoinGroup. A new member's first JoinGroup is answered MEMBER_ID_REQUIRED with the
        id to use (KIP-394); the second, with that id, is the real one."""
        response = await self._join_once(connection)
        if error_of(response.error_code) == ErrorCode.member_id_required:
            self.member_id = response.member_id
            response = await self._join_once(connection)
        raise_for(response.error_code, f"join_group {self.group_id}")
        self.member_id = response.member_id
        protocol = getattr(response, "protocol_name", None) or RANGE_ASSIGNOR
        if protocol != RANGE_ASSIGNOR:
            raise KafkaError(
                ErrorCode.inconsistent_group_protocol,
                f"the group chose assignor {protocol!r}; this member speaks {RANGE_ASSIGNOR!r}",
            )
        return response

    async def _join_once(self, connection: BrokerConnection) -> Any:
        metadata = encode_subscription(Subscription(self.topics))
        return await call(
            connection,
            "join_group",
            {
                "group_id": self.group_id,
                "session_timeout": self.config.session_timeout_ms,
                "rebalance_timeout": self.config.rebalance_timeout_ms,
                "member_id": self.member_id,
                "group_instance_id": self.config.group_instance_id,
                "protocol_type": CONSUMER_PROTOCOL_TYPE,
                "protocols": [{"name": RANGE_ASSIGNOR, "metadata": metadata}],
                "reason": None,
            },
            timeout_ms=self._parked_timeout_ms,
        )

    async def _sync(self, connection: BrokerConnection, joined: Any) -> Generation:
        generation_id = int(joined.generation_id)
        assignments: list[dict[str, Any]] = []
        if joined.leader == self.member_id:
            plan = await self._assign(joined.members)
            assignments = [
                {"member_id": member_id, "assignment": encode_assignment(partitions)}
                for member_id, partitions in sorted(plan.items())
            ]
        response = await call(
            connection,
            "sync_group",
            {
                "group_id": self.group_id,
                "generation_id": generation_id,
                "member_id": self.member_id,
                "group_instance_id": self.config.group_instance_id,
                "protocol_type": CONSUMER_PROTOCOL_TYPE,
                "protocol_name": RANGE_ASSIGNOR,
                "assignments": assignments,
            },
            timeout_ms=self._parked_timeout_ms,
        )
        raise_for(response.error_code, f"sync_group {self.group_id}")
        try:
            assignment = decode_assignment(response.assignment)
        except ConsumerProtocolError as exc:
            raise GroupMemberError(f"group {self.group_id!r}: bad assignment: {exc}") from exc
        foreign = {tp for tp in assignment if tp[0] not in self.topics}
        if foreign:
            log.warning("group %s: ignoring assigned partitions of other topics %s", self, foreign)
        return Generation(
            generation_id=generation_id,
            member_id=self.member_id,
            leader_id=joined.leader,
            protocol=RANGE_ASSIGNOR,
            assignment=assignment - foreign,
        )

    async def _assign(self, members: Sequence[Any]) -> dict[str, frozenset[TopicPartition]]:
        """The leader's job: range-assign the partitions of every subscribed topic."""
        metadata: list[GroupMemberMetadata] = []
        for m in members:
            try:
                subscription = decode_subscription(m.metadata)
            except ConsumerProtocolError as exc:
                # One member's odd metadata must not stall the group: it gets nothing.
                log.warning("group %s: member %s: %s", self, m.member_id, exc)
                subscription = Subscription(())
            metadata.append(
                GroupMemberMetadata(
                    m.member_id, getattr(m, "group_instance_id", None), subscription
                )
            )
        topics = sorted({t for m in metadata for t in m.subscription.topics})
        await self.cluster.refresh_metadata(topics)
        partitions_per_topic = {
            t: len(info.partitions)
            for t in topics
            if (info := self.cluster.topics.get(t)) is not None and info.error == ErrorCode.none
        }
        return range_assign(metadata, partitions_per_topic)

    # ------------------------------------------------------------------ coordinator
    async def _coordinator_connection(self) -> BrokerConnection:
        if self._connection is not None and not self._connection.closed:
            return self._connection
        if self._closing:
            # The close path's connection is gone; the nursery may be cancelled: no new one.
            raise ConnectionClosed(f"group {self.group_id!r}: coordinator connection lost")
        if self._nursery is None:
            raise RuntimeError("the member is not running (use `async with member.joined()`)")
        node_id, address = await self._groups.find_coordinator(self.group_id)
        self._connection = await self._nursery.start(
            partial(
                serve_connection,
                address[0],
                address[1],
                client_id=self.cluster.client_id,
                limits=self.cluster.limits.connection,
            )
        )
        self.coordinator_id, self._coordinator_address = node_id, address
        return self._connection

    async def _drop_coordinator(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.aclose()

    # ------------------------------------------------------------------ closing
    async def _close(self) -> None:
        """Stop heartbeating, revoke (the listener's last commit), LeaveGroup. Shielded and
        bounded; failures are logged, since the session timeout removes the member anyway."""
        self._run_scope.cancel()
        self._closing = True
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + self.config.close_timeout_ms / 1000
            await self._run_done.wait()
            # The nursery's coordinator connection may be cancelled with everything else.
            await self._drop_coordinator()
            if not self._owned and (not self.member_id or self.config.group_instance_id):
                return  # nothing to commit, nobody to leave
            try:
                if self._coordinator_address is None:
                    _, self._coordinator_address = await self._groups.find_coordinator(
                        self.group_id
                    )
                host, port = self._coordinator_address
                async with open_connection(
                    host,
                    port,
                    client_id=self.cluster.client_id,
                    limits=self.cluster.limits.connection,
                ) as connection:
                    self._connection = connection
                    try:
                        if self._owned:
                            await self.listener.on_partitions_revoked(self._owned)
                        self._owned = frozenset()
                        await self._leave(connection)
                    finally:
                        self._connection = None
            except (KafkaError, UnsupportedVersion, *_TRANSPORT_ERRORS) as exc:
                log.warning("group %s: leaving failed: %s", self, exc)
            finally:
                self.generation = None
                self._commit_allowed = False
        if scope.cancelled_caught:
            log.warning(
                "group %s: commit and LeaveGroup did not finish in %d ms; the coordinator "
                "removes the member when its session expires",
                self,
                self.config.close_timeout_ms,
            )

    async def _leave(self, connection: BrokerConnection) -> None:
        if not self.member_id or self.config.group_instance_id is not None:
            return
        identity = {
            "member_id": self.member_id,
            "group_instance_id": None,
            "reason": LEAVE_REASON,
        }
        response = await call(
            connection,
            "leave_group",
            {"group_id": self.group_id, "member_id": self.member_id, "members": [identity]},
        )
        codes = [error_of(response.error_code)]
        codes += [error_of(m.error_code) for m in getattr(response, "members", ()) or ()]
        # UNKNOWN_MEMBER_ID: the coordinator already dropped us, which is what leaving wants.
        bad = [c for c in codes if c not in (ErrorCode.none, ErrorCode.unknown_member_id)]
        if bad:
            raise KafkaError(bad[0], f"leave_group {self.group_id}")
        log.info("group %s: left", self)
        self.member_id = ""

    # ------------------------------------------------------------------ helpers
    @property
    def _parked_timeout_ms(self) -> int:
        return self.config.rebalance_timeout_ms + self.config.request_slack_ms

    @property
    def _max_retries(self) -> int:
        return self.config.max_join_attempts

    async def _backoff(self, attempt: int) -> None:
        backoff_ms = min(
            self.config.retry_backoff_ms * 2 ** (attempt - 1), self.config.retry_backoff_max_ms
        )
        # A back-off between attempts, not a wait for state: the next attempt re-checks.
        await trio.sleep(backoff_ms / 1000)

    def __str__(self) -> str:
        return f"{self.group_id}/{self.member_id or '?'}"


__all__ = [
    "CommitFailed",
    "Generation",
    "GroupMember",
    "GroupMemberError",
    "MemberConfig",
    "Outcome",
    "RebalanceListener",
    "commit_allowed_after",
    "heartbeat_outcome",
]
