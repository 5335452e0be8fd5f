"""The ``forge`` nemesis's rogue client: it connects to a node's internal listener (Raft,
replication, controller RPC) and sends what a node would send, with the ids and epochs an
attacker would alter: votes and leader announcements from a node that is not a voter, epochs
far ahead or past the wire's range, replica fetches and heartbeats naming another node, a
connection that changes the id it speaks for, and plain garbage.

Every message is built from the project's own declared types (a captured message, altered),
and the out-of-range ones by altering their wire form after encoding, since the codec refuses
to encode them. A forgery has done its job when the cluster goes on unharmed: the checker
judges that; the forger only counts how each node answered (closed the connection, answered
with an error, or ignored a cast).

The rogue never claims to be one of the nodes on its first frame: on a plaintext internal
listener a connection that does so is believed (the id is bound, not proved). Proving it is
what `internal_security_protocol = "SSL"` (mutual TLS with per-node certificates) adds.

Against such a cluster (a run with --secure) the rogue holds no certificate: it still sends
its frames, as plain TCP to the TLS port, and a connection the node ends without a single
msgpack answer (closed, reset, or a TLS alert) counts as "refused". An answer there would
mean the node spoke to a peer that never proved its identity.
"""

from __future__ import annotations

import logging
import random
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import trio

from raftlog.codec import EPOCH_MAX
from raftlog.metadata.controller import messages as cm
from raftlog.metadata.raft import messages as rm
from raftlog.replication.fetch_wire import (
    ReplicaFetchPartition,
    ReplicaFetchRequest,
    encode_request,
)

log = logging.getLogger(__name__)

KIND_CAST, KIND_REQUEST, KIND_RESPONSE, KIND_ERROR = 0, 1, 2, 3
LENGTH = struct.Struct(">i")
# Ids that are no node of a run's cluster: -1 is what a non-node client calls itself.
OUTSIDER_IDS = (-1, 99, 4096)
# Epochs an attacker tries: plausible ones ahead of any run's, and ones at and past the bound.
FORGED_EPOCHS = (7, 1_000, 1_000_000, EPOCH_MAX)
OUT_OF_RANGE_EPOCH = EPOCH_MAX + 11
# One forgery waits this long for the node to answer or close before it hangs up.
ANSWER_TIMEOUT_S = 0.5
CONNECT_TIMEOUT_S = 2.0
# Where a forged Raft cast says to send the answer: nowhere useful.
REPLY_HOST, REPLY_PORT = "127.0.0.1", 9
# The first byte of a TLS record that carries an alert (RFC 8446 ContentType.alert).
TLS_ALERT_RECORD = 0x15


@dataclass(frozen=True)
class Target:
    """What a forgery knows of the cluster: node ids and the run's topic."""

    node_ids: Sequence[int]
    topic: str
    partitions: int


def _frame(kind: int, correlation_id: int, sender_id: int, method: str, body: Any) -> bytes:
    payload = msgpack.packb([kind, correlation_id, sender_id, method, body], use_bin_type=True)
    return LENGTH.pack(len(payload)) + payload


def _raft_cast(
    sender_id: int, message: rm.AnyMessage, *, alter: Callable[[list[Any]], None] | None = None
) -> bytes:
    wire = rm.CODEC.to_wire(rm.RaftCast(message, REPLY_HOST, REPLY_PORT))
    if alter is not None:
        alter(wire[0])
    return _frame(KIND_CAST, 0, sender_id, "raft", wire)


def _replica_fetch(
    sender_id: int, replica_id: int, target: Target, rng: random.Random, *, fetch_offset: int = 0
) -> bytes:
    partition = ReplicaFetchPartition(
        topic=target.topic,
        partition=rng.randrange(target.partitions),
        fetch_offset=fetch_offset,
        last_fetched_epoch=-1,
        leader_epoch=rng.choice(FORGED_EPOCHS),
    )
    request = ReplicaFetchRequest(replica_id, max_wait_ms=100, min_bytes=1, partitions=(partition,))
    return _frame(KIND_REQUEST, 1, sender_id, "replica.fetch", encode_request(request))


# -- the forgeries: each returns the frames one connection sends ------------------------------


def vote_from_outsider(target: Target, rng: random.Random) -> list[bytes]:
    sender = rng.choice(OUTSIDER_IDS[1:])
    epoch = rng.choice(FORGED_EPOCHS)
    vote = rm.Vote(rng.random() < 0.5, sender, epoch, 10**12, epoch)
    return [_raft_cast(sender, vote)]


def vote_naming_a_voter(target: Target, rng: random.Random) -> list[bytes]:
    """An outsider's vote request that names a real voter as the candidate."""
    sender = rng.choice(OUTSIDER_IDS[1:])
    epoch = rng.choice(FORGED_EPOCHS)
    vote = rm.Vote(False, rng.choice(target.node_ids), epoch, 10**12, epoch)
    return [_raft_cast(sender, vote)]


def vote_past_the_epoch_bound(target: Target, rng: random.Random) -> list[bytes]:
    sender = rng.choice(OUTSIDER_IDS[1:])
    vote = rm.Vote(False, sender, 1, 0, 1)

    def alter(wire: list[Any]) -> None:
        wire[3] = OUT_OF_RANGE_EPOCH  # [TAG, pre_vote, candidate_id, candidate_epoch, ...]

    return [_raft_cast(sender, vote, alter=alter)]


def leader_announcement(target: Target, rng: random.Random) -> list[bytes]:
    """BeginQuorumEpoch from an outsider, naming a real voter as the new leader."""
    sender = rng.choice(OUTSIDER_IDS[1:])
    begin = rm.BeginQuorumEpoch(rng.choice(FORGED_EPOCHS), rng.choice(target.node_ids))
    end = rm.EndQuorumEpoch(rng.choice(FORGED_EPOCHS), rng.choice(target.node_ids), ())
    return [_raft_cast(sender, begin), _raft_cast(sender, end)]


def metadata_fetch_for_a_voter(target: Target, rng: random.Random) -> list[bytes]:
    """A Raft Fetch acknowledging far more than exists, for a real voter, from an outsider."""
    sender = rng.choice(OUTSIDER_IDS[1:])
    fetch = rm.Fetch(rng.choice(target.node_ids), rng.choice(FORGED_EPOCHS), 10**12, 1, 100)
    return [_raft_cast(sender, fetch)]


def replica_fetch_for_another(target: Target, rng: random.Random) -> list[bytes]:
    """replica.fetch naming a real replica, acknowledging everything, from a non-node."""
    return [
        _replica_fetch(-1, rng.choice(target.node_ids), target, rng, fetch_offset=10**12),
        _replica_fetch(-1, rng.choice(target.node_ids), target, rng),
    ]


def shutdown_heartbeat(target: Target, rng: random.Random) -> list[bytes]:
    """A BrokerHeartbeat asking that a real broker be fenced and shut down."""
    broker_id = rng.choice(target.node_ids)
    heartbeat = cm.BrokerHeartbeat(broker_id, rng.randrange(1, 10**6), 0, True, True)
    body = cm.CODEC.encode(heartbeat, cm.ControllerRequest)
    return [_frame(KIND_REQUEST, 1, -1, "controller", body)]


def identity_switch(target: Target, rng: random.Random) -> list[bytes]:
    """A connection that first speaks as an outsider, then as a real node."""
    outsider = rng.choice(OUTSIDER_IDS[1:])
    node_id = rng.choice(target.node_ids)
    return [
        _raft_cast(outsider, rm.Vote(True, outsider, 1, 0, 0)),
        _replica_fetch(node_id, node_id, target, rng, fetch_offset=10**12),
    ]


def garbage(target: Target, rng: random.Random) -> list[bytes]:
    """A valid length prefix around random bytes, or a frame that claims 2 GiB."""
    if rng.random() < 0.5:
        junk = rng.randbytes(rng.randrange(1, 512))
        return [LENGTH.pack(len(junk)) + junk]
    return [LENGTH.pack(2**31 - 1) + rng.randbytes(64)]


FORGERIES: dict[str, Callable[[Target, random.Random], list[bytes]]] = {
    f.__name__: f
    for f in (
        vote_from_outsider,
        vote_naming_a_voter,
        vote_past_the_epoch_bound,
        leader_announcement,
        metadata_fetch_for_a_voter,
        replica_fetch_for_another,
        shutdown_heartbeat,
        identity_switch,
        garbage,
    )
}


async def forge_once(host: str, port: int, frames: list[bytes], *, tls: bool = False) -> str:
    """Send one forgery's frames on a new connection; how the node answered: "closed",
    "error", "answered" (a response: a refusal the node's reply carries) or "ignored".
    With `tls` (the port expects a TLS handshake the rogue cannot complete): "refused" when
    the node ended the connection with no msgpack answer."""
    try:
        with trio.fail_after(CONNECT_TIMEOUT_S):
            stream = await trio.open_tcp_stream(host, port)
    except (OSError, trio.TooSlowError):
        return "unreachable"
    closed = "refused" if tls else "closed"
    outcome = "ignored"
    try:
        for data in frames:
            await stream.send_all(data)
        with trio.move_on_after(ANSWER_TIMEOUT_S):
            received = b""
            while True:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return closed
                received += chunk
                if tls and received[0] == TLS_ALERT_RECORD:
                    continue  # the handshake's alert; read on until the node hangs up
                if len(received) >= LENGTH.size:
                    (size,) = LENGTH.unpack_from(received)
                    if len(received) >= LENGTH.size + size:
                        kind = msgpack.unpackb(received[LENGTH.size : LENGTH.size + size])[0]
                        outcome = "error" if kind == KIND_ERROR else "answered"
                        received = received[LENGTH.size + size :]
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        return closed
    finally:
        await stream.aclose()
    return outcome


class Forger:
    """Sends forgeries to random nodes from `workers` connections at a time until cancelled,
    counting the outcomes."""

    def __init__(
        self,
        addresses: dict[int, tuple[str, int]],
        target: Target,
        rng: random.Random,
        interval_s: float = 0.05,
        workers: int = 4,
        *,
        tls: bool = False,
    ) -> None:
        self.addresses = addresses
        self.tls = tls
        self.target = target
        self.rng = rng
        self.interval_s = interval_s
        self.workers = workers
        self.outcomes: Counter[tuple[str, str]] = Counter()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(self.workers):
                nursery.start_soon(self._worker)

    async def _worker(self) -> None:
        while True:
            name = self.rng.choice(sorted(FORGERIES))
            host, port = self.addresses[self.rng.choice(sorted(self.addresses))]
            frames = FORGERIES[name](self.target, self.rng)
            outcome = await forge_once(host, port, frames, tls=self.tls)
            self.outcomes[(name, outcome)] += 1
            await trio.sleep(self.interval_s)

    def summary(self) -> str:
        return ", ".join(
            f"{name} {outcome}: {n}" for (name, outcome), n in sorted(self.outcomes.items())
        )
