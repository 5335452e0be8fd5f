"""Leader epochs as both logs speak of them: the metadata Raft log and partition replication.

Both detect a follower's divergent tail the same way (KIP-320, KIP-595): the follower names
the epoch of its last fetched entry, and the leader answers with where that epoch ends in
its own log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from raftlog.codec import Array, Epoch, Offset

__all__ = ["DivergingEpoch"]


@dataclass(frozen=True, slots=True)
class DivergingEpoch:
    """The leader's end offset for the largest epoch <= the follower's last fetched epoch."""

    __wire__: ClassVar[Array] = Array()
    epoch: Epoch
    end_offset: Offset
