"""`raftlog cluster up` in the foreground (what `make cluster` runs) stops its nodes when the
terminal goes away (SIGHUP), as it does on Ctrl-C and SIGTERM: closing the terminal must not
leave three nodes running with nobody to stop them."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import trio
from raftlog_cli import cluster_local as local

from tests.cli.test_cluster_e2e import RAFTLOG, free_base_port, run, wait_status

pytestmark = pytest.mark.cluster

STOP_DEADLINE_S = 60


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
async def test_foreground_up_stops_every_node_when_its_terminal_hangs_up(
    tmp_path: Path, signum: signal.Signals
) -> None:
    base = free_base_port(1)
    command = [*RAFTLOG, "cluster", "up", "--nodes", "1", "--base-port", str(base)]
    up = await trio.lowlevel.open_process(
        command,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await wait_status(tmp_path, True, lambda status: True)
        cluster = local.load_cluster(tmp_path / ".raftlog")
        assert cluster is not None
        pids = [local.running_pid(node) for node in cluster.nodes]
        assert all(pid is not None for pid in pids), pids
        up.send_signal(signum)
        with trio.fail_after(STOP_DEADLINE_S):
            assert await up.wait() == 0
        assert [local.running_pid(node) for node in cluster.nodes] == [None] * len(pids)
    finally:
        if up.poll() is None:
            up.kill()
        await run(tmp_path, "cluster", "down", check=False)
