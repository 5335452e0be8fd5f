"""Small verifiable state files: recovery point, log start, epoch cache, HW, quorum state.

File layout (all big endian):

    magic   4 bytes  b"RLCK"
    version u16      CHECKPOINT_VERSION
    kind    u8 length + utf-8 bytes (what the file holds; a mix-up is an error)
    length  u32      payload length
    crc     u32      CRC32C over everything before it (magic..payload)
    payload msgpack map

Written tmp -> fsync -> rename -> fsync(dir), so a reader sees the old or the new file, never a
torn one; a file that fails any check raises CheckpointError naming the file and the check.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import crc32c
import msgpack

from raftlog.errors import LocalError

CHECKPOINT_MAGIC = b"RLCK"
CHECKPOINT_VERSION = 1
MAX_CHECKPOINT_BYTES = 64 * 1024 * 1024  # a checkpoint is small; anything bigger is garbage


class CheckpointError(LocalError):
    """A checkpoint file is missing, of the wrong kind or version, or fails its checksum."""


def encode_checkpoint(kind: str, payload: dict[str, Any]) -> bytes:
    kind_bytes = kind.encode()
    if len(kind_bytes) > 255:
        raise ValueError(f"checkpoint kind {kind!r} is longer than 255 bytes")
    body = msgpack.packb(payload, use_bin_type=True)
    head = (
        CHECKPOINT_MAGIC
        + struct.pack(">HB", CHECKPOINT_VERSION, len(kind_bytes))
        + kind_bytes
        + struct.pack(">I", len(body))
    )
    crc = crc32c.crc32c(head + body)
    return head + body + struct.pack(">I", crc)


def decode_checkpoint(data: bytes, kind: str, source: str = "checkpoint") -> dict[str, Any]:
    if len(data) < 4 + 3 + 4 + 4 or data[:4] != CHECKPOINT_MAGIC:
        raise CheckpointError(f"{source}: not a raftlog checkpoint (bad magic or too short)")
    version, kind_len = struct.unpack_from(">HB", data, 4)
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"{source}: checkpoint version {version}, this build reads {CHECKPOINT_VERSION}"
        )
    pos = 7 + kind_len
    stored_kind = data[7:pos].decode("utf-8", "replace")
    if len(data) < pos + 8:
        raise CheckpointError(f"{source}: truncated checkpoint")
    (length,) = struct.unpack_from(">I", data, pos)
    pos += 4
    if len(data) != pos + length + 4:
        raise CheckpointError(
            f"{source}: size {len(data)} does not match payload length {length} (torn file?)"
        )
    (stored_crc,) = struct.unpack_from(">I", data, pos + length)
    actual = crc32c.crc32c(data[: pos + length])
    if actual != stored_crc:
        raise CheckpointError(
            f"{source}: checksum mismatch (stored {stored_crc:#010x}, computed {actual:#010x})"
        )
    if stored_kind != kind:
        raise CheckpointError(f"{source}: holds a {stored_kind!r} checkpoint, expected {kind!r}")
    payload = msgpack.unpackb(data[pos : pos + length], raw=False, strict_map_key=False)
    if not isinstance(payload, dict):
        raise CheckpointError(f"{source}: payload is not a map")
    return payload


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(path: Path, kind: str, payload: dict[str, Any]) -> None:
    """Atomically replace `path` (blocking: call from a worker thread on hot paths)."""
    path = Path(path)
    data = encode_checkpoint(kind, payload)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_checkpoint(path: Path, kind: str) -> dict[str, Any]:
    """Read and verify; raises CheckpointError (FileNotFoundError if absent)."""
    path = Path(path)
    if path.stat().st_size > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(f"{path}: {path.stat().st_size} bytes is too large for a checkpoint")
    return decode_checkpoint(path.read_bytes(), kind, str(path))
