import struct
import uuid

import msgpack
import pytest

from raftlog.metadata import records as r
from raftlog.metadata.image import MetadataImage
from raftlog.metadata.snapshot import (
    SnapshotCorruptError,
    decode_snapshot,
    encode_snapshot,
    image_records,
)
from tests.metadata.test_image import T1, base_image


def rich_image() -> MetadataImage:
    image, _ = base_image().apply(
        [
            r.BrokerShutdownBegin(2, 1),
            r.PartitionChange(T1, 0, leader=3, isr=(3,)),
            r.Config("topic", "a", "retention.ms", "5000"),
            r.Config("broker", "1", "log.retention.ms", "7"),
            r.Config("cluster", "", "unclean.leader.election.enable", "true"),
            r.ClientQuota((("client-id", None), ("user", "bob")), "consumer_byte_rate", 2048.0),
            r.ClientQuota((("user", None),), "request_percentage", 25.5),
            r.ProducerIds(1, 1, 3000),
            r.LeaderChange(7, 2),
            r.FeatureLevel("metadata.version", 1),
        ],
        offset=41,
        epoch=7,
    )
    return image


def test_image_to_snapshot_to_image_is_equal():
    image = rich_image()
    restored = decode_snapshot(encode_snapshot(image))
    assert restored == image
    assert restored.last_applied_offset == 41 and restored.last_applied_epoch == 7
    restored.check_invariants()


def test_empty_image_round_trips():
    image = MetadataImage.empty("c")
    assert decode_snapshot(encode_snapshot(image)) == image


def test_snapshot_records_rebuild_the_image():
    image = rich_image()
    rebuilt, _ = MetadataImage.empty(image.cluster_id).apply(
        image_records(image), image.last_applied_offset, image.last_applied_epoch
    )
    assert rebuilt == image


@pytest.mark.parametrize("position", [0, 5, 20, 30, -1, -20])
def test_any_flipped_byte_is_detected(position):
    data = bytearray(encode_snapshot(rich_image()))
    data[position] ^= 0x01
    with pytest.raises(SnapshotCorruptError):
        decode_snapshot(bytes(data))


def test_errors_say_what_is_wrong():
    data = encode_snapshot(rich_image())
    with pytest.raises(SnapshotCorruptError, match="shorter than its header"):
        decode_snapshot(data[:10])
    with pytest.raises(SnapshotCorruptError, match="does not match its header"):
        decode_snapshot(data[:-1])
    with pytest.raises(SnapshotCorruptError, match="magic"):
        decode_snapshot(b"XXXX" + data[4:])
    with pytest.raises(SnapshotCorruptError, match="unsupported snapshot version 9"):
        decode_snapshot(data[:4] + struct.pack(">H", 9) + data[6:])
    body = bytearray(data)
    body[-1] ^= 0xFF
    with pytest.raises(SnapshotCorruptError, match="CRC32C mismatch"):
        decode_snapshot(bytes(body))


def snapshot_from_a_newer_version(image: MetadataImage) -> bytes:
    """A snapshot with a sound header and CRC32C whose body also holds a record of a type
    this version does not know (99), as a newer version could write."""
    import crc32c

    from raftlog.metadata.snapshot import _CRC, _HEADER, MAGIC, SNAPSHOT_VERSION

    encoded = [r.encode_record(rec) for rec in image_records(image)]
    encoded.append(msgpack.packb([99, 0, "from the future"]))
    body = msgpack.packb([image.cluster_id, encoded], use_bin_type=True)
    header = _HEADER.pack(
        MAGIC, SNAPSHOT_VERSION, image.last_applied_offset, image.last_applied_epoch, len(body)
    )
    return header + _CRC.pack(crc32c.crc32c(body, crc32c.crc32c(header))) + body


def test_a_record_from_a_newer_version_is_named():
    with pytest.raises(SnapshotCorruptError, match="unknown metadata record type 99"):
        decode_snapshot(snapshot_from_a_newer_version(rich_image()))


def test_a_checksummed_but_invalid_body_is_still_refused():
    # Build a snapshot whose CRC is right but whose records do not apply (a writer bug).
    import crc32c

    from raftlog.metadata.snapshot import _CRC, _HEADER, MAGIC, SNAPSHOT_VERSION

    body = msgpack.packb(["c", [r.encode_record(r.FenceBroker(5, 1))]])
    header = _HEADER.pack(MAGIC, SNAPSHOT_VERSION, 3, 1, len(body))
    data = header + _CRC.pack(crc32c.crc32c(body, crc32c.crc32c(header))) + body
    with pytest.raises(SnapshotCorruptError, match="broker 5 is not registered"):
        decode_snapshot(data)
    body = msgpack.packb(["c", [b"\x93\x63\x00\x00"]])
    header = _HEADER.pack(MAGIC, SNAPSHOT_VERSION, 3, 1, len(body))
    data = header + _CRC.pack(crc32c.crc32c(body, crc32c.crc32c(header))) + body
    with pytest.raises(SnapshotCorruptError, match="unknown metadata record type 99"):
        decode_snapshot(data)


def test_topic_ids_survive_as_uuids():
    restored = decode_snapshot(encode_snapshot(rich_image()))
    assert isinstance(restored.topic("a").topic_id, uuid.UUID)
