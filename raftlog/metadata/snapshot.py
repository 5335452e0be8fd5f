"""Metadata snapshots: a MetadataImage as the records that rebuild it, with a checksum.

Layout (big-endian):

    magic      4 bytes  b"RLMS"
    version    u16      SNAPSHOT_VERSION
    offset     i64      last metadata offset the image includes
    epoch      i32      Raft epoch of that offset
    body_len   u32      bytes of body
    crc32c     u32      CRC32C of everything above (without this field) and the body
    body       msgpack  [cluster_id, [encoded record, ...]]   (SnapshotBody)

Records rather than a dump of the image's internals: the record format is already versioned
and decoded with checks, and replaying records through `MetadataImage.apply` means a snapshot
can only produce an image the log could also have produced.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Annotated, ClassVar

import crc32c

from raftlog.codec import Array, MaxLen
from raftlog.errors import CorruptRecordError
from raftlog.metadata import records as r
from raftlog.metadata.image import MetadataApplyError, MetadataImage

__all__ = [
    "MAX_SNAPSHOT_BYTES",
    "SNAPSHOT_VERSION",
    "SnapshotCorruptError",
    "decode_snapshot",
    "encode_snapshot",
    "image_records",
]

MAGIC = b"RLMS"
SNAPSHOT_VERSION = 1
_HEADER = struct.Struct(">4sHqiI")  # magic, version, offset, epoch, body_len
_CRC = struct.Struct(">I")
# Bounds what a damaged length field can make us allocate or parse.
MAX_SNAPSHOT_BYTES = 1024 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SnapshotBody:
    __wire__: ClassVar[Array] = Array()
    cluster_id: str
    # A record takes more than one byte, so the body's size bounds their number.
    records: Annotated[
        tuple[Annotated[bytes, MaxLen(r.MAX_RECORD_BYTES)], ...], MaxLen(MAX_SNAPSHOT_BYTES)
    ]


class SnapshotCorruptError(CorruptRecordError):
    """A snapshot failed its checks (magic, version, length, CRC32C, or a record inside)."""


def image_records(image: MetadataImage) -> list[r.Record]:
    """Records that rebuild `image` when applied to an empty image with the same cluster id."""
    out: list[r.Record] = []
    for name, level in sorted(image.features.items()):
        out.append(r.FeatureLevel(name, level))
    if image.controller_id != -1 or image.controller_epoch != -1:
        out.append(r.LeaderChange(image.controller_epoch, image.controller_id))
    for broker_id, reg in sorted(image.brokers.items()):
        out.append(
            r.RegisterBroker(
                broker_id,
                reg.incarnation_id,
                reg.epoch,
                reg.client_endpoint[0],
                reg.client_endpoint[1],
                reg.internal_endpoint[0],
                reg.internal_endpoint[1],
                reg.rack,
                reg.listeners,
            )
        )
        if not reg.fenced:
            out.append(r.UnfenceBroker(broker_id, reg.epoch))
        if reg.in_controlled_shutdown:
            out.append(r.BrokerShutdownBegin(broker_id, reg.epoch))
    for broker_id, epoch in sorted(image.unregistered_broker_epochs.items()):
        # What the image keeps of an unregistered broker is its last epoch: a registration
        # of that epoch (no endpoints) removed at once says exactly that.
        out.append(r.RegisterBroker(broker_id, uuid.UUID(int=0), epoch, "", 0, "", 0))
        out.append(r.UnregisterBroker(broker_id, epoch))
    for name, topic_id in sorted(image.topic_ids_by_name.items()):
        topic = image.topics_by_id[topic_id]
        out.append(r.Topic(name, topic_id))
        for index, p in sorted(topic.partitions.items()):
            out.append(
                r.Partition(
                    topic_id,
                    index,
                    p.replicas,
                    p.isr,
                    p.leader,
                    p.leader_epoch,
                    p.partition_epoch,
                    p.adding_replicas,
                    p.removing_replicas,
                )
            )
    for (resource_type, resource_name), values in sorted(image.configs.items()):
        for key, value in sorted(values.items()):
            out.append(r.Config(resource_type, resource_name, key, value))
    for entity, quotas in sorted(image.client_quotas.items(), key=lambda kv: repr(kv[0])):
        for key, quota in sorted(quotas.items()):
            out.append(r.ClientQuota(entity, key, quota))
    if image.next_producer_id:
        out.append(r.ProducerIds(-1, -1, image.next_producer_id))
    for acl_id, binding in sorted(image.acls.items(), key=lambda kv: kv[0].int):
        out.append(r.AccessControlEntry.of(acl_id, binding))
    for (user, _mechanism), credential in sorted(image.scram_credentials.items()):
        out.append(r.UserScramCredential.of(user, credential))
    return out


def encode_snapshot(image: MetadataImage) -> bytes:
    body = r.CODEC.encode(
        SnapshotBody(image.cluster_id, tuple(r.encode_record(rec) for rec in image_records(image)))
    )
    header = _HEADER.pack(
        MAGIC, SNAPSHOT_VERSION, image.last_applied_offset, image.last_applied_epoch, len(body)
    )
    crc = crc32c.crc32c(body, crc32c.crc32c(header))
    return header + _CRC.pack(crc) + body


def decode_snapshot(data: bytes) -> MetadataImage:
    """Rebuild the image; raises SnapshotCorruptError saying which check failed."""
    fixed = _HEADER.size + _CRC.size
    if len(data) < fixed:
        raise SnapshotCorruptError(f"snapshot is {len(data)} bytes, shorter than its header")
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise SnapshotCorruptError(f"snapshot is {len(data)} bytes, over {MAX_SNAPSHOT_BYTES}")
    header = data[: _HEADER.size]
    magic, version, offset, epoch, body_len = _HEADER.unpack(header)
    if magic != MAGIC:
        raise SnapshotCorruptError(f"not a metadata snapshot (magic {magic!r}, want {MAGIC!r})")
    if version != SNAPSHOT_VERSION:
        raise SnapshotCorruptError(
            f"unsupported snapshot version {version}; this node reads {SNAPSHOT_VERSION}"
        )
    if len(data) != fixed + body_len:
        raise SnapshotCorruptError(
            f"snapshot length {len(data)} does not match its header ({fixed} + {body_len})"
        )
    (stored_crc,) = _CRC.unpack_from(data, _HEADER.size)
    body = data[fixed:]
    actual_crc = crc32c.crc32c(body, crc32c.crc32c(header))
    if stored_crc != actual_crc:
        raise SnapshotCorruptError(
            f"snapshot CRC32C mismatch: stored {stored_crc:#010x}, computed {actual_crc:#010x}"
        )
    try:
        decoded: SnapshotBody = r.CODEC.decode(SnapshotBody, body)
        records = [r.decode_record(item) for item in decoded.records]
        image, _ = MetadataImage.empty(decoded.cluster_id).apply(records, offset, epoch)
    except CorruptRecordError as exc:  # its message without the error code's name
        raise SnapshotCorruptError(f"snapshot body is damaged: {exc.message}") from None
    except (ValueError, MetadataApplyError) as exc:  # DecodeError is a ValueError
        raise SnapshotCorruptError(f"snapshot body is damaged: {exc}") from None
    return image
