"""The module graph of raftlog/: no import cycles, no upward imports, sans-IO cores.

Every `import` counts, including those inside functions and under TYPE_CHECKING: a cycle
broken by a lazy import is still two modules that cannot be understood apart.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import raftlog

PACKAGE_DIR = Path(raftlog.__file__).parent

# Layers, lowest first: a module may import from its own layer or a lower one. The most
# specific prefix names a module's layer. docs/architecture.md draws the same picture.
LAYERS: tuple[tuple[str, ...], ...] = (
    # 0: vocabulary every module may use
    (
        "raftlog",
        "raftlog.errors",
        "raftlog.constants",
        "raftlog.clock",
        "raftlog.concurrency",
        "raftlog.kio_private",
        "raftlog.codec",
        "raftlog.codec_checks",
        "raftlog.epochs",
    ),
    # 1: configuration and the Kafka record format
    (
        "raftlog.config",
        "raftlog.config_keys",
        "raftlog.config_listeners",
        "raftlog.compression",
        "raftlog.records",
        "raftlog.batch_validation",
    ),
    # 2: disk, framing and internal RPC, declared messages and records, the Kafka-facing
    # seam types, the client
    (
        "raftlog.storage",
        "raftlog.net.framing",
        "raftlog.net.limits",
        "raftlog.net.wire",
        "raftlog.net.rpc",
        "raftlog.net.tls",
        "raftlog.net.kafka.backend",
        "raftlog.metadata.records",
        "raftlog.metadata.controller.messages",
        "raftlog.quotas.entity",
        "raftlog.client",
        "raftlog.security",
        # metric instruments and the /metrics endpoint (the hot paths of layers 3-6 use them)
        "raftlog.metrics",
    ),
    # 3: the metadata image; the sans-IO cores and the services' state machines
    (
        "raftlog.metadata.image",
        "raftlog.metadata.snapshot",
        "raftlog.metadata.raft",
        "raftlog.metadata.controller",
        "raftlog.replication.core",
        "raftlog.groups",
        "raftlog.txn",
        "raftlog.quotas",
        "raftlog.spark",
    ),
    # 4: services over those cores
    ("raftlog.metadata.service", "raftlog.replication", "raftlog.metrics.health"),
    # 5: the broker's side of the controller, node glue for groups, transactions and quotas
    (
        "raftlog.metadata.controller.broker_lifecycle",
        "raftlog.groups.node_service",
        "raftlog.txn.node_service",
        "raftlog.quotas.usage_rpc",
        "raftlog.quotas.broker_hook",
        "raftlog.metrics.collectors",
    ),
    # 6: the Kafka protocol server and the broker behind it
    ("raftlog.net.kafka", "raftlog.broker_configs", "raftlog.broker"),
    # 7: the composition root and test harnesses
    ("raftlog.node", "raftlog.testing", "raftlog.metrics.node"),
)

# The Raft core is sans-IO: no trio, no sockets, no clock, no threads; only its driver and
# log store do I/O. (tests/replication/test_core_is_sans_io.py holds the partition core to
# the same rule, and to never calling a log method that writes.)
SANS_IO_PACKAGES = ("raftlog.metadata.raft",)
SANS_IO_DRIVER_MODULES = ("raftlog.metadata.raft.driver", "raftlog.metadata.raft.log_store")
FORBIDDEN_IN_CORE = ("trio", "socket", "threading", "time", "os", "asyncio")


def module_files() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imported_names(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def import_graph() -> dict[str, set[str]]:
    modules = module_files()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = {resolve(name) for name in imported_names(path) if name.startswith("raftlog")}
        graph[module] = {t for t in targets if t and t != module and not module.startswith(t)}
    return graph


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for layer, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), layer)
    if best is None:
        raise AssertionError(f"{module} has no layer in LAYERS: add it where it belongs")
    return best[1]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_every_module_has_a_layer():
    for module in module_files():
        layer_of(module)


def test_no_upward_imports():
    upward = [
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
        for module, targets in sorted(import_graph().items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert upward == []


def test_the_raft_core_does_no_io():
    offenders = []
    for module, path in sorted(module_files().items()):
        if not module.startswith(SANS_IO_PACKAGES) or module.startswith(SANS_IO_DRIVER_MODULES):
            continue
        for name in imported_names(path):
            if name.split(".")[0] in FORBIDDEN_IN_CORE:
                offenders.append(f"{module} imports {name}")
    assert offenders == []
