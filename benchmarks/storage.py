"""Storage benchmark: PartitionLog appends with group commit vs raw os.write + fdatasync, and
PartitionLog.read regions sent with os.sendfile vs raw os.sendfile of the same files.

    python -m benchmarks.storage [--seconds 10] [--appenders 8]

The last stdout line is one JSON object:
{"append_mb_s", "baseline_mb_s", "ratio", "read_mb_s", "read_baseline_mb_s", "read_ratio"}.
The two sides of each pair alternate in slices so drift on a shared disk hits both alike.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import trio

from benchmarks.common import console, emit_result, mb_per_s, progress, socket_sink
from raftlog.constants import MIB
from raftlog.records import Record, build_batch
from raftlog.storage import Flusher, LogConfig, PartitionLog

RECORD_BYTES = 1024
BATCH_BYTES = 16 * 1024
READ_CHUNK_BYTES = 1 * MIB
SLICES = 4  # alternations per pair
RAW_ROUNDS = [0]


def make_batch() -> bytes:
    count = BATCH_BYTES // RECORD_BYTES
    value = os.urandom(RECORD_BYTES - 16)
    return build_batch(
        [Record(key=b"key-%08d" % i, value=value, timestamp_ms=0) for i in range(count)]
    )


async def append_engine(
    lg: PartitionLog, flusher: Flusher, batch: bytes, appenders: int, seconds: float, bar
) -> int:
    written = 0
    deadline = trio.current_time() + seconds

    async def appender() -> None:
        nonlocal written
        while trio.current_time() < deadline:
            info = lg.append_as_leader(batch, leader_epoch=1, now_ms=int(time.time() * 1000))
            await flusher.flush(lg, info.last_offset + 1)  # acknowledged = durable
            written += len(batch)
            bar.tick()

    async with trio.open_nursery() as nursery:
        for _ in range(appenders):
            nursery.start_soon(appender)
    return written


async def append_raw(path: Path, batch: bytes, appenders: int, seconds: float, bar) -> int:
    """The same group commit done by hand: os.write, then one fdatasync for all waiters."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    written = 0
    synced = 0
    wanted = trio.Event()
    synced_event = trio.Event()
    deadline = trio.current_time() + seconds

    async def syncer() -> None:
        nonlocal synced, wanted, synced_event
        while True:
            await wanted.wait()
            wanted = trio.Event()
            target = written_positions[0]
            await trio.to_thread.run_sync(os.fdatasync, fd)
            RAW_ROUNDS[0] += 1
            synced = target
            done, synced_event = synced_event, trio.Event()
            done.set()

    written_positions = [0]

    async def appender() -> None:
        nonlocal written
        while trio.current_time() < deadline:
            os.write(fd, batch)
            written_positions[0] += len(batch)
            end = written_positions[0]
            while synced < end:
                wanted.set()
                await synced_event.wait()
            written += len(batch)
            bar.tick()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(syncer)
            async with trio.open_nursery() as writers:
                for _ in range(appenders):
                    writers.start_soon(appender)
            nursery.cancel_scope.cancel()
    finally:
        os.close(fd)
    return written


async def read_engine(lg: PartitionLog, sink, seconds: float, bar) -> int:
    sent = 0
    offset = lg.log_start_offset
    deadline = trio.current_time() + seconds
    while trio.current_time() < deadline:
        result = lg.read(offset, READ_CHUNK_BYTES)
        if not result.regions:
            offset = lg.log_start_offset
            continue
        for region in result.regions:
            sent += await sink.sendfile(region.fd, region.position, region.length_bytes)
        offset = result.next_offset
        bar.tick()
    return sent


async def read_raw(paths: list[Path], sink, seconds: float, bar) -> int:
    sent = 0
    deadline = trio.current_time() + seconds
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    sizes = [os.fstat(fd).st_size for fd in fds]
    try:
        while trio.current_time() < deadline:
            for fd, size in zip(fds, sizes, strict=True):
                pos = 0
                while pos < size and trio.current_time() < deadline:
                    count = min(READ_CHUNK_BYTES, size - pos)
                    sent += await sink.sendfile(fd, pos, count)
                    pos += count
                    bar.tick()
    finally:
        for fd in fds:
            os.close(fd)
    return sent


async def main_async(seconds: float, appenders: int, directory: Path) -> dict[str, float]:
    batch = make_batch()
    config = LogConfig(segment_bytes=256 * MIB, flush_policy="always")
    lg = PartitionLog.open(directory / "bench-0", config, now_ms=int(time.time() * 1000))
    flusher = Flusher()
    slice_s = seconds / SLICES
    engine_bytes = raw_bytes = 0
    engine_time = raw_time = 0.0
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        with progress("append: engine vs raw", 2 * seconds) as bar:
            for i in range(SLICES):
                start = trio.current_time()
                engine_bytes += await append_engine(lg, flusher, batch, appenders, slice_s, bar)
                engine_time += trio.current_time() - start
                start = trio.current_time()
                raw_bytes += await append_raw(
                    directory / f"raw-{i}.bin", batch, appenders, slice_s, bar
                )
                raw_time += trio.current_time() - start
        nursery.cancel_scope.cancel()
    console.print(
        f"append: {engine_bytes / MIB:.0f} MiB in {engine_time:.1f}s with "
        f"{flusher.fsync_rounds} fsync rounds; raw {raw_bytes / MIB:.0f} MiB in {raw_time:.1f}s "
        f"with {RAW_ROUNDS[0]} fdatasync rounds"
    )
    paths = [s.log_path for s in lg.segments]
    read_s = max(1.0, seconds / 2)
    read_bytes = raw_read_bytes = 0
    read_time = raw_read_time = 0.0
    async with socket_sink() as sink:
        with progress("read: regions vs raw sendfile", 2 * read_s) as bar:
            for _ in range(SLICES):
                start = trio.current_time()
                read_bytes += await read_engine(lg, sink, read_s / SLICES, bar)
                read_time += trio.current_time() - start
                start = trio.current_time()
                raw_read_bytes += await read_raw(paths, sink, read_s / SLICES, bar)
                raw_read_time += trio.current_time() - start
    lg.close()
    append_mb_s = mb_per_s(engine_bytes, engine_time)
    baseline_mb_s = mb_per_s(raw_bytes, raw_time)
    read_mb_s = mb_per_s(read_bytes, read_time)
    read_baseline_mb_s = mb_per_s(raw_read_bytes, raw_read_time)
    return {
        "append_mb_s": append_mb_s,
        "baseline_mb_s": baseline_mb_s,
        "ratio": round(append_mb_s / baseline_mb_s, 3) if baseline_mb_s else 0.0,
        "read_mb_s": read_mb_s,
        "read_baseline_mb_s": read_baseline_mb_s,
        "read_ratio": round(read_mb_s / read_baseline_mb_s, 3) if read_baseline_mb_s else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="append time per side")
    parser.add_argument("--appenders", type=int, default=8, help="concurrent appender tasks")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: tmp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raftlog-bench-", dir=args.dir) as tmp:
        result = trio.run(main_async, args.seconds, args.appenders, Path(tmp))
    emit_result(result)


if __name__ == "__main__":
    main()
