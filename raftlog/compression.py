"""Record batch compression: Kafka's codecs through cramjam, and the one bounded decompressor
every reader of records goes through.

A compressed batch of a few KiB can claim gigabytes of records. Produce refuses a batch whose
records decompress to more than its topic's max.message.bytes; every other reader (the log's
own lookups, the cleaner, the coordinators' loaders, the consumer client, the Spark source)
reads bytes that came from a disk or a broker, so it decompresses under
DECOMPRESSED_BATCH_MAX_BYTES. Produce never accepts more than that either, whatever
max.message.bytes says, so a batch the log took is one every reader can read.
"""

from __future__ import annotations

import enum
import struct

import cramjam

from raftlog.constants import MIB
from raftlog.errors import CorruptRecordError

__all__ = [
    "DECOMPRESSED_BATCH_MAX_BYTES",
    "Compression",
    "DecompressedTooLargeError",
    "compress",
    "decompress",
]

# The most one batch's records may decompress to, for every reader and for produce (which
# also stops at max.message.bytes when that is lower). 256 times Kafka's default
# max.message.bytes, and what one reader may have to hold at once.
DECOMPRESSED_BATCH_MAX_BYTES = 256 * MIB
# First guess of a compressed batch's decompressed size, as a multiple of its compressed
# size (never below the floor): a guess too small costs a retry with a 4x larger buffer, a
# guess too large costs zeroing memory nobody uses.
DECOMPRESS_FIRST_GUESS_RATIO = 8
DECOMPRESS_FIRST_GUESS_MIN_BYTES = 64 * 1024
DECOMPRESS_GROWTH_FACTOR = 4
# What cramjam says when the output buffer filled before the input ended.
_CRAMJAM_OUTPUT_FULL = "failed to write whole buffer"
# The Java client frames snappy as xerial blocks; librdkafka writes raw snappy.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)  # magic, version, compatible version
_XERIAL_BLOCK_BYTES = 32 * 1024  # what the Java client's SnappyOutputStream uses
_BLOCK_LENGTH = struct.Struct(">i")


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


_STREAM_CODECS = {
    Compression.GZIP: cramjam.gzip,
    Compression.LZ4: cramjam.lz4,
    Compression.ZSTD: cramjam.zstd,
}


class DecompressedTooLargeError(CorruptRecordError):
    """Compressed records that decompress to more than the reader's limit. To a reader of a
    log the batch is corrupt; produce answers MESSAGE_TOO_LARGE instead."""


def compress(codec: Compression, data: bytes) -> bytes:
    if codec == Compression.NONE:
        return data
    if codec == Compression.SNAPPY:
        # xerial framing: the Java client requires it on read, librdkafka accepts it.
        out = [_XERIAL_HEADER]
        for start in range(0, len(data), _XERIAL_BLOCK_BYTES):
            block = bytes(cramjam.snappy.compress_raw(data[start : start + _XERIAL_BLOCK_BYTES]))
            out.append(_BLOCK_LENGTH.pack(len(block)))
            out.append(block)
        return b"".join(out)
    module = _STREAM_CODECS.get(codec)
    if module is None:
        raise CorruptRecordError(f"unknown compression codec {codec}")
    return bytes(module.compress(data))


def decompress(
    codec: Compression,
    data: bytes | bytearray | memoryview,
    limit_bytes: int = DECOMPRESSED_BATCH_MAX_BYTES,
) -> bytes | bytearray | memoryview:
    """`data` decompressed; DecompressedTooLargeError once the output would pass
    limit_bytes, CorruptRecordError when the bytes do not decompress. The codecs write into
    one Python buffer at a time, never larger than limit_bytes + 1 (snappy: of the size its
    blocks declare), trimmed to what was written."""
    if codec == Compression.NONE:
        if len(data) > limit_bytes:
            raise DecompressedTooLargeError(f"records of {len(data)} bytes, above {limit_bytes}")
        return data
    if codec == Compression.SNAPPY:
        return _snappy(data, limit_bytes)
    module = _STREAM_CODECS.get(codec)
    if module is None:
        raise CorruptRecordError(f"unknown compression codec {codec}")
    ceiling = limit_bytes + 1  # one byte past the limit tells "too large" from "just fits"
    size = min(
        ceiling, max(DECOMPRESS_FIRST_GUESS_MIN_BYTES, DECOMPRESS_FIRST_GUESS_RATIO * len(data))
    )
    while True:
        out = bytearray(size)
        try:
            written = module.decompress_into(data, out)
        except Exception as exc:  # cramjam raises its own DecompressionError
            if _CRAMJAM_OUTPUT_FULL not in str(exc):
                raise CorruptRecordError(f"cannot decompress {codec.name} records: {exc}") from None
            if size >= ceiling:
                raise _too_large(codec, limit_bytes) from None
            del out  # before the larger one: never both at once
            size = min(ceiling, size * DECOMPRESS_GROWTH_FACTOR)
            continue
        if written > limit_bytes:
            raise _too_large(codec, limit_bytes)
        del out[written:]  # the grown buffer's unused tail goes back now, not with the body
        return out


def _too_large(codec: Compression, limit_bytes: int) -> DecompressedTooLargeError:
    return DecompressedTooLargeError(
        f"{codec.name} records decompress to more than {limit_bytes} bytes"
    )


def _snappy(data: bytes | bytearray | memoryview, limit_bytes: int) -> bytearray:
    """Raw snappy (librdkafka) or xerial-framed blocks (the Java client). Each raw block
    declares its decompressed length up front: the limit is checked on their sum before any
    output, and every block decompresses straight into one buffer of that size."""
    raw = memoryview(bytes(data))
    try:
        blocks: list[tuple[memoryview, int]] = []
        total = 0
        if raw[: len(_XERIAL_MAGIC)] != _XERIAL_MAGIC:
            total = _declared_length(raw)
            blocks.append((raw, total))
        else:
            if len(raw) < len(_XERIAL_HEADER):
                raise CorruptRecordError("xerial snappy header cut short")
            pos = len(_XERIAL_HEADER)
            while pos < len(raw):
                if pos + _BLOCK_LENGTH.size > len(raw):
                    raise CorruptRecordError("truncated xerial snappy block length")
                (block_len,) = _BLOCK_LENGTH.unpack_from(raw, pos)
                pos += _BLOCK_LENGTH.size
                if block_len < 0 or pos + block_len > len(raw):
                    raise CorruptRecordError(f"xerial snappy block of {block_len} bytes overruns")
                block = raw[pos : pos + block_len]
                declared = _declared_length(block)
                total += declared
                if total > limit_bytes:
                    break
                blocks.append((block, declared))
                pos += block_len
        if total > limit_bytes:
            raise _too_large(Compression.SNAPPY, limit_bytes)
        out = bytearray(total)
        view = memoryview(out)
        at = 0
        for block, declared in blocks:
            written = cramjam.snappy.decompress_raw_into(block, view[at : at + declared])
            if written != declared:
                raise CorruptRecordError(
                    f"a snappy block declared {declared} bytes and decompressed to {written}"
                )
            at += declared
        view.release()
        return out
    except CorruptRecordError:
        raise
    except Exception as exc:
        raise CorruptRecordError(f"cannot decompress SNAPPY records: {exc}") from None


def _declared_length(block: memoryview) -> int:
    return int(cramjam.snappy.decompress_raw_len(block))
