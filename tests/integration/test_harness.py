"""The process harness itself, with stand-in processes instead of nodes (fast)."""

import signal
import subprocess
import sys

from raftlog.testing.cluster import ProcessCluster

# Exits with 0 on SIGTERM, like a node after its controlled shutdown.
GRACEFUL = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "print('up', flush=True)\n"
    "time.sleep(60)\n"
)


def _stand_in(cluster: ProcessCluster, node_id: int) -> None:
    node = cluster.nodes[node_id]
    node.process = subprocess.Popen(
        [sys.executable, "-c", GRACEFUL], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    assert node.process.stdout.readline() == b"up\n"  # the handler is installed


def test_a_node_stopped_with_sigterm_is_not_an_unexpected_exit(tmp_path):
    cluster = ProcessCluster(tmp_path, 2)
    _stand_in(cluster, 1)
    _stand_in(cluster, 2)
    try:
        cluster.kill(1, signal.SIGTERM)
        assert cluster.nodes[1].process.returncode == 0
        polls = iter([False, True])
        assert cluster.wait_for(lambda: next(polls), "the second poll", timeout_s=10)
    finally:
        cluster.stop()


def test_polling_with_every_node_stopped_does_not_spin(tmp_path):
    cluster = ProcessCluster(tmp_path, 1)
    calls = 0

    def never() -> bool:
        nonlocal calls
        calls += 1
        return False

    try:
        cluster.wait_for(never, "nothing", timeout_s=0.3)
    except TimeoutError:
        pass
    # One poll per 50 ms pause, not a busy loop.
    assert calls <= 10, calls
