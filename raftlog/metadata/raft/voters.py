"""The metadata quorum's voter set as data in its own log (KIP-853 dynamic membership).

The voter set is a control record of the Raft layer, KIP-853's ``VotersRecord``: each voter's
id, directory id and endpoints. It is an ordinary log entry whose payload starts with
``VOTERS_RECORD_PREFIX`` (the state machine skips it, as it skips the per-epoch no-op), so
it is replicated, truncated and committed like every other entry. A node's voter set is the
latest one in its log, committed or not (the Raft dissertation's single-server change, 4.1);
a snapshot carries the voter set in force at its end offset; a log with neither starts from
the static bootstrap set (``controller_quorum_voters``).

A raw snapshot on the wire and on disk is ``SnapshotEnvelope``: the voter set plus the state
machine's own bytes, so a follower that installs one knows the voters too. Every field is
range-checked at decode (raftlog.codec).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, ClassVar

from raftlog.codec import I32_MAX, Array, Codec, DecodeError, Map, MaxLen, Port, Range

__all__ = [
    "MAX_ENDPOINTS",
    "MAX_VOTERS",
    "RAFT_LISTENER_NAME",
    "VOTERS_RECORD_PREFIX",
    "Endpoint",
    "SnapshotEnvelope",
    "Voter",
    "VoterSet",
    "decode_voters_record",
    "encode_voters_record",
    "is_voters_record",
    "unwrap_snapshot",
    "wrap_snapshot",
]

# Bounds of a decoded voter set: a quorum of more than this many voters gains nothing (every
# commit waits for a majority), and a node has few listeners.
MAX_VOTERS = 64
MAX_ENDPOINTS = 16
# The listener name whose endpoint carries Raft RPC (Kafka's first controller.listener.names).
RAFT_LISTENER_NAME = "CONTROLLER"
# A payload no metadata entry can start with (records.encode_entry starts with a msgpack
# array header, never a zero byte), like the per-epoch no-op.
VOTERS_RECORD_PREFIX = b"\x00raftlog-voters\x00"
# Marks a snapshot blob that carries a voter set; older snapshots are the state machine's
# bytes alone (they hold no voter change, so the bootstrap set applies).
SNAPSHOT_ENVELOPE_PREFIX = b"\x00raftlog-snapshot\x00"

# A zero directory id: "unknown" (a voter from the static config, as in Kafka).
NO_DIRECTORY_ID = uuid.UUID(int=0)

_CODEC = Codec()


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One listener of a voter: name, host, port (Kafka's VotersRecord Endpoints)."""

    __wire__: ClassVar[Array] = Array()
    name: Annotated[str, MaxLen(255)]
    host: Annotated[str, MaxLen(255)]  # a DNS name has at most 253 characters
    port: Port


@dataclass(frozen=True, slots=True)
class Voter:
    """One voter: its node id, the directory id of its metadata log, its endpoints."""

    __wire__: ClassVar[Array] = Array()
    voter_id: Annotated[int, Range(0, I32_MAX)]
    directory_id: uuid.UUID
    endpoints: Annotated[tuple[Endpoint, ...], MaxLen(MAX_ENDPOINTS)]

    def raft_address(self) -> tuple[str, int] | None:
        """The (host, port) Raft RPC goes to: the CONTROLLER endpoint, else the first one."""
        for endpoint in self.endpoints:
            if endpoint.name == RAFT_LISTENER_NAME:
                return endpoint.host, endpoint.port
        if self.endpoints:
            return self.endpoints[0].host, self.endpoints[0].port
        return None


@dataclass(frozen=True, slots=True)
class VoterSet:
    """KIP-853's VotersRecord: the whole voter set (a change writes the new set in full)."""

    __wire__: ClassVar[Map] = Map(header=(("v", "VERSION"),))
    VERSION: ClassVar[int] = 0
    voters: Annotated[tuple[Voter, ...], MaxLen(MAX_VOTERS)]

    def __post_init__(self) -> None:
        ids = [v.voter_id for v in self.voters]
        if len(set(ids)) != len(ids):
            raise ValueError(f"a voter set names a voter twice: {sorted(ids)}")

    @classmethod
    def from_addresses(cls, addresses: Mapping[int, tuple[str, int]]) -> VoterSet:
        """The bootstrap set from the static config: id -> Raft (internal) address."""
        return cls(
            tuple(
                Voter(node_id, NO_DIRECTORY_ID, (Endpoint(RAFT_LISTENER_NAME, host, port),))
                for node_id, (host, port) in sorted(addresses.items())
            )
        )

    @classmethod
    def of_ids(cls, ids: Iterable[int]) -> VoterSet:
        """A voter set without endpoints (the simulator and sans-IO tests address by id)."""
        return cls(tuple(Voter(i, NO_DIRECTORY_ID, ()) for i in sorted(ids)))

    @property
    def ids(self) -> frozenset[int]:
        return frozenset(v.voter_id for v in self.voters)

    def get(self, voter_id: int) -> Voter | None:
        for voter in self.voters:
            if voter.voter_id == voter_id:
                return voter
        return None

    def addresses(self) -> dict[int, tuple[str, int]]:
        """voter id -> Raft address, for every voter that has one."""
        out: dict[int, tuple[str, int]] = {}
        for voter in self.voters:
            address = voter.raft_address()
            if address is not None:
                out[voter.voter_id] = address
        return out

    def with_voter(self, voter: Voter) -> VoterSet:
        """This set with voter added, or replacing the voter of the same id."""
        kept = tuple(v for v in self.voters if v.voter_id != voter.voter_id)
        return VoterSet(tuple(sorted((*kept, voter), key=lambda v: v.voter_id)))

    def without(self, voter_id: int) -> VoterSet:
        return VoterSet(tuple(v for v in self.voters if v.voter_id != voter_id))


def is_voters_record(payload: bytes) -> bool:
    return payload.startswith(VOTERS_RECORD_PREFIX)


def encode_voters_record(voters: VoterSet) -> bytes:
    return VOTERS_RECORD_PREFIX + _CODEC.encode(voters)


def decode_voters_record(payload: bytes) -> VoterSet:
    """Raises DecodeError for anything but a well-formed, range-checked, non-empty set."""
    if not is_voters_record(payload):
        raise DecodeError("not a VotersRecord")
    try:
        voters: VoterSet = _CODEC.decode(VoterSet, payload[len(VOTERS_RECORD_PREFIX) :])
    except ValueError as exc:  # a duplicate id (from __post_init__)
        raise DecodeError(f"VotersRecord: {exc}") from None
    if not voters.voters:
        raise DecodeError("VotersRecord: an empty voter set")
    return voters


@dataclass(frozen=True, slots=True)
class SnapshotEnvelope:
    """A snapshot blob: the voter set at its end offset and the state machine's bytes."""

    __wire__: ClassVar[Map] = Map(header=(("v", "VERSION"),))
    VERSION: ClassVar[int] = 0
    voters: VoterSet
    data: bytes


def wrap_snapshot(voters: VoterSet | None, data: bytes) -> bytes:
    """The blob of a snapshot; one without a voter set is the state machine's bytes alone."""
    if voters is None:
        return data
    return SNAPSHOT_ENVELOPE_PREFIX + _CODEC.encode(SnapshotEnvelope(voters, data))


def unwrap_snapshot(blob: bytes) -> tuple[VoterSet | None, bytes]:
    """(voter set or None, state machine bytes) of a blob; DecodeError if it is damaged."""
    if not blob.startswith(SNAPSHOT_ENVELOPE_PREFIX):
        return None, blob
    try:
        envelope: SnapshotEnvelope = _CODEC.decode(
            SnapshotEnvelope, blob[len(SNAPSHOT_ENVELOPE_PREFIX) :]
        )
    except ValueError as exc:
        raise DecodeError(f"snapshot envelope: {exc}") from None
    if not envelope.voters.voters:
        raise DecodeError("snapshot envelope: an empty voter set")
    return envelope.voters, envelope.data
