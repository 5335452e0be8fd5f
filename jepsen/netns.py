"""Network namespaces for a run: one namespace per node on a private bridge, and partitions
made of real dropped packets (nftables rules inside the namespaces).

Layout of run ``r`` (1..MAX_RUN_NUMBER) with nodes ``n1..nN``:

    host (root namespace)  bridge jbr<r>  10.77.<r>.254/24   <- the workload's clients
    namespace jepsen<r>-n<i>   eth0 10.77.<r>.<i>/24  (veth peer jv<r>n<i> on the bridge)

Every address is private to the run and lives only on that bridge and inside the namespaces
the run created; nothing here routes anywhere else. A partition is a "grudge": for each node,
the set of peers whose packets it drops on input. Grudges are symmetric, so input drops on
both sides cut both directions, and the traffic is dropped (never rejected) so peers see real
timeouts, as they would on a broken network. The client address is never dropped: Jepsen's
clients reach nodes through the control plane, which partitions do not cut.

Setup and teardown are short blocking calls made before and after the workload; partition and
heal during a run go through ``trio.run_process``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import trio

NETNS_PREFIX = "jepsen"
BRIDGE_PREFIX = "jbr"
VETH_PREFIX = "jv"
SUBNET_PREFIX = "10.77"
HOST_OCTET = 254
MAX_RUN_NUMBER = 250
MAX_NODES = 9
NFT_TABLE = "jepsen"
# Each ip/nft call is tiny; one that takes longer than this means the kernel or a tool hangs.
COMMAND_TIMEOUT_S = 20.0


class NetnsUnavailable(RuntimeError):
    """This machine cannot host a run's namespaces; the message says what is missing."""


def missing_prerequisites() -> list[str]:
    """What stops us from creating namespaces, bridges and nft rules (empty: nothing)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces need CAP_NET_ADMIN; run as root)")
    if shutil.which("ip") is None:
        missing.append("the `ip` command (apt-get install -y iproute2)")
    if shutil.which("nft") is None:
        missing.append("the `nft` command (apt-get install -y nftables)")
    if missing:
        return missing
    probe = f"{NETNS_PREFIX}-probe-{os.getpid()}"
    made = _run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        return [f"`ip netns add` failed: {made.stderr.strip()}"]
    try:
        nft = _run(_in_ns(probe, ["nft", "list", "ruleset"]), check=False)
        if nft.returncode != 0:
            missing.append(f"nftables inside a namespace: {nft.stderr.strip()}")
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return missing


def require_prerequisites() -> None:
    missing = missing_prerequisites()
    if missing:
        raise NetnsUnavailable("cannot create the run's network namespaces: " + "; ".join(missing))


def _run(
    argv: Sequence[str], *, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        list(argv),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _in_ns(ns: str, argv: Sequence[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def used_run_numbers() -> set[int]:
    """Run numbers whose namespaces or bridge exist (another run, or one not cleaned up)."""
    used = set()
    for ns in list_namespaces():
        head = ns.split("-", 1)[0][len(NETNS_PREFIX) :]
        if head.isdigit():
            used.add(int(head))
    for bridge in list_bridges():
        tail = bridge[len(BRIDGE_PREFIX) :]
        if tail.isdigit():
            used.add(int(tail))
    # A deleted namespace whose killed processes have not exited yet keeps its veth pair
    # alive for a moment; reusing that run number would collide with it.
    for veth in list_veths():
        digits = "".join(itertools.takewhile(str.isdigit, veth[len(VETH_PREFIX) :]))
        if digits:
            used.add(int(digits))
    return used


def list_namespaces() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(NETNS_PREFIX)]


def list_bridges() -> list[str]:
    out = _run(["ip", "-o", "link", "show", "type", "bridge"], check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            names.append(parts[1].strip().split("@")[0])
    return [n for n in names if n.startswith(BRIDGE_PREFIX) and n[len(BRIDGE_PREFIX) :].isdigit()]


def list_veths() -> list[str]:
    """Host-side veth ends this harness made (`jv<run><node>`), still present."""
    out = _run(["ip", "-o", "link", "show", "type", "veth"], check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            names.append(parts[1].strip().split("@")[0])
    return [n for n in names if n.startswith(VETH_PREFIX)]


def grudge_script(blocked_addresses: Sequence[str]) -> str:
    """nft commands replacing one namespace's input drops with drops from these addresses.

    One ``nft -f`` transaction: the flush and the new rule apply atomically, so a changing
    partition never passes through a fully connected instant.
    """
    lines = [f"flush chain inet {NFT_TABLE} input"]
    if blocked_addresses:
        lines.append(
            f"add rule inet {NFT_TABLE} input ip saddr {{ {', '.join(sorted(blocked_addresses))} }}"
            " drop"
        )
    return "\n".join(lines) + "\n"


BASE_RULESET = f"""table inet {NFT_TABLE} {{
    chain input {{
        type filter hook input priority 0; policy accept;
    }}
}}
"""


@dataclass(frozen=True)
class RunNetwork:
    """The namespaces and bridge of one run. Create with ``create_network``."""

    run_number: int
    node_names: tuple[str, ...]

    @property
    def bridge(self) -> str:
        return f"{BRIDGE_PREFIX}{self.run_number}"

    @property
    def host_address(self) -> str:
        return f"{SUBNET_PREFIX}.{self.run_number}.{HOST_OCTET}"

    def namespace(self, node: str) -> str:
        return f"{NETNS_PREFIX}{self.run_number}-{node}"

    def address(self, node: str) -> str:
        return f"{SUBNET_PREFIX}.{self.run_number}.{self.node_names.index(node) + 1}"

    def veth(self, node: str) -> str:
        return f"{VETH_PREFIX}{self.run_number}{node}"

    def exec_argv(self, node: str, argv: Sequence[str]) -> list[str]:
        """argv that runs a command inside the node's namespace (``ip netns exec`` execs it,
        so the pid a caller gets is the command's own)."""
        return _in_ns(self.namespace(node), argv)

    # ------------------------------------------------------------------ setup / teardown
    def _setup(self) -> None:
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.host_address}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for node in self.node_names:
            ns, veth = self.namespace(node), self.veth(node)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
            _run(["ip", "link", "set", veth, "master", self.bridge])
            _run(["ip", "link", "set", veth, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(_in_ns(ns, ["nft", "-f", "-"]), stdin=BASE_RULESET)

    def destroy(self) -> list[str]:
        """Kill whatever still runs in the namespaces, delete them and the bridge. Idempotent;
        returns what it removed."""
        removed = []
        existing = set(list_namespaces())
        for node in self.node_names:
            ns = self.namespace(node)
            if ns in existing:
                kill_namespace_processes(ns)
                _run(["ip", "netns", "del", ns], check=False)
                removed.append(ns)
        # Deleting one end of a veth pair deletes both; do it explicitly, since a namespace
        # whose processes are still exiting lingers (and keeps its veth) after `netns del`.
        veths = set(list_veths())
        for node in self.node_names:
            veth = self.veth(node)
            if veth in veths:
                _run(["ip", "link", "del", veth], check=False)
                removed.append(veth)
        if self.bridge in list_bridges():
            _run(["ip", "link", "del", self.bridge], check=False)
            removed.append(self.bridge)
        return removed

    # ------------------------------------------------------------------ partitions
    async def apply_grudge(self, grudge: Mapping[str, Sequence[str]]) -> None:
        """Make each node drop packets from the nodes its grudge names; nodes not in the
        grudge hear everyone."""
        for node in self.node_names:
            blocked = [self.address(peer) for peer in grudge.get(node, ())]
            await trio.run_process(
                _in_ns(self.namespace(node), ["nft", "-f", "-"]),
                stdin=grudge_script(blocked).encode(),
                capture_stdout=True,
                capture_stderr=True,
            )

    async def heal(self) -> None:
        await self.apply_grudge({})


def create_network(node_names: Sequence[str], run_number: int | None = None) -> RunNetwork:
    """Create the bridge and one namespace per node (blocking, a few dozen ip calls). On any
    failure what was made is removed again before the error propagates."""
    if not 1 <= len(node_names) <= MAX_NODES:
        raise ValueError(f"a run has 1..{MAX_NODES} nodes, got {len(node_names)}")
    require_prerequisites()
    if run_number is None:
        free = sorted(set(range(1, MAX_RUN_NUMBER + 1)) - used_run_numbers())
        if not free:
            raise NetnsUnavailable(
                f"all {MAX_RUN_NUMBER} run numbers are in use: `python -m jepsen cleanup`"
            )
        run_number = free[0]
    if not 1 <= run_number <= MAX_RUN_NUMBER:
        raise ValueError(f"run_number must be in 1..{MAX_RUN_NUMBER}, got {run_number}")
    net = RunNetwork(run_number, tuple(node_names))
    try:
        net._setup()
    except BaseException:
        net.destroy()
        raise
    return net


def kill_namespace_processes(ns: str) -> int:
    """SIGKILL every process inside a namespace; returns how many were signalled."""
    out = _run(["ip", "netns", "pids", ns], check=False).stdout
    killed = 0
    for token in out.split():
        if token.isdigit():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(token), signal.SIGKILL)
                killed += 1
    return killed


def cleanup_all() -> list[str]:
    """Remove every namespace and bridge any run made (after a crashed harness). Touches only
    names with this harness's prefixes."""
    removed = []
    for ns in list_namespaces():
        kill_namespace_processes(ns)
        _run(["ip", "netns", "del", ns], check=False)
        removed.append(ns)
    for veth in list_veths():
        _run(["ip", "link", "del", veth], check=False)
        removed.append(veth)
    for bridge in list_bridges():
        _run(["ip", "link", "del", bridge], check=False)
        removed.append(bridge)
    return removed
