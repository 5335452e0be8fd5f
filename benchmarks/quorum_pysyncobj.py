"""One pysyncobj node for the metadata-quorum benchmark's baseline (benchmarks/quorum.py).

    python -m benchmarks.quorum_pysyncobj --self 127.0.0.1:P1 --partners 127.0.0.1:P2,... \
        --dir DIR --commands N --window W

Three of these run as separate processes on loopback, each with a file journal and a full-dump
file. The node that becomes leader issues `--commands` small replicated commands, keeping
`--window` of them in flight (callbacks, no blocking calls), and prints one JSON line:
{"commands", "seconds", "commands_per_s"}. The others just replicate until terminated.

The node ticks pysyncobj itself (autoTick=False), so there is no extra thread: the loop is
doTick → issue more commands from the completion callbacks → doTick.

Durability as far as pysyncobj allows: its FileJournal writes entries into an mmap and never
msyncs them before acknowledging (flush only at shutdown), and it has no option to change
that; term/vote go to a meta file without fsync either. So the baseline acknowledges commits
that live only in the page cache, a weaker promise than raftlog's fsync-before-ack.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

# How long one doTick may block waiting for network events.
TICK_WAIT_S = 0.002
# The whole run (election + commands) must finish within this, or the node gives up.
RUN_TIMEOUT_S = 600.0


class Registry(SyncObj):
    """A replicated key → value map: the pysyncobj analogue of a small metadata write."""

    def __init__(self, self_address: str, partners: list[str], conf: SyncObjConf) -> None:
        super().__init__(self_address, partners, conf=conf)
        self.values: dict[str, int] = {}

    @replicated
    def put(self, key: str, value: int) -> int:
        self.values[key] = value
        return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--self", dest="self_address", required=True)
    parser.add_argument("--partners", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--commands", type=int, required=True)
    parser.add_argument("--window", type=int, default=64)
    args = parser.parse_args(argv)

    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    conf = SyncObjConf(
        autoTick=False,
        journalFile=str(directory / "journal.bin"),
        fullDumpFile=str(directory / "dump.bin"),
        # Never compact during the run: a dump would pause the leader mid-measurement.
        logCompactionMinEntries=10**9,
        logCompactionMinTime=10**9,
    )
    node = Registry(args.self_address, [p for p in args.partners.split(",") if p], conf)

    stopping = [False]

    def stop(_signum: int, _frame: Any) -> None:
        stopping[0] = True

    signal.signal(signal.SIGTERM, stop)
    deadline = time.monotonic() + RUN_TIMEOUT_S

    # Wait for a leader; only the leader drives the load (the baseline's best case: no
    # forwarding hop, no client protocol).
    while not stopping[0] and time.monotonic() < deadline:
        node.doTick(TICK_WAIT_S)
        if node.isReady() and node._getLeader() is not None:
            break
    while not stopping[0] and time.monotonic() < deadline and not node._isLeader():
        node.doTick(TICK_WAIT_S)
    if stopping[0] or time.monotonic() >= deadline:
        node.destroy()
        return 0

    issued = 0
    done = 0
    failed = 0

    def on_done(_result: Any, error: int) -> None:
        nonlocal done, failed
        if error == FAIL_REASON.SUCCESS:
            done += 1
        else:
            failed += 1
        issue_more()

    def issue_more() -> None:
        nonlocal issued
        while issued < args.commands and issued - done - failed < args.window:
            node.put(f"key-{issued % 1024}", issued, callback=on_done)
            issued += 1

    started = time.monotonic()
    issue_more()
    while done + failed < args.commands and not stopping[0] and time.monotonic() < deadline:
        node.doTick(TICK_WAIT_S)
        if issued - done - failed < args.window:
            issue_more()
    seconds = time.monotonic() - started
    print(
        json.dumps(
            {
                "commands": done,
                "failed": failed,
                "seconds": round(seconds, 3),
                "commands_per_s": round(done / seconds, 1) if seconds > 0 else 0.0,
            }
        ),
        flush=True,
    )
    node.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
