"""Real namespaces and real dropped packets, with plain python processes (no node needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio

from jepsen import netns
from tests.waiting import wait_until

MISSING = netns.missing_prerequisites()
needs_netns = pytest.mark.skipif(
    bool(MISSING), reason="needs root, ip and nft: " + "; ".join(MISSING)
)

PORT = 7777
CONNECT_TIMEOUT_S = 1.0
DEADLINE_S = 15.0

SERVER = f"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {PORT}))
s.listen(16)
while True:
    c, _ = s.accept()
    c.sendall(b"hi")
    c.close()
"""

CLIENT = """
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    sys.exit(0 if c.recv(2) == b"hi" else 1)
except OSError:
    sys.exit(1)
"""


async def can_connect(net: netns.RunNetwork, src: str | None, dst: str) -> bool:
    argv = [sys.executable, "-c", CLIENT, net.address(dst), str(PORT), str(CONNECT_TIMEOUT_S)]
    if src is not None:
        argv = net.exec_argv(src, argv)
    proc = await trio.run_process(argv, check=False, capture_stdout=True, capture_stderr=True)
    return proc.returncode == 0


@pytest.mark.cluster
@needs_netns
async def test_partition_drops_packets_and_heal_restores_them() -> None:
    net = netns.create_network(["n1", "n2", "n3"])
    servers = []
    try:
        assert set(net.node_names) == {"n1", "n2", "n3"}
        for node in ("n1", "n2"):
            servers.append(
                await trio.lowlevel.open_process(
                    net.exec_argv(node, [sys.executable, "-c", SERVER]),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

        async def all_connected() -> bool:
            return (
                await can_connect(net, "n2", "n1")
                and await can_connect(net, "n1", "n2")
                and await can_connect(net, None, "n1")
            )

        await wait_until("servers up and reachable before the partition", all_connected, DEADLINE_S)

        await net.apply_grudge({"n1": ["n2"], "n2": ["n1"]})
        assert not await can_connect(net, "n2", "n1")
        assert not await can_connect(net, "n1", "n2")
        # Only the grudge is cut: n3 and the host (the workload's clients) still get through.
        assert await can_connect(net, "n3", "n1")
        assert await can_connect(net, None, "n1")
        assert await can_connect(net, None, "n2")

        await net.heal()
        assert await can_connect(net, "n2", "n1")
        assert await can_connect(net, "n1", "n2")
    finally:
        removed = net.destroy()
        for proc in servers:
            with trio.fail_after(DEADLINE_S):
                await proc.wait()  # destroy SIGKILLed everything inside the namespaces
    assert net.namespace("n1") in removed and net.bridge in removed
    assert not any(
        ns.startswith(f"{netns.NETNS_PREFIX}{net.run_number}-") for ns in netns.list_namespaces()
    )
    assert net.bridge not in netns.list_bridges()


def test_grudge_script_is_one_atomic_transaction() -> None:
    script = netns.grudge_script(["10.77.3.2", "10.77.3.1"])
    assert script == (
        "flush chain inet jepsen input\n"
        "add rule inet jepsen input ip saddr { 10.77.3.1, 10.77.3.2 } drop\n"
    )
    assert netns.grudge_script([]) == "flush chain inet jepsen input\n"


def test_addresses_stay_inside_the_run_subnet() -> None:
    net = netns.RunNetwork(7, ("n1", "n2", "n3", "n4", "n5"))
    assert [net.address(n) for n in net.node_names] == [f"10.77.7.{i}" for i in range(1, 6)]
    assert net.host_address == "10.77.7.254"
    # Linux interface names are at most 15 bytes.
    assert all(len(net.veth(n)) <= 15 for n in net.node_names) and len(net.bridge) <= 15


@needs_netns
def test_a_lingering_veth_keeps_its_run_number_in_use() -> None:
    # A namespace deleted while its killed processes still exit keeps its veth pair for a
    # moment; the next run must not take that run number (it would collide: "File exists").
    subprocess.run(
        ["ip", "link", "add", "jv97n1", "type", "veth", "peer", "name", "jv97x"], check=True
    )
    try:
        assert 97 in netns.used_run_numbers()
    finally:
        subprocess.run(["ip", "link", "del", "jv97n1"], check=False)
    assert 97 not in netns.used_run_numbers()
