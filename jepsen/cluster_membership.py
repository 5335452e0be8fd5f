"""The membership questions and changes of jepsen.cluster.Cluster, through raftlog's own client
(QuorumAdmin for the metadata quorum's voters, Admin for brokers and reassignments).

Every call has a deadline: a question gives up after ADMIN_TIMEOUT_S, a voter change after
VOTER_CHANGE_TIMEOUT_S. A voter change is retried while the controller refuses it for a
reason that passes (REQUEST_TIMED_OUT: an earlier change not committed yet, the leader new
in its epoch, the observer not caught up; NOT_CONTROLLER; a lost connection), and counts as
done when the answer says the goal already holds (DUPLICATE_VOTER for an add,
VOTER_NOT_FOUND for a removal): a change whose answer was lost is never made twice.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from raftlog.client.connection import ConnectionClosed, RequestTimeout
from raftlog.client.properties import ClientSecurity
from raftlog.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from raftlog.client.cluster import Cluster as ClientCluster

log = logging.getLogger(__name__)

T = TypeVar("T")

# One question (describe quorum, list reassignments, submit a move) gives up after this.
MEMBERSHIP_ADMIN_TIMEOUT_S = 10.0
# One voter change, retries included (a removed voter must catch up again before it is
# added back; a new leader must commit in its epoch first).
VOTER_CHANGE_TIMEOUT_S = 30.0
# What the controller may take to commit one change (AddRaftVoter's TimeoutMs).
VOTER_CHANGE_REQUEST_TIMEOUT_MS = 10_000
# Pace of voter-change retries (each retry asks again; it does not wait for state).
VOTER_CHANGE_RETRY_S = 0.5
# The listener name of voters' endpoints (raftlog.metadata.raft.voters.RAFT_LISTENER_NAME).
CONTROLLER_LISTENER = "CONTROLLER"
RETRIED_VOTER_ERRORS = frozenset({ErrorCode.request_timed_out, ErrorCode.not_controller})


class MembershipOps:
    """Mixed into jepsen.cluster.Cluster, which provides what is declared here."""

    opts: Any
    nodes: dict[str, Any]

    @property
    def client_security(self) -> ClientSecurity:
        raise NotImplementedError

    def name_of(self, node_id: int) -> str | None:
        raise NotImplementedError

    def _live_bootstrap(self) -> str:
        raise NotImplementedError

    def _internal_port(self) -> int:
        raise NotImplementedError

    def is_running(self, name: str) -> bool:
        node = self.nodes.get(name)
        return node is not None and bool(node.running)

    async def _with_client(
        self, ask: Callable[[ClientCluster], Awaitable[T]], timeout_s: float
    ) -> T:
        from raftlog.client.cluster import open_cluster

        with trio.fail_after(timeout_s):
            async with open_cluster(
                self._live_bootstrap(), client_id="jepsen-membership", security=self.client_security
            ) as client:
                return await ask(client)

    def _names(self, ids: Sequence[int]) -> list[str]:
        names = [self.name_of(int(i)) for i in ids]
        unknown = [i for i, n in zip(ids, names, strict=True) if n is None]
        if unknown:
            raise RuntimeError(f"node ids {unknown} are not nodes of this run")
        return [n for n in names if n is not None]

    # ------------------------------------------------------------------ voters
    async def voters(self) -> list[str]:
        """The metadata quorum's voters, as its leader says."""
        from raftlog.client.quorum import QuorumAdmin

        async def ask(client: ClientCluster) -> list[str]:
            quorum = await QuorumAdmin(client).describe_quorum()
            return self._names([v.replica_id for v in quorum.voters])

        return await self._with_client(ask, MEMBERSHIP_ADMIN_TIMEOUT_S)

    async def add_voter(self, name: str) -> None:
        """AddRaftVoter for the node's internal listener; returns once committed."""
        node = self.nodes[name]
        endpoint = (CONTROLLER_LISTENER, node.address, self._internal_port())

        async def change(admin: Any) -> None:
            await admin.add_voter(node.node_id, [endpoint])

        await self._voter_change(f"add voter {name}", change, ErrorCode.duplicate_voter)

    async def remove_voter(self, name: str) -> None:
        """RemoveRaftVoter; returns once committed."""
        node_id = self.nodes[name].node_id

        async def change(admin: Any) -> None:
            await admin.remove_voter(node_id)

        await self._voter_change(f"remove voter {name}", change, ErrorCode.voter_not_found)

    async def _voter_change(
        self, what: str, change: Callable[[Any], Awaitable[None]], already: ErrorCode
    ) -> None:
        from raftlog.client.quorum import QuorumAdmin

        async def attempt(client: ClientCluster) -> None:
            await change(QuorumAdmin(client, timeout_ms=VOTER_CHANGE_REQUEST_TIMEOUT_MS))

        last: Exception | None = None
        with trio.move_on_after(VOTER_CHANGE_TIMEOUT_S):
            while True:
                try:
                    await self._with_client(attempt, VOTER_CHANGE_REQUEST_TIMEOUT_MS / 1000 + 5)
                    log.info("membership: %s committed", what)
                    return
                except KafkaError as exc:
                    if exc.code == already:
                        log.info("membership: %s: already so (%s)", what, exc.code.name)
                        return
                    if exc.code not in RETRIED_VOTER_ERRORS:
                        raise
                    last = exc
                except (OSError, ConnectionClosed, RequestTimeout, trio.TooSlowError) as exc:
                    last = exc  # no broker reachable yet, or the answer was lost
                log.info("membership: %s: %r (retrying)", what, last)
                await trio.sleep(VOTER_CHANGE_RETRY_S)
        raise TimeoutError(f"{what}: not done after {VOTER_CHANGE_TIMEOUT_S} s: {last!r}")

    # ------------------------------------------------------------------ brokers and moves
    async def brokers(self) -> list[str]:
        """The brokers DescribeCluster lists (registered and not fenced)."""
        from raftlog.client.admin import Admin

        async def ask(client: ClientCluster) -> list[str]:
            described = await Admin(client).describe_cluster()
            return self._names(sorted(described.brokers))

        return await self._with_client(ask, MEMBERSHIP_ADMIN_TIMEOUT_S)

    async def reassign(self, moves: Mapping[int, Sequence[str] | None]) -> None:
        """AlterPartitionReassignments of the run's topic: new replicas, or None to cancel
        (cancelling what is no longer in progress is fine)."""
        from raftlog.client.admin import Admin

        topic = self.opts.topic
        plan = {
            (topic, p): None if names is None else [self.nodes[n].node_id for n in names]
            for p, names in moves.items()
        }

        async def ask(client: ClientCluster) -> None:
            results = await Admin(client).alter_partition_reassignments(plan)
            for r in results:
                if r.error not in (ErrorCode.none, ErrorCode.no_reassignment_in_progress):
                    raise KafkaError(r.error, f"reassign {r.topic}-{r.partition}: {r.message}")

        await self._with_client(ask, MEMBERSHIP_ADMIN_TIMEOUT_S)

    async def reassigning(self) -> set[int]:
        """Partitions of the run's topic with a reassignment in progress."""
        from raftlog.client.admin import Admin

        topic = self.opts.topic
        partitions = [(topic, p) for p in range(self.opts.partitions)]

        async def ask(client: ClientCluster) -> set[int]:
            ongoing = await Admin(client).list_partition_reassignments(partitions)
            return {p for (t, p) in ongoing if t == topic}

        return await self._with_client(ask, MEMBERSHIP_ADMIN_TIMEOUT_S)
