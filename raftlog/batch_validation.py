"""What a leader checks of a produced batch before it appends it (after Kafka's LogValidator).

A correct CRC proves only that the bytes arrived as the producer wrote them. A producer (or
anyone on the client listener) can still send a header whose recordCount does not match the
records behind it, records that do not decode, or compressed bytes that do not decompress.
Stored, such a batch moves the log end offset by whatever the header claims and stops every
consumer of the partition at it, on every replica, for as long as the log keeps it. So the
leader walks every record of a client's batch once, before anything of the request is
appended:

- header: magic 2, CRC, batch size within max.message.bytes, recordCount >= 1 and
  lastOffsetDelta == recordCount - 1, no control batch (only coordinators write markers),
  producer id, epoch and base sequence in range for an idempotent batch, and a transactional
  batch must name its producer;
- records: each one decodes (attributes 0, varints of at most 5 or 10 bytes, lengths within
  the record, no null or non-UTF-8 header key, no trailing bytes), its offsetDelta is its
  index, and the records take exactly the batch's bytes; a compacted topic's records have
  keys;
- compressed records are decompressed into a buffer bounded by max.message.bytes (and by
  compression.DECOMPRESSED_BATCH_MAX_BYTES, which every reader of the log keeps to): a
  decompression bomb is refused without allocating past that limit.

Uncompressed records are walked in place (by position in the request's buffer, no copies),
in one tight loop without per-record objects: this runs for every produced byte.

Error codes follow Kafka: CORRUPT_MESSAGE for bytes that cannot be read at all (CRC, a codec
that fails), INVALID_RECORD for bytes that read but are not a valid batch (Kafka's
InvalidRecordException), MESSAGE_TOO_LARGE for a batch or its decompressed records above
max.message.bytes.
"""

from __future__ import annotations

from raftlog.codec import I64_MAX, I64_MIN
from raftlog.compression import (
    DECOMPRESSED_BATCH_MAX_BYTES,
    Compression,
    DecompressedTooLargeError,
    decompress,
)
from raftlog.errors import CorruptRecordError, ErrorCode, KafkaError, RemoteError
from raftlog.records import (
    HEADER_SIZE_BYTES,
    NO_PRODUCER_ID,
    BatchHeader,
    validate_batch,
)

__all__ = [
    "BatchTooLargeError",
    "InvalidRecordError",
    "ValidatedBatches",
    "validate_client_batches",
    "validated_client_batches",
]

# The smallest record body after its length: attributes, timestampDelta, offsetDelta,
# keyLength, valueLength and headerCount, one byte each at least.
MIN_RECORD_BODY_BYTES = 6
MIN_RECORD_BYTES = 1 + MIN_RECORD_BODY_BYTES
# A header is at least a key length and a value length.
MIN_HEADER_BYTES = 2
# Kafka's varints: an int32 takes at most 5 bytes, an int64 (timestampDelta) at most 10.
VARINT_MAX_BYTES = 5
VARLONG_MAX_BYTES = 10
# A base timestamp a one-byte timestampDelta (-64..63) cannot carry out of int64.
_TIMESTAMP_MIN_MS = I64_MIN + 64
_TIMESTAMP_MAX_MS = I64_MAX - 64


# Records a refused batch names to its producer at most (KIP-467's record_errors): a batch of
# a hundred thousand keyless records must not make a response of megabytes.
MAX_RECORD_ERRORS = 1_000


class InvalidRecordError(KafkaError):
    """A batch whose bytes read but do not form a valid batch (Kafka's INVALID_RECORD).

    `record_errors` names the records at fault by their index in the batch, with why (KIP-467:
    a producer fails those records with INVALID_RECORD and the batch's others with a retriable
    error of their own), at most MAX_RECORD_ERRORS of them."""

    def __init__(self, message: str, record_errors: tuple[tuple[int, str], ...] = ()) -> None:
        super().__init__(ErrorCode.invalid_record, message)
        self.record_errors = record_errors


class BatchTooLargeError(KafkaError):
    """A batch, or the records it decompresses to, above max.message.bytes."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.message_too_large, message)


class _Malformed(RemoteError):
    """Raised inside the record walk; the caller adds which batch it was and turns it into
    an InvalidRecordError."""


# ------------------------------------------------------------------------- the entry point


class ValidatedBatches:
    """One partition's produce data that passed `validated_client_batches`, with the header
    of each batch: the leader's append takes it as it is, so each produced byte has its CRC
    computed once and each header is parsed once (the storage layer re-checks only what may
    have changed since, such as max.message.bytes).

    `data` is immutable bytes, so nothing can change between the check and the append; the
    batches lie back to back in it, `headers` holding (position, header) of each in order.
    Bytes a follower fetched never come this way: it checks them at receipt.
    """

    __slots__ = ("data", "headers")

    def __init__(self, data: bytes, headers: list[tuple[int, BatchHeader]]) -> None:
        self.data = data
        self.headers = headers

    def __len__(self) -> int:
        return len(self.data)


def validated_client_batches(
    buf: bytes | bytearray | memoryview,
    *,
    max_message_bytes: int,
    require_keys: bool = False,
) -> ValidatedBatches:
    """`validate_client_batches`, keeping the bytes with the headers for the append."""
    data = buf if isinstance(buf, bytes) else bytes(buf)
    return ValidatedBatches(
        data,
        validate_client_batches(
            data, max_message_bytes=max_message_bytes, require_keys=require_keys
        ),
    )


def validate_client_batches(
    buf: bytes | bytearray | memoryview,
    *,
    max_message_bytes: int,
    require_keys: bool = False,
) -> list[tuple[int, BatchHeader]]:
    """Check every batch of one partition's produce data; return (position, header) of each.

    Raises CorruptRecordError, InvalidRecordError or BatchTooLargeError at the first batch
    that fails, naming its byte position, so that nothing of the request is appended.
    `require_keys` is set for compacted topics (Kafka refuses keyless records there).
    """
    if not buf:
        raise CorruptRecordError("no record batch")
    out: list[tuple[int, BatchHeader]] = []
    pos = 0
    end = len(buf)
    while pos < end:
        header = validate_batch(buf, pos)
        if header.size_bytes > max_message_bytes:
            raise BatchTooLargeError(
                f"batch at byte {pos} is {header.size_bytes} bytes, above max.message.bytes "
                f"{max_message_bytes}"
            )
        _check_header(header, pos)
        _check_records(buf, pos, header, max_message_bytes, require_keys)
        out.append((pos, header))
        pos += header.size_bytes
    return out


def _check_header(header: BatchHeader, pos: int) -> None:
    if not _TIMESTAMP_MIN_MS <= header.base_timestamp_ms <= _TIMESTAMP_MAX_MS:
        raise InvalidRecordError(
            f"batch at byte {pos} has baseTimestamp {header.base_timestamp_ms}, out of range"
        )
    count = header.record_count
    if count < 1 or header.last_offset_delta != count - 1:
        raise InvalidRecordError(
            f"batch at byte {pos} has recordCount {count} and lastOffsetDelta "
            f"{header.last_offset_delta}: a produced batch holds offsets 0..recordCount-1"
        )
    if header.is_control:
        raise InvalidRecordError(
            f"batch at byte {pos} is a control batch; clients may not write control records"
        )
    producer_id = header.producer_id
    if producer_id == NO_PRODUCER_ID:
        # Kafka ignores epoch and sequence of a batch without a producer id (some clients
        # leave the sequence at 0), but a transaction needs a producer.
        if header.is_transactional:
            raise InvalidRecordError(f"batch at byte {pos} is transactional but has no producer id")
        return
    if producer_id < 0:
        raise InvalidRecordError(f"batch at byte {pos} has invalid producer id {producer_id}")
    if header.producer_epoch < 0:
        raise InvalidRecordError(
            f"batch at byte {pos} of an idempotent producer has invalid producer epoch "
            f"{header.producer_epoch}"
        )
    if header.base_sequence < 0:
        raise InvalidRecordError(
            f"batch at byte {pos} of an idempotent producer has invalid base sequence "
            f"{header.base_sequence}"
        )


def _check_records(
    buf: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    max_message_bytes: int,
    require_keys: bool,
) -> None:
    start = pos + HEADER_SIZE_BYTES
    end = pos + header.size_bytes
    codec = header.compression
    body: bytes | bytearray | memoryview
    if codec == Compression.NONE:
        body = buf
    else:
        try:
            # Never more than a reader of the log will decompress, whatever the topic allows.
            limit_bytes = min(max_message_bytes, DECOMPRESSED_BATCH_MAX_BYTES)
            body = decompress(codec, memoryview(buf)[start:end], limit_bytes)
        except DecompressedTooLargeError as exc:
            raise BatchTooLargeError(
                f"batch at byte {pos}: {exc.message} (max.message.bytes {max_message_bytes})"
            ) from None
        except CorruptRecordError as exc:
            raise CorruptRecordError(f"batch at byte {pos}: {exc.message}") from None
        start, end = 0, len(body)
    try:
        keyless = _walk_records(
            body, start, end, header.record_count, header.base_timestamp_ms, require_keys
        )
    except _Malformed as exc:
        raise InvalidRecordError(f"batch at byte {pos}: {exc}") from None
    except IndexError:
        raise InvalidRecordError(
            f"batch at byte {pos}: a record runs past the end of the batch"
        ) from None
    if keyless:
        why = "Compacted topic cannot accept message without key"
        raise InvalidRecordError(
            f"batch at byte {pos}: {len(keyless)} of its {header.record_count} records have no "
            "key; a compacted topic needs one",
            tuple((index, why) for index in keyless[:MAX_RECORD_ERRORS]),
        )


# ------------------------------------------------------------------------- the record walk


def _uvarint(buf: bytes | bytearray | memoryview, p: int, max_bytes: int) -> tuple[int, int]:
    """The unsigned varint at p (its first byte has the continuation bit) and the position
    after it; at most max_bytes long and no wider than they can carry."""
    width_bits = 32 if max_bytes == VARINT_MAX_BYTES else 64
    result = 0
    shift = 0
    for _ in range(max_bytes):
        b = buf[p]
        p += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result >> width_bits:
                raise _Malformed(f"varint wider than {width_bits} bits")
            return result, p
        shift += 7
    raise _Malformed(f"varint longer than {max_bytes} bytes")


def _walk_records(
    buf: bytes | bytearray | memoryview,
    p: int,
    end: int,
    count: int,
    base_timestamp_ms: int,
    require_keys: bool,
) -> list[int]:
    """Check that buf[p:end] holds exactly `count` well-formed records, offsetDelta 0..n-1,
    each timestamp (base + timestampDelta) an int64; with `require_keys`, return the
    indexes of the records that have no key (every one is named to the producer, so the walk
    goes on past the first).

    Raises _Malformed or IndexError. Each varint has a one- and two-byte fast path inline
    (record lengths and 1 KiB values take two bytes). A read may pass the record's end
    without a bounds check: positions only grow, so it ends in `p != record_end`, or in
    IndexError at the buffer's end; and no read skips backwards.
    """
    if count > (end - p) // MIN_RECORD_BYTES:
        raise _Malformed(f"recordCount {count} cannot fit in {end - p} bytes of records")
    keyless: list[int] = []
    for index in range(count):
        # length (varint)
        b = buf[p]
        if b < 0x80:
            u = b
            p += 1
        else:
            c = buf[p + 1]
            if c < 0x80:
                u = (b & 0x7F) | (c << 7)
                p += 2
            else:
                u, p = _uvarint(buf, p, VARINT_MAX_BYTES)
        length = (u >> 1) ^ -(u & 1)
        record_end = p + length
        if length < MIN_RECORD_BODY_BYTES or record_end > end:
            raise _Malformed(f"record {index} has length {length}, beyond its batch")
        # attributes: an int8 with no bits defined. Kafka ignores it, but kafka-python reads
        # it as a varint, so a set high bit would shift every later field for that reader.
        if buf[p]:
            raise _Malformed(f"record {index} has attributes {buf[p]}; no bits are defined")
        # timestampDelta (varlong): the record's timestamp must be an int64, or every reader
        # that rebuilds the batch (the cleaner) fails on it. A one-byte delta (|d| <= 64)
        # cannot leave the range _check_header allows the base.
        b = buf[p + 1]
        if b < 0x80:
            p += 2
        else:
            u, p = _uvarint(buf, p + 1, VARLONG_MAX_BYTES)
            if not I64_MIN <= base_timestamp_ms + ((u >> 1) ^ -(u & 1)) <= I64_MAX:
                raise _Malformed(f"record {index} has a timestamp outside int64")
        # offsetDelta (varint)
        b = buf[p]
        if b < 0x80:
            u = b
            p += 1
        else:
            c = buf[p + 1]
            if c < 0x80:
                u = (b & 0x7F) | (c << 7)
                p += 2
            else:
                u, p = _uvarint(buf, p, VARINT_MAX_BYTES)
        if (u >> 1) ^ -(u & 1) != index:
            raise _Malformed(
                f"record {index} has offsetDelta {(u >> 1) ^ -(u & 1)}; "
                f"inner offsets must be consecutive"
            )
        # keyLength (varint; -1 is a null key), key
        b = buf[p]
        if b < 0x80:
            u = b
            p += 1
        else:
            c = buf[p + 1]
            if c < 0x80:
                u = (b & 0x7F) | (c << 7)
                p += 2
            else:
                u, p = _uvarint(buf, p, VARINT_MAX_BYTES)
        n = (u >> 1) ^ -(u & 1)
        if n >= 0:
            p += n
        elif n != -1:
            raise _Malformed(f"record {index} has key length {n}")
        elif require_keys:
            keyless.append(index)
        # valueLength (varint; -1 is a null value), value
        b = buf[p]
        if b < 0x80:
            u = b
            p += 1
        else:
            c = buf[p + 1]
            if c < 0x80:
                u = (b & 0x7F) | (c << 7)
                p += 2
            else:
                u, p = _uvarint(buf, p, VARINT_MAX_BYTES)
        n = (u >> 1) ^ -(u & 1)
        if n >= 0:
            p += n
        elif n != -1:
            raise _Malformed(f"record {index} has value length {n}")
        # headerCount (varint), headers
        b = buf[p]
        if b < 0x80:
            u = b
            p += 1
        else:
            u, p = _uvarint(buf, p, VARINT_MAX_BYTES)
        if u:
            p = _walk_headers(buf, p, record_end, (u >> 1) ^ -(u & 1), index)
        if p != record_end:
            raise _Malformed(
                f"record {index} has length {length} but its fields take {length + p - record_end}"
            )
    if p != end:
        raise _Malformed(f"{end - p} bytes follow the last of the {count} records")
    return keyless


def _walk_headers(
    buf: bytes | bytearray | memoryview, p: int, record_end: int, count: int, index: int
) -> int:
    if count < 0 or count > (record_end - p) // MIN_HEADER_BYTES:
        raise _Malformed(f"record {index} has header count {count}, beyond its length")
    for _ in range(count):
        b = buf[p]
        if b < 0x80:
            u = b
            p += 1
        else:
            u, p = _uvarint(buf, p, VARINT_MAX_BYTES)
        n = (u >> 1) ^ -(u & 1)
        if n < 0:
            raise _Malformed(f"record {index} has a header key of length {n}")
        if n:
            # A header key is a protocol string: readers that decode it strictly (kafka-python)
            # would stop at the record for good.
            try:
                str(buf[p : p + n], "utf-8")
            except UnicodeDecodeError:
                raise _Malformed(f"record {index} has a header key that is not UTF-8") from None
        p += n
        b = buf[p]
        if b < 0x80:
            u = b
            p += 1
        else:
            u, p = _uvarint(buf, p, VARINT_MAX_BYTES)
        n = (u >> 1) ^ -(u & 1)
        if n >= 0:
            p += n
        elif n != -1:
            raise _Malformed(f"record {index} has a header value of length {n}")
    return p
