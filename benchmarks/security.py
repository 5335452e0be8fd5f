"""Security benchmark: what TLS, SASL and the ACL authorizer cost a client.

    python -m benchmarks.security [--seconds 5] [--rounds 5] [--acls 10000]

Two clusters of three real node processes (raftlog.testing.cluster), each node with a
PLAINTEXT and a SASL_SSL (SCRAM-SHA-512) listener and mutual TLS between the nodes; the
second one also runs the ACL authorizer holding `--acls` ACLs. The same confluent-kafka
clients and settings measure, on one RF 3 single-partition topic:

- produce throughput, acks=all: SASL_SSL / PLAINTEXT (target >= 0.6);
- consumer fetch throughput from the start of the topic: SASL_SSL / PLAINTEXT (target >= 0.4;
  TLS has no sendfile, Kafka pays the same);
- produce throughput over SASL_SSL as a user whose ALLOW WRITE is one of the authorizer's
  ACLs / the same user with the authorizer off (target >= 0.95).

Each pair is measured in `--rounds` rounds, the two sides alternating which goes first, so
drift on a shared machine hits both alike; a ratio is the median of the rounds' ratios, so
one round that a burst of load from elsewhere hit on one side does not decide it (the
per-round throughputs are in the JSON too). The last stdout line is one JSON object:
{"produce_tls_ratio", "fetch_tls_ratio", "authorizer_ratio", ... the raw bytes/s of each side
and round}.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from benchmarks.common import console, emit_result, stream_acked_bytes_per_s
from raftlog.constants import MIB
from raftlog.net.tls import node_common_name

VALUE_BYTES = 1000
PRODUCER_BATCH_BYTES = 256 * 1024
TOPIC = "security-bench"
ADMIN_USER, ADMIN_PASSWORD = "admin", "admin-bench-secret"
# The produce side of the authorizer comparison: not a super user, so every Produce is
# decided by the ACLs.
BENCH_USER, BENCH_PASSWORD = "bench", "bench-secret"
SCRAM_ITERATIONS = 4096
ACL_BATCH = 1000
CLIENT_TIMEOUT_S = 60.0
# A fetch round stops at the end of the topic; it is never longer than this many seconds.
FETCH_MAX_S = 20.0
TARGETS = {"produce_tls_ratio": 0.6, "fetch_tls_ratio": 0.4, "authorizer_ratio": 0.95}


@dataclass
class BenchCluster:
    """A running ProcessCluster and the per-node ports of its two listeners."""

    cluster: Any  # raftlog.testing.cluster.ProcessCluster
    ports: dict[int, dict[str, int]]
    ca: str

    def bootstrap(self, listener: str) -> str:
        return ",".join(f"127.0.0.1:{p[listener]}" for p in self.ports.values())

    def client(
        self, listener: str, user: str = ADMIN_USER, password: str = ADMIN_PASSWORD
    ) -> dict[str, Any]:
        """confluent-kafka settings for `listener` (the user only matters on SASL_SSL)."""
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap(listener)}
        if listener == "SASL_SSL":
            config |= {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": user,
                "sasl.password": password,
                "ssl.ca.location": self.ca,
            }
        return config


def _scram_entry(user: str, password: str) -> str:
    """A bootstrap_scram_credentials entry (kafka-storage format --add-scram's syntax)."""
    from raftlog.security.acl import ScramMechanism
    from raftlog.security.scram import bootstrap_entry

    return bootstrap_entry(
        ScramMechanism.SCRAM_SHA_512, user, password, iterations=SCRAM_ITERATIONS
    )


@contextmanager
def secure_cluster(root: Path, *, authorizer: bool) -> Iterator[BenchCluster]:
    """Three nodes: PLAINTEXT (the harness's readiness probe) and SASL_SSL listeners,
    internal mutual TLS, the admin and the bench user seeded; the authorizer if asked."""
    from raftlog.security import certs
    from raftlog.testing.cluster import ProcessCluster, free_ports

    pki = root / "pki"
    pki.mkdir(parents=True)
    ca = certs.make_ca("raftlog security benchmark CA")
    ca_path = pki / "ca.pem"
    ca_path.write_bytes(ca.cert_pem)
    node_files = {}
    for node_id in (1, 2, 3):
        issued = certs.issue_certificate(ca, node_common_name(node_id))
        cert, key = pki / f"node-{node_id}.pem", pki / f"node-{node_id}.key"
        cert.write_bytes(issued.cert_pem)
        key.write_bytes(issued.key_pem)
        key.chmod(0o600)
        node_files[node_id] = (str(cert), str(key))
    overrides: dict[str, Any] = {
        "sasl_enabled_mechanisms": "SCRAM-SHA-512",
        "internal_security_protocol": "SSL",
        "ssl_client_auth": "none",
        "ssl_certificate_location": node_files[1][0],
        "ssl_key_location": node_files[1][1],
        "ssl_ca_location": str(ca_path),
        "bootstrap_scram_credentials": ";".join(
            [_scram_entry(ADMIN_USER, ADMIN_PASSWORD), _scram_entry(BENCH_USER, BENCH_PASSWORD)]
        ),
    }
    if authorizer:
        overrides |= {
            "authorizer_class_name": "StandardAuthorizer",
            "super_users": f"User:{ADMIN_USER}",
        }
    cluster = ProcessCluster(root / "cluster", 3, overrides=overrides)
    extra = free_ports(3)
    ports: dict[int, dict[str, int]] = {}
    for index, (node_id, node) in enumerate(sorted(cluster.nodes.items())):
        plaintext = int(node.config.client_listener.rsplit(":", 1)[1])
        ports[node_id] = {"PLAINTEXT": plaintext, "SASL_SSL": extra[index]}
        config = dataclasses.replace(
            node.config,
            listeners=",".join(f"{name}://127.0.0.1:{p}" for name, p in ports[node_id].items()),
            ssl_certificate_location=node_files[node_id][0],
            ssl_key_location=node_files[node_id][1],
        )
        config.validate(str(node.config_path))
        node.config = config
        node.config_path.write_text(config.to_toml())
    with cluster:
        bench = BenchCluster(cluster, ports, str(ca_path))
        _wait_for_login(bench)
        yield bench


def _wait_for_login(bench: BenchCluster) -> None:
    """Each node writes the seeded users once it has caught up: wait until both log in."""
    from confluent_kafka.admin import AdminClient

    def logged_in() -> bool:
        for user, password in ((ADMIN_USER, ADMIN_PASSWORD), (BENCH_USER, BENCH_PASSWORD)):
            admin = AdminClient(bench.client("SASL_SSL", user, password))
            try:
                admin.list_topics(timeout=5)
            except Exception:
                return False
        return True

    bench.cluster.wait_for(logged_in, "the seeded SCRAM users to log in")


def create_topic(bench: BenchCluster) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(bench.client("SASL_SSL"))
    topic = NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "2"})
    admin.create_topics([topic])[TOPIC].result(CLIENT_TIMEOUT_S)


def create_acls(bench: BenchCluster, count: int, on_batch: Callable[[int], None]) -> int:
    """`count` ACLs through AdminClient.create_acls in batches: ALLOW WRITE on the topic for
    the bench user among ACLs of other users on other topics (literal and prefixed), on
    groups and on this topic for others. Returns how many were created."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    allow = AclPermissionType.ALLOW

    def binding(i: int) -> Any:
        kind = i % 4
        if kind == 0:
            return AclBinding(
                ResourceType.TOPIC,
                f"topic-{i}",
                ResourcePatternType.LITERAL,
                f"User:user-{i}",
                "*",
                AclOperation.WRITE,
                allow,
            )
        if kind == 1:
            return AclBinding(
                ResourceType.TOPIC,
                f"prefix-{i}-",
                ResourcePatternType.PREFIXED,
                f"User:user-{i}",
                "*",
                AclOperation.READ,
                allow,
            )
        if kind == 2:
            return AclBinding(
                ResourceType.GROUP,
                f"group-{i}",
                ResourcePatternType.LITERAL,
                f"User:user-{i}",
                "*",
                AclOperation.READ,
                allow,
            )
        return AclBinding(
            ResourceType.TOPIC,
            TOPIC,
            ResourcePatternType.LITERAL,
            f"User:user-{i}",
            "*",
            AclOperation.DESCRIBE,
            allow,
        )

    bindings = [
        AclBinding(
            ResourceType.TOPIC,
            TOPIC,
            ResourcePatternType.LITERAL,
            f"User:{BENCH_USER}",
            "*",
            AclOperation.WRITE,
            allow,
        )
    ]
    bindings += [binding(i) for i in range(1, count)]
    admin = AdminClient(bench.client("SASL_SSL"))
    created = 0
    for start in range(0, len(bindings), ACL_BATCH):
        batch = bindings[start : start + ACL_BATCH]
        for future in admin.create_acls(batch, request_timeout=CLIENT_TIMEOUT_S).values():
            future.result(CLIENT_TIMEOUT_S)
        created += len(batch)
        on_batch(created)
    return created


def produce_for(config: dict[str, Any], seconds: float) -> float:
    """One confluent-kafka producer (acks=all) sending 1000-byte values as fast as it can
    for `seconds`; acknowledged bytes/s inside the window."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            **config,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": PRODUCER_BATCH_BYTES,
            "queue.buffering.max.kbytes": 16 * 1024,
        }
    )
    # (The connect includes the TLS and SASL handshakes: they are not throughput.)
    value = b"s" * VALUE_BYTES
    return stream_acked_bytes_per_s(producer, TOPIC, value, seconds, CLIENT_TIMEOUT_S)


def fetch_all(config: dict[str, Any]) -> float:
    """One confluent-kafka consumer reading the topic from its start to its end (at most
    FETCH_MAX_S); consumed value bytes/s."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            **config,
            "group.id": f"security-bench-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.max.bytes": 50 * MIB,
            "max.partition.fetch.bytes": 10 * MIB,
        }
    )
    try:
        _low, high = consumer.get_watermark_offsets(
            TopicPartition(TOPIC, 0), timeout=CLIENT_TIMEOUT_S
        )
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        consumed = 0
        position = 0
        started = time.monotonic()
        while position < high and time.monotonic() - started < FETCH_MAX_S:
            for message in consumer.consume(num_messages=10_000, timeout=0.5):
                if message.error() is None:
                    consumed += len(message.value() or b"")
                    position = int(message.offset() or 0) + 1
        elapsed = time.monotonic() - started
    finally:
        consumer.close()
    return consumed / elapsed if elapsed > 0 else 0.0


def alternate(
    rounds: int,
    sides: dict[str, Callable[[], float]],
    advance: Callable[[str], None],
) -> dict[str, list[float]]:
    """Each round measures both sides, the first side first in even rounds and second in
    odd ones (ABBA), so a machine that slows down over the run hits both alike."""
    names = list(sides)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            out[name].append(sides[name]())
            advance(f"{name} round {r + 1}: {out[name][-1] / MIB:.1f} MiB/s")
    return out


def _ratio(numerator: list[float], denominator: list[float]) -> float:
    """The median of the rounds' ratios (a round whose baseline measured nothing counts 0)."""
    ratios = [n / d if d else 0.0 for n, d in zip(numerator, denominator, strict=True)]
    return round(statistics.median(ratios), 3) if ratios else 0.0


def _mib(values: list[float]) -> list[float]:
    return [round(v / MIB, 2) for v in values]


def run(seconds: float, rounds: int, acl_count: int) -> dict[str, Any]:
    measurements = 3 * 2 * rounds
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with (
        tempfile.TemporaryDirectory(prefix="raftlog-security-bench-") as tmp,
        Progress(*columns, console=console, transient=False) as bar,
        ExitStack() as stack,
    ):
        setup = bar.add_task("starting two 3-node clusters", total=2)
        plain = stack.enter_context(secure_cluster(Path(tmp) / "plain", authorizer=False))
        bar.advance(setup)
        authorized = stack.enter_context(secure_cluster(Path(tmp) / "acl", authorizer=True))
        bar.advance(setup)
        create_topic(plain)
        create_topic(authorized)
        acl_task = bar.add_task(f"creating {acl_count} ACLs", total=acl_count)
        created = create_acls(authorized, acl_count, lambda n: bar.update(acl_task, completed=n))
        task = bar.add_task("measuring", total=measurements)

        def advance(what: str) -> None:
            bar.update(task, advance=1, description=f"measuring: {what}")

        produce = alternate(
            rounds,
            {
                "produce SASL_SSL": lambda: produce_for(plain.client("SASL_SSL"), seconds),
                "produce PLAINTEXT": lambda: produce_for(plain.client("PLAINTEXT"), seconds),
            },
            advance,
        )
        bench_login = (BENCH_USER, BENCH_PASSWORD)
        authorizer = alternate(
            rounds,
            {
                "produce authorizer on": lambda: produce_for(
                    authorized.client("SASL_SSL", *bench_login), seconds
                ),
                "produce authorizer off": lambda: produce_for(
                    plain.client("SASL_SSL", *bench_login), seconds
                ),
            },
            advance,
        )
        fetch = alternate(
            rounds,
            {
                "fetch SASL_SSL": lambda: fetch_all(plain.client("SASL_SSL")),
                "fetch PLAINTEXT": lambda: fetch_all(plain.client("PLAINTEXT")),
            },
            advance,
        )
    result: dict[str, Any] = {
        "produce_tls_ratio": _ratio(produce["produce SASL_SSL"], produce["produce PLAINTEXT"]),
        "fetch_tls_ratio": _ratio(fetch["fetch SASL_SSL"], fetch["fetch PLAINTEXT"]),
        "authorizer_ratio": _ratio(
            authorizer["produce authorizer on"], authorizer["produce authorizer off"]
        ),
        "produce_sasl_ssl_mib_s": _mib(produce["produce SASL_SSL"]),
        "produce_plaintext_mib_s": _mib(produce["produce PLAINTEXT"]),
        "fetch_sasl_ssl_mib_s": _mib(fetch["fetch SASL_SSL"]),
        "fetch_plaintext_mib_s": _mib(fetch["fetch PLAINTEXT"]),
        "produce_authorizer_on_mib_s": _mib(authorizer["produce authorizer on"]),
        "produce_authorizer_off_mib_s": _mib(authorizer["produce authorizer off"]),
        "acls": created,
        "rounds": rounds,
        "seconds": seconds,
        "value_bytes": VALUE_BYTES,
        "targets": TARGETS,
    }
    for key, target in TARGETS.items():
        verdict = "[green]meets" if result[key] >= target else "[red]misses"
        console.print(f"{key} {result[key]:.3f} {verdict}[/] the target {target}")
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per produce measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--acls", type=int, default=10_000)
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.rounds < 1 or args.acls < 1:
        parser.error("--seconds must be > 0, --rounds and --acls >= 1")
    emit_result(run(args.seconds, args.rounds, args.acls))


if __name__ == "__main__":
    main()
