"""Kafka RecordBatch v2 (magic 2): the one module that knows the batch format.

Layout of the 61-byte batch header (big endian), per Kafka's DefaultRecordBatch:

    0  baseOffset i64        21 attributes i16       43 producerId i64
    8  batchLength i32       23 lastOffsetDelta i32  51 producerEpoch i16
    12 partitionLeaderEpoch  27 baseTimestamp i64    53 baseSequence i32
    16 magic i8              35 maxTimestamp i64     57 recordCount i32
    17 crc u32 (CRC32C over attributes..end of batch)

batchLength counts the bytes after the batchLength field, so a batch is 12 + batchLength
bytes long. baseOffset and partitionLeaderEpoch sit before the CRC'd range: the broker
rewrites them in place without re-encoding or re-checksumming anything.
"""

from __future__ import annotations

import enum
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import crc32c

from raftlog.codec import I32_MAX, I64_MAX
from raftlog.compression import Compression, compress, decompress
from raftlog.errors import CorruptRecordError

HEADER_STRUCT = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE_BYTES = HEADER_STRUCT.size  # 61
assert HEADER_SIZE_BYTES == 61
# baseOffset + batchLength: what must be read to learn a batch's full size.
LOG_OVERHEAD_BYTES = 12
MAGIC_V2 = 2
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
MAX_TIMESTAMP_OFFSET = 35
PARTITION_LEADER_EPOCH_OFFSET = 12
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1
# Hard upper bound on one batch; a size field above it is corruption, not a real batch
# (a flipped high bit in batchLength must not make us try to read 2 GiB).
MAX_BATCH_SIZE_BYTES = I32_MAX

_OFFSET_AND_EPOCH = struct.Struct(">q")
_EPOCH = struct.Struct(">i")
_ATTRIBUTES = struct.Struct(">h")
_TIMESTAMP = struct.Struct(">q")
_CRC = struct.Struct(">I")
_SIZE = struct.Struct(">qi")


class TimestampType(enum.IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20


def make_attributes(
    compression: Compression = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    *,
    is_transactional: bool = False,
    is_control: bool = False,
) -> int:
    attrs = int(compression) & COMPRESSION_MASK
    if timestamp_type == TimestampType.LOG_APPEND_TIME:
        attrs |= TIMESTAMP_TYPE_BIT
    if is_transactional:
        attrs |= TRANSACTIONAL_BIT
    if is_control:
        attrs |= CONTROL_BIT
    return attrs


def compression_of(attributes: int) -> Compression:
    code = attributes & COMPRESSION_MASK
    try:
        return Compression(code)
    except ValueError:
        raise CorruptRecordError(f"unknown compression codec {code} in attributes") from None


def timestamp_type_of(attributes: int) -> TimestampType:
    return (
        TimestampType.LOG_APPEND_TIME
        if attributes & TIMESTAMP_TYPE_BIT
        else TimestampType.CREATE_TIME
    )


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size_bytes(self) -> int:
        return LOG_OVERHEAD_BYTES + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        return compression_of(self.attributes)

    @property
    def timestamp_type(self) -> TimestampType:
        return timestamp_type_of(self.attributes)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)


@dataclass(frozen=True, slots=True)
class Record:
    """One record; offset is absolute once the record came out of a stored batch."""

    offset: int = -1
    timestamp_ms: int | None = None
    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = field(default_factory=tuple)


# ------------------------------------------------------------------------- header level


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Decode the 61-byte header at `pos` (no validation beyond having enough bytes)."""
    if len(buf) - pos < HEADER_SIZE_BYTES:
        raise CorruptRecordError(
            f"batch header at byte {pos} is truncated: need {HEADER_SIZE_BYTES} bytes, "
            f"have {max(0, len(buf) - pos)}"
        )
    return BatchHeader._make(HEADER_STRUCT.unpack_from(buf, pos))


def batch_size_at(buf: bytes | bytearray | memoryview, pos: int = 0) -> int:
    """Total size of the batch starting at `pos`, from its first 12 bytes."""
    _, length = _SIZE.unpack_from(buf, pos)
    return LOG_OVERHEAD_BYTES + length


def compute_crc(buf: bytes | bytearray | memoryview, pos: int, size_bytes: int) -> int:
    view = memoryview(buf)[pos + ATTRIBUTES_OFFSET : pos + size_bytes]
    return crc32c.crc32c(view)


def validate_batch(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, check_crc: bool = True
) -> BatchHeader:
    """Check size bounds, magic and CRC of the batch at `pos`; return its header.

    The message names the byte position and what was wrong, because it ends up in a produce
    error or a recovery log line and must be enough to find the bad bytes.
    """
    available = len(buf) - pos
    if available < HEADER_SIZE_BYTES:
        raise CorruptRecordError(
            f"incomplete batch at byte {pos}: {available} bytes left, a header needs "
            f"{HEADER_SIZE_BYTES}"
        )
    header = BatchHeader._make(HEADER_STRUCT.unpack_from(buf, pos))
    size = header.size_bytes
    if header.batch_length < HEADER_SIZE_BYTES - LOG_OVERHEAD_BYTES or size > MAX_BATCH_SIZE_BYTES:
        raise CorruptRecordError(
            f"batch at byte {pos} has impossible batchLength {header.batch_length}"
        )
    if header.magic != MAGIC_V2:
        raise CorruptRecordError(
            f"batch at byte {pos} has magic {header.magic}; only magic 2 (RecordBatch v2) "
            f"is supported"
        )
    if size > available:
        raise CorruptRecordError(
            f"incomplete batch at byte {pos}: batchLength says {size} bytes, "
            f"only {available} present"
        )
    if header.last_offset_delta < 0 or header.record_count < 0:
        raise CorruptRecordError(
            f"batch at byte {pos} has negative lastOffsetDelta {header.last_offset_delta} "
            f"or recordCount {header.record_count}"
        )
    if check_crc:
        actual = compute_crc(buf, pos, size)
        if actual != header.crc:
            raise CorruptRecordError(
                f"batch at byte {pos} (baseOffset {header.base_offset}) fails CRC32C: "
                f"stored {header.crc:#010x}, computed {actual:#010x}"
            )
    return header


def iter_batches(
    buf: bytes | bytearray | memoryview, *, check_crc: bool = True
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) of every batch; the buffer must hold whole batches only."""
    pos = 0
    end = len(buf)
    while pos < end:
        header = validate_batch(buf, pos, check_crc=check_crc)
        yield pos, header
        pos += header.size_bytes


def set_offset_and_epoch(
    buf: bytearray | memoryview, pos: int, base_offset: int, partition_leader_epoch: int
) -> None:
    """Rewrite baseOffset and partitionLeaderEpoch in place; both are outside the CRC."""
    _OFFSET_AND_EPOCH.pack_into(buf, pos, base_offset)
    _EPOCH.pack_into(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, partition_leader_epoch)


# baseOffset, batchLength and partitionLeaderEpoch: the bytes before magic, none under the CRC.
_OFFSET_LENGTH_EPOCH = struct.Struct(">qii")
OFFSET_LENGTH_EPOCH_BYTES = _OFFSET_LENGTH_EPOCH.size  # 16


def offset_and_epoch_prefix(
    header: BatchHeader, base_offset: int, partition_leader_epoch: int
) -> bytes:
    """The batch's first OFFSET_LENGTH_EPOCH_BYTES with baseOffset and partitionLeaderEpoch
    set: written in front of the batch's unchanged rest (from magic on), it stores the batch
    as `set_offset_and_epoch` would, without copying the batch to change it in place."""
    return _OFFSET_LENGTH_EPOCH.pack(base_offset, header.batch_length, partition_leader_epoch)


def stamp_log_append_time(batches: bytes | bytearray | memoryview, append_time_ms: int) -> bytes:
    """The batches as a LogAppendTime topic's leader stores them (KIP-32, Kafka's LogValidator).

    Each batch gets the timestamp-type bit and maxTimestamp = append_time_ms, and a new CRC.
    Only header fields change: records (compressed or not) keep their bytes and their own
    timestamps, because readers take maxTimestamp as every record's timestamp when the bit is
    set. Every CRC is checked first, so corrupt input is refused, never re-signed as valid.
    Stamping twice with the same time gives the same bytes.
    """
    out = bytearray(batches)
    for pos, header in iter_batches(out):
        attributes = header.attributes | TIMESTAMP_TYPE_BIT
        _ATTRIBUTES.pack_into(out, pos + ATTRIBUTES_OFFSET, attributes)
        _TIMESTAMP.pack_into(out, pos + MAX_TIMESTAMP_OFFSET, append_time_ms)
        _CRC.pack_into(out, pos + CRC_OFFSET, compute_crc(out, pos, header.size_bytes))
    return bytes(out)


# ------------------------------------------------------------------------- codecs

# ------------------------------------------------------------------------- varints


def _write_varint(out: bytearray, value: int) -> None:
    """Zigzag varint (Kafka's ByteUtils.writeVarlong covers both widths)."""
    v = (value << 1) ^ (value >> 63)
    while v & ~0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _read_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        if pos >= len(buf):
            raise CorruptRecordError("record ends inside a varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise CorruptRecordError("varint longer than 10 bytes")
    return (result >> 1) ^ -(result & 1), pos


def _read_bytes(
    buf: bytes | bytearray | memoryview, pos: int, what: str
) -> tuple[bytes | None, int]:
    length, pos = _read_varint(buf, pos)
    if length < 0:
        return None, pos
    if pos + length > len(buf):
        raise CorruptRecordError(f"record {what} of {length} bytes overruns the batch")
    return bytes(buf[pos : pos + length]), pos + length


# ------------------------------------------------------------------------- record level


def iter_records(batch: bytes | bytearray | memoryview, pos: int = 0) -> Iterator[Record]:
    """Decode every record of the (validated) batch at `pos`, decompressing if needed: a
    batch whose records decompress to more than DECOMPRESSED_BATCH_MAX_BYTES is corrupt
    (DecompressedTooLargeError, a CorruptRecordError), whoever wrote it."""
    header = parse_header(batch, pos)
    end = pos + header.size_bytes
    body: bytes | bytearray | memoryview = memoryview(batch)[pos + HEADER_SIZE_BYTES : end]
    if header.compression != Compression.NONE:
        body = decompress(header.compression, body)
    log_append = header.timestamp_type == TimestampType.LOG_APPEND_TIME
    p = 0
    for index in range(header.record_count):
        length, p = _read_varint(body, p)
        record_end = p + length
        if length < 0 or record_end > len(body):
            raise CorruptRecordError(
                f"record {index} of batch at offset {header.base_offset} overruns the batch"
            )
        p += 1  # record attributes: unused by Kafka so far
        ts_delta, p = _read_varint(body, p)
        offset_delta, p = _read_varint(body, p)
        key, p = _read_bytes(body, p, "key")
        value, p = _read_bytes(body, p, "value")
        header_count, p = _read_varint(body, p)
        headers = []
        for _ in range(header_count):
            hkey, p = _read_bytes(body, p, "header key")
            hvalue, p = _read_bytes(body, p, "header value")
            headers.append(((hkey or b"").decode("utf-8", "replace"), hvalue))
        if p != record_end:
            raise CorruptRecordError(
                f"record {index} of batch at offset {header.base_offset} has length "
                f"{length} but its fields take {length + p - record_end}"
            )
        timestamp = header.max_timestamp_ms if log_append else header.base_timestamp_ms + ts_delta
        yield Record(header.base_offset + offset_delta, timestamp, key, value, tuple(headers))


def iter_all_records(buf: bytes | bytearray | memoryview) -> Iterator[Record]:
    """Records of every batch in a buffer of whole batches (validates each batch)."""
    for pos, _ in iter_batches(buf):
        yield from iter_records(buf, pos)


def _encode_record(out: bytearray, record: Record, offset_delta: int, timestamp_delta: int) -> None:
    body = bytearray()
    body.append(0)
    _write_varint(body, timestamp_delta)
    _write_varint(body, offset_delta)
    for blob in (record.key, record.value):
        if blob is None:
            _write_varint(body, -1)
        else:
            _write_varint(body, len(blob))
            body += blob
    _write_varint(body, len(record.headers))
    for hkey, hvalue in record.headers:
        encoded = hkey.encode()
        _write_varint(body, len(encoded))
        body += encoded
        if hvalue is None:
            _write_varint(body, -1)
        else:
            _write_varint(body, len(hvalue))
            body += hvalue
    _write_varint(out, len(body))
    out += body


def build_batch(
    records: Sequence[Record],
    base_offset: int = 0,
    *,
    compression: Compression = Compression.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    is_transactional: bool = False,
    is_control: bool = False,
    keep_offsets: bool = False,
    last_offset_delta: int | None = None,
    now_ms: int | None = None,
) -> bytes:
    """Encode one RecordBatch v2.

    Offsets are consecutive from base_offset unless keep_offsets, which uses each record's own
    offset (the cleaner rebuilds batches that way so compaction never renumbers anything).
    Records without a timestamp get now_ms (default: the wall clock).
    """
    if not records:
        raise ValueError("a record batch needs at least one record")
    default_ts = int(time.time() * 1000) if now_ms is None else now_ms
    stamps = [default_ts if r.timestamp_ms is None else r.timestamp_ms for r in records]
    base_ts = stamps[0]
    max_ts = max(stamps)
    body = bytearray()
    deltas: list[int] = []
    for index, (record, ts) in enumerate(zip(records, stamps, strict=True)):
        delta = record.offset - base_offset if keep_offsets else index
        if (deltas and delta <= deltas[-1]) or delta < 0:
            raise ValueError(f"record offsets must increase from base_offset, got delta {delta}")
        deltas.append(delta)
        _encode_record(body, record, delta, ts - base_ts)
    payload = compress(compression, bytes(body))
    last_delta = deltas[-1] if last_offset_delta is None else last_offset_delta
    attributes = make_attributes(
        compression, timestamp_type, is_transactional=is_transactional, is_control=is_control
    )
    size = HEADER_SIZE_BYTES + len(payload)
    out = bytearray(size)
    HEADER_STRUCT.pack_into(
        out,
        0,
        base_offset,
        size - LOG_OVERHEAD_BYTES,
        partition_leader_epoch,
        MAGIC_V2,
        0,
        attributes,
        last_delta,
        base_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    out[HEADER_SIZE_BYTES:] = payload
    _CRC.pack_into(out, CRC_OFFSET, compute_crc(out, 0, size))
    return bytes(out)


def rebuild_batch(header: BatchHeader, records: Sequence[Record]) -> bytes:
    """A batch with the same header fields (offsets kept) holding only `records`."""
    return build_batch(
        records,
        header.base_offset,
        compression=header.compression,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        partition_leader_epoch=header.partition_leader_epoch,
        timestamp_type=header.timestamp_type,
        is_transactional=header.is_transactional,
        is_control=header.is_control,
        keep_offsets=True,
        last_offset_delta=header.last_offset_delta,
    )


# ------------------------------------------------------------------------- control records
# Kafka's transaction markers (KIP-98, EndTransactionMarker and ControlRecordType): a control
# batch (CONTROL_BIT and TRANSACTIONAL_BIT set) of the producer whose transaction ends, with
# exactly one record:
#   key   = version int16 (0), type int16 (0 ABORT, 1 COMMIT)
#   value = version int16 (0), coordinator_epoch int32
# Only a partition leader writes markers (WriteTxnMarkers from the transaction coordinator);
# clients may not (batch_validation refuses control batches).

CONTROL_RECORD_KEY_VERSION = 0
END_TXN_MARKER_VALUE_VERSION = 0
_CONTROL_KEY = struct.Struct(">hh")
_END_TXN_VALUE = struct.Struct(">hi")
MAX_COORDINATOR_EPOCH = I32_MAX
MAX_PRODUCER_EPOCH = 2**15 - 1


class ControlType(enum.IntEnum):
    """Kafka's ControlRecordType ids for transaction markers (others exist, e.g. KRaft's)."""

    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """A parsed COMMIT or ABORT marker (the batch header carries producer id and epoch)."""

    producer_id: int
    producer_epoch: int
    control_type: ControlType
    coordinator_epoch: int

    @property
    def commit(self) -> bool:
        return self.control_type is ControlType.COMMIT


def build_txn_marker(
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    commit: bool,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    timestamp_ms: int | None = None,
) -> bytes:
    """One COMMIT/ABORT control batch of `producer_id` (no sequence: markers carry none)."""
    if not 0 <= producer_id <= I64_MAX:
        raise ValueError(f"producer id {producer_id} out of range")
    if not 0 <= producer_epoch <= MAX_PRODUCER_EPOCH:
        raise ValueError(f"producer epoch {producer_epoch} out of range")
    if not 0 <= coordinator_epoch <= MAX_COORDINATOR_EPOCH:
        raise ValueError(f"coordinator epoch {coordinator_epoch} out of range")
    control_type = ControlType.COMMIT if commit else ControlType.ABORT
    record = Record(
        key=_CONTROL_KEY.pack(CONTROL_RECORD_KEY_VERSION, control_type),
        value=_END_TXN_VALUE.pack(END_TXN_MARKER_VALUE_VERSION, coordinator_epoch),
        timestamp_ms=timestamp_ms,
    )
    return build_batch(
        [record],
        base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        partition_leader_epoch=partition_leader_epoch,
        is_transactional=True,
        is_control=True,
        now_ms=timestamp_ms,
    )


def control_type_of(key: bytes | None) -> int:
    """The type id of a control record key; raises CorruptRecordError on a malformed key.

    Kafka reads keys of a higher version as version 0 (later versions may only append), so a
    longer key with version > 0 is accepted; a negative version or a short key is not."""
    if key is None or len(key) < _CONTROL_KEY.size:
        raise CorruptRecordError(f"control record key of {0 if key is None else len(key)} bytes")
    version, type_id = _CONTROL_KEY.unpack_from(key)
    if version < 0:
        raise CorruptRecordError(f"control record key has negative version {version}")
    return type_id


def parse_txn_marker(batch: bytes | bytearray | memoryview, pos: int = 0) -> TxnMarker | None:
    """The COMMIT/ABORT marker in the (validated) control batch at `pos`; None for a control
    batch of another type (e.g. KRaft's LEADER_CHANGE). Raises CorruptRecordError when the
    batch is not a well-formed marker: not transactional, not exactly one record, a key or
    value too short or of a negative version, an epoch or producer id out of range."""
    header = parse_header(batch, pos)
    if not header.is_control:
        raise CorruptRecordError(f"batch at offset {header.base_offset} is not a control batch")
    # The count first: a forged marker claiming millions of records is never decoded.
    records = list(iter_records(batch, pos)) if header.record_count == 1 else []
    if len(records) != 1:
        raise CorruptRecordError(
            f"control batch at offset {header.base_offset} holds {header.record_count} "
            f"records, not 1"
        )
    type_id = control_type_of(records[0].key)
    if type_id not in (ControlType.ABORT, ControlType.COMMIT):
        return None
    if not header.is_transactional:
        raise CorruptRecordError(
            f"transaction marker at offset {header.base_offset} is not transactional"
        )
    value = records[0].value
    if value is None or len(value) < _END_TXN_VALUE.size:
        raise CorruptRecordError(
            f"transaction marker at offset {header.base_offset} has a value of "
            f"{0 if value is None else len(value)} bytes, needs {_END_TXN_VALUE.size}"
        )
    version, coordinator_epoch = _END_TXN_VALUE.unpack_from(value)
    if version < 0 or coordinator_epoch < 0:
        raise CorruptRecordError(
            f"transaction marker at offset {header.base_offset} has version {version}, "
            f"coordinator epoch {coordinator_epoch}"
        )
    if header.producer_id < 0 or not 0 <= header.producer_epoch <= MAX_PRODUCER_EPOCH:
        raise CorruptRecordError(
            f"transaction marker at offset {header.base_offset} has producer id "
            f"{header.producer_id}, epoch {header.producer_epoch}"
        )
    return TxnMarker(
        header.producer_id, header.producer_epoch, ControlType(type_id), coordinator_epoch
    )
