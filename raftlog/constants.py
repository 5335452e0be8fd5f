"""Kafka protocol sentinels and size units: one definition each, imported everywhere.

Nothing here imports anything, so any module (the sans-IO cores included) may use it.
"""

from __future__ import annotations

from raftlog.codec import I32_MIN

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
MS_PER_S = 1000.0
# Every frame on the Kafka and internal listeners starts with its size as 4 bytes.
FRAME_SIZE_PREFIX_BYTES = 4

# A partition without a leader (Kafka's leader id -1 in metadata and fetch answers).
NO_LEADER = -1
# A leader epoch nobody knows: the client sends it to skip KIP-320 fencing, the epoch cache
# answers it for an offset below every entry.
UNDEFINED_EPOCH = -1
# Produce acks: no answer at all, the leader's log, every in-sync replica.
ACKS_NONE = 0
ACKS_LEADER = 1
ACKS_ALL = -1
# ListOffsets timestamps that name a position instead of a time (KIP-734 added the max).
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
# authorized_operations in Metadata and DescribeGroups when the client did not ask for them.
NO_AUTHORIZED_OPERATIONS = I32_MIN
# The metadata log's topic (KIP-500): a partition of it is never a client's or a
# transaction's.
METADATA_TOPIC = "__cluster_metadata"
# Kafka's broker.rack, as long as raftlog lets it be: a rack name travels in every Metadata
# answer, so a long one only costs every client.
MAX_RACK_CHARS = 255
