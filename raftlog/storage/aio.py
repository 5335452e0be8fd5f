"""fdatasync without a worker thread: Linux native AIO (IOCB_CMD_FDSYNC, Linux 4.18+).

A flush round hands its fdatasyncs to the kernel with io_submit, which returns at once (the
kernel runs each fsync from its own workqueue), and waits for their ends on an eventfd the
event loop watches. The loop never blocks on the disk (the design's rule 6), and no Python
thread wakes, takes the GIL and wakes the loop back for each fsync: under the transactions
benchmark's four producers that cut the nodes' CPU per transaction by 12-15 % (docs/results.md,
Transactions).

Where this cannot work (another OS or architecture, a kernel without it, io_setup refused by
a sandbox or by fs.aio-max-nr) `FsyncRing.open` returns None and the flusher keeps its worker
threads. Linux-only and hand-packed because the standard library has no binding for it; the
structures are the kernel's stable ABI (include/uapi/linux/aio_abi.h).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import struct
import sys
from collections.abc import Sequence

import trio

log = logging.getLogger("raftlog.storage")

# (io_setup, io_destroy, io_submit, io_getevents) syscall numbers per architecture.
_SYSCALLS = {
    "x86_64": (206, 207, 209, 208),
    "aarch64": (0, 1, 2, 4),
}
IOCB_CMD_FDSYNC = 3
IOCB_FLAG_RESFD = 1  # signal the completion on the eventfd in aio_resfd
# struct iocb: aio_data, aio_key, aio_rw_flags, aio_lio_opcode, aio_reqprio, aio_fildes,
# aio_buf, aio_nbytes, aio_offset, aio_reserved2, aio_flags, aio_resfd (little-endian).
_IOCB = struct.Struct("<QIIHhIQQqQII")
# struct io_event: data, obj, res, res2.
_IO_EVENT = struct.Struct("<QQqq")
# Submission errors that say the kernel or the file cannot do this at all (not a disk error).
_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM})


class FsyncRing:
    """One AIO context and its eventfd: one flush round at a time uses it."""

    def __init__(self, libc: ctypes.CDLL, calls: tuple[int, int, int, int], capacity: int) -> None:
        self._libc = libc
        self._setup, self._destroy, self._submit, self._getevents = calls
        self.capacity = capacity
        self._context = ctypes.c_ulong(0)
        if libc.syscall(self._setup, ctypes.c_long(capacity), ctypes.byref(self._context)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"io_setup: {os.strerror(err)}")
        try:
            self._eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except OSError:
            libc.syscall(self._destroy, self._context)
            raise
        self._iocb = ctypes.create_string_buffer(_IOCB.size)
        self._iocb_list = (ctypes.c_void_p * 1)(ctypes.addressof(self._iocb))
        self._events = ctypes.create_string_buffer(_IO_EVENT.size * capacity)
        self._no_wait = (ctypes.c_long * 2)(0, 0)  # a zero timespec: io_getevents never blocks
        self.closed = False
        # Why the kernel refused AIO fsync outright (set once it did): use threads from then on.
        self.unsupported: str | None = None

    @classmethod
    def open(cls, capacity: int) -> FsyncRing | None:
        """A ring for up to `capacity` fsyncs in flight, or None where AIO fsync is not to be
        had (the caller then uses threads)."""
        calls = _SYSCALLS.get(platform.machine())
        if not sys.platform.startswith("linux") or calls is None or not hasattr(os, "eventfd"):
            return None
        try:
            return cls(ctypes.CDLL(None, use_errno=True), calls, capacity)
        except OSError as exc:
            log.info("fsyncs go through worker threads: %s", exc)
            return None

    async def fdatasync(self, fds: Sequence[int]) -> list[int | None]:
        """fdatasync every fd of `fds` (at most `capacity`), all at once. Per fd: 0 when it is
        durable, an errno when the fsync failed, None when the kernel refused to take it (the
        caller syncs those another way). Not cancellable: a round never abandons its fsyncs."""
        if len(fds) > self.capacity:
            raise ValueError(f"{len(fds)} fsyncs at once, the ring holds {self.capacity}")
        results: list[int | None] = [None] * len(fds)
        in_flight = 0
        for index, fd in enumerate(fds):
            _IOCB.pack_into(
                self._iocb, 0, index, 0, 0, IOCB_CMD_FDSYNC, 0, fd, 0, 0, 0, 0,
                IOCB_FLAG_RESFD, self._eventfd,
            )  # fmt: skip
            if (
                self._libc.syscall(self._submit, self._context, ctypes.c_long(1), self._iocb_list)
                == 1
            ):
                in_flight += 1
                continue
            err = ctypes.get_errno()
            if err in _UNSUPPORTED:
                # No AIO fsync here at all: the rest go the caller's other way too.
                self.unsupported = os.strerror(err)
                break
            log.warning("io_submit of an fdatasync failed: %s", os.strerror(err))
        with trio.CancelScope(shield=True):
            while in_flight:
                await trio.lowlevel.wait_readable(self._eventfd)
                try:
                    os.eventfd_read(self._eventfd)
                except BlockingIOError:
                    continue
                in_flight -= self._reap(results)
        return results

    def _reap(self, results: list[int | None]) -> int:
        got = self._libc.syscall(
            self._getevents,
            self._context,
            ctypes.c_long(0),
            ctypes.c_long(self.capacity),
            self._events,
            self._no_wait,
        )
        if got < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"io_getevents: {os.strerror(err)}")
        for i in range(got):
            index, _, res, _ = _IO_EVENT.unpack_from(self._events, i * _IO_EVENT.size)
            results[index] = -res if res < 0 else 0
        return got

    def close(self) -> None:
        """Release the context (only with nothing in flight) and its eventfd."""
        if self.closed:
            return
        self.closed = True
        self._libc.syscall(self._destroy, self._context)
        os.close(self._eventfd)
