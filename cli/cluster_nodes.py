"""`raftlog cluster add-node|remove-node`: grow and shrink a local cluster while it runs, as
operators grow and shrink a Kafka 4 (KRaft) or Redpanda cluster.

add-node [--voter]      writes node N+1's config from a member's (same cluster id, bootstrap
                        voters and --node-config settings; its own id, ports and data dir),
                        starts it as a broker that follows the metadata log as an observer,
                        waits until it is registered and unfenced, and with --voter makes it
                        a controller voter (AddRaftVoter, KIP-853). A new broker receives no
                        partitions until they are moved to it (`raftlog topics reassign`).
remove-node NODE        refuses when the cluster could not keep every replica or three
                        voters without NODE; drains NODE (every replica on it reassigned,
                        KIP-455, to the least loaded brokers, racks spread), moves the
                        leaderships it still holds, removes it from the voters, stops it with
                        a controlled shutdown, deletes its data directory (its log stays) and
                        drops it from cluster.json.

The planning (next node, refusals, drain plan) is pure and tested without processes. The
commands register themselves on the `cluster` group (cluster.py imports this module) and
share the start-up wait of `up` and `restart` (wait_ready).
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import tomllib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import trio
from raftlog_cli import cluster_local as local
from raftlog_cli.cluster_health import probe_ready
from raftlog_cli.common import CLI_LIMITS, DEFAULT_CLUSTER_DIR, run_async
from raftlog_cli.errors import CliError, kafka_message, leaf_exception
from raftlog_cli.render import Renderer

from raftlog.client import Admin, Cluster, open_cluster
from raftlog.client.admin_reassign import ElectionType, TopicPartition
from raftlog.client.connection import ConnectionClosed, RequestTimeout
from raftlog.client.properties import (
    PLAINTEXT,
    ClientPropertiesError,
    ClientSecurity,
    load_client_properties,
)
from raftlog.client.quorum import QuorumAdmin, QuorumDescription
from raftlog.errors import ConfigError, ErrorCode, KafkaError

DEFAULT_READY_TIMEOUT_S = 60.0
READY_POLL_INTERVAL_S = 0.25
# How long a drain (every replica moved off the node) may take by default.
DEFAULT_DRAIN_TIMEOUT_S = 600.0
DRAIN_POLL_INTERVAL_S = 0.5
# Kafka's own floor for a production KRaft quorum: three voters survive one failure.
MIN_VOTERS = 3
# A voter change refused for a reason that passes (another change not committed yet, the
# observer not caught up, a new leader that has not committed in its epoch) is retried.
VOTER_CHANGE_RETRIED = (ErrorCode.request_timed_out, ErrorCode.not_controller)
VOTER_CHANGE_RETRY_PACE_S = 0.2
# What a poll of the quorum may meet while leadership moves: asked again.
PASSING_ERRORS = (KafkaError, OSError, ConnectionClosed, RequestTimeout)
# The listener name a voter's Raft endpoint goes by (DescribeQuorum v2, AddRaftVoter).
CONTROLLER_LISTENER = "CONTROLLER"


def dir_option(func: Any) -> Any:
    return click.option(
        "--dir",
        "cluster_dir",
        default=DEFAULT_CLUSTER_DIR,
        show_default=True,
        type=click.Path(file_okay=False, path_type=Path),
        help="Directory of the local cluster.",
    )(func)


def require_cluster(cluster_dir: Path) -> local.LocalCluster:
    found = local.load_cluster(cluster_dir)
    if found is None:
        raise CliError(f"no local cluster in {cluster_dir} (start one: raftlog cluster up)")
    return found


def cluster_security(cluster: local.LocalCluster) -> ClientSecurity:
    """How to connect to the local cluster: its client properties when it is secure."""
    if cluster.client_properties is None:
        return PLAINTEXT
    try:
        return load_client_properties(cluster.client_properties).security
    except ClientPropertiesError as exc:
        raise CliError(str(exc)) from None


def connect_local(cluster: local.LocalCluster) -> AbstractAsyncContextManager[Cluster]:
    """A client of the local cluster, bootstrapped from the nodes that run."""
    running = [n.client_address for n in cluster.nodes if local.running_pid(n) is not None]
    return open_cluster(
        ",".join(running) or cluster.bootstrap_servers,
        client_id="raftlog-cli",
        limits=CLI_LIMITS,
        security=cluster_security(cluster),
    )


async def wait_ready(
    cluster: local.LocalCluster,
    started: dict[int, subprocess.Popen[bytes]],
    timeout_s: float,
    out: Renderer,
) -> str:
    """Poll until a controller is elected and the started brokers are unfenced; a node
    that exits or the deadline is an error naming its log.

    Exits are read from our own child handles (poll()), which cannot be fooled by /proc.
    """
    node_ids = set(started)
    detail = "starting"
    noun = "node" if len(started) == 1 else "nodes"
    security = cluster_security(cluster)
    with out.progress(f"Starting {len(started)} raftlog {noun}...") as update:
        with trio.move_on_after(timeout_s):
            while True:
                for node in cluster.nodes:
                    process = started.get(node.node_id)
                    if process is not None and process.poll() is not None:
                        tail = local.log_tail(node)
                        raise CliError(
                            f"node {node.node_id} exited during start-up; see {node.log_path}"
                            + (f": {tail}" if tail else "")
                        )
                ready, detail = await probe_ready(cluster.bootstrap_servers, node_ids, security)
                update(detail)
                if ready:
                    return detail
                await trio.sleep(READY_POLL_INTERVAL_S)
    logs = ", ".join(str(cluster.node(i).log_path) for i in sorted(node_ids))
    raise CliError(f"cluster not ready after {timeout_s:g} s ({detail}); see the node logs: {logs}")


# ---------------------------------------------------------------------------- planning
def plan_new_node(cluster: local.LocalCluster) -> local.LocalNode:
    """The node add-node would start: the next id after the highest, at the ports `up`
    gives that id (client port base + id - 1, internal and metrics above it). Ids are not
    reused: the controller still holds the registration of a removed broker."""
    if not cluster.nodes:
        raise CliError(f"{cluster.root} lists no nodes; start a cluster with raftlog cluster up")
    node_id = max(n.node_id for n in cluster.nodes) + 1
    if node_id > local.MAX_LOCAL_NODES:
        raise CliError(
            f"a local cluster has at most {local.MAX_LOCAL_NODES} node ids (its ports are "
            f"reserved for them) and the next one would be {node_id}"
        )
    first = min(cluster.nodes, key=lambda n: n.node_id)
    base_port = first.client_port - (first.node_id - 1)
    client_port = base_port + node_id - 1
    return local.LocalNode(
        node_id=node_id,
        client_port=client_port,
        internal_port=client_port + local.INTERNAL_PORT_OFFSET,
        node_dir=cluster.root / f"node-{node_id}",
    )


@dataclass(frozen=True)
class ClusterView:
    """What remove-node decides on, as the cluster reports it."""

    live_brokers: frozenset[int]  # registered and unfenced
    voters: frozenset[int]
    assignments: Mapping[TopicPartition, tuple[int, ...]]
    leaders: Mapping[TopicPartition, int]
    racks: Mapping[int, str | None]


def removal_refusals(node_id: int, view: ClusterView) -> list[str]:
    """Why removing node_id would lose replicas or the quorum's fault tolerance (empty:
    safe). Kafka's rule: never fewer brokers than a partition's replicas, never silently
    shrink a replica set."""
    reasons = []
    remaining = view.live_brokers - {node_id}
    too_big: dict[str, int] = {}
    for (topic, _), replicas in view.assignments.items():
        if node_id in replicas and len(replicas) > len(remaining):
            too_big[topic] = max(too_big.get(topic, 0), len(replicas))
    for topic, factor in sorted(too_big.items()):
        reasons.append(
            f"topic {topic} has replication factor {factor} and only {len(remaining)} live "
            f"brokers would remain ({', '.join(map(str, sorted(remaining))) or 'none'}); "
            "add a node first: raftlog cluster add-node"
        )
    if node_id in view.voters and len(view.voters) - 1 < MIN_VOTERS:
        reasons.append(
            f"node {node_id} is one of {len(view.voters)} controller voters and removing it "
            f"would leave fewer than {MIN_VOTERS}; add a voter first: "
            "raftlog cluster add-node --voter"
        )
    return reasons


def _rack_of(broker: int, racks: Mapping[int, str | None]) -> str:
    rack = racks.get(broker)
    # A broker without a rack counts as a rack of its own (as placement.py does).
    return f"\x00broker-{broker}" if rack is None else rack


def drain_plan(node_id: int, view: ClusterView) -> dict[TopicPartition, tuple[int, ...]]:
    """New replica sets without node_id: each of its replicas goes to the live broker that
    holds none of that partition yet, preferring a rack the partition is not on yet, then
    the fewest replicas (counting the moves planned so far), then the lowest id. The
    replacement goes last, so a partition node_id led prefers one of its current followers
    (already in sync) as leader. Call removal_refusals first: a partition with no broker
    left to take its replica raises CliError."""
    candidates = sorted(view.live_brokers - {node_id})
    load = dict.fromkeys(candidates, 0)
    for replicas in view.assignments.values():
        for broker in replicas:
            if broker in load:
                load[broker] += 1
    plan = {}
    for key in sorted(view.assignments):
        replicas = view.assignments[key]
        if node_id not in replicas:
            continue
        kept = [b for b in replicas if b != node_id]
        racks_used = {_rack_of(b, view.racks) for b in kept}
        free = [b for b in candidates if b not in kept]
        if not free:
            topic, partition = key
            raise CliError(f"no live broker can take the replica of {topic}-{partition}")
        target = min(free, key=lambda b: (_rack_of(b, view.racks) in racks_used, load[b], b))
        load[target] += 1
        plan[key] = (*kept, target)
    return plan


# ---------------------------------------------------------------------------- cluster calls
async def gather_view(cluster: Cluster) -> ClusterView:
    admin = Admin(cluster)
    infos = await admin.describe_topics(None)
    quorum = await QuorumAdmin(cluster).describe_quorum()
    racks = await admin.broker_racks()
    assignments = {}
    leaders = {}
    for name, info in infos.items():
        if info.error != ErrorCode.none:
            continue
        for p in info.partitions:
            assignments[(name, p.partition)] = tuple(p.replicas)
            leaders[(name, p.partition)] = p.leader_id
    return ClusterView(
        live_brokers=frozenset(cluster.brokers),
        voters=frozenset(v.replica_id for v in quorum.voters),
        assignments=assignments,
        leaders=leaders,
        racks=racks,
    )


async def change_voters(
    connect: Callable[[], AbstractAsyncContextManager[Cluster]],
    deadline_s: float,
    *,
    add: tuple[int, str, int] | None = None,
    remove: int = -1,
) -> None:
    """AddRaftVoter (add: node id, host, internal port) or RemoveRaftVoter (remove), retried
    while refused for a reason that passes or while the controller cannot be reached (it may
    be moving or restarting), until deadline_s; `connect` opens a client of the cluster.

    DUPLICATE_VOTER (add) and VOTER_NOT_FOUND (remove) mean the change is already in force: the
    controller checks for a pending change before it checks the voter, so the set it answers
    from is committed. They come back when an earlier attempt committed but its answer was lost
    with the controller that took it (killed, or moved), and the client then asked again."""
    what = f"add node {add[0]} to" if add is not None else f"remove node {remove} from"
    in_force = ErrorCode.duplicate_voter if add is not None else ErrorCode.voter_not_found
    last = "no answer"
    with trio.move_on_after(deadline_s):
        while True:
            try:
                async with connect() as client:
                    admin = QuorumAdmin(client, timeout_ms=10_000)
                    if add is not None:
                        node_id, host, port = add
                        await admin.add_voter(node_id, [(CONTROLLER_LISTENER, host, port)])
                    else:
                        await admin.remove_voter(remove)
                return
            except (*PASSING_ERRORS, BaseExceptionGroup) as raised:
                # The client's nursery wraps what the body raised in a group.
                exc = leaf_exception(raised)
                if isinstance(exc, KafkaError) and exc.code == in_force:
                    return
                if isinstance(exc, KafkaError) and exc.code not in VOTER_CHANGE_RETRIED:
                    raise CliError(
                        f"could not {what} the voters: {kafka_message(exc.code, str(exc))}"
                    ) from None
                if not isinstance(exc, PASSING_ERRORS):
                    raise
                last = exc.code.name if isinstance(exc, KafkaError) else str(exc)
            await trio.sleep(VOTER_CHANGE_RETRY_PACE_S)  # a retry pace; the loop re-asks
    raise CliError(f"could not {what} the voters within {deadline_s:g} s (last refusal: {last})")


async def _change_voters(
    cluster: local.LocalCluster, deadline_s: float, *, add: local.LocalNode | None, remove: int
) -> None:
    """change_voters on the local cluster."""
    endpoint = None if add is None else (add.node_id, local.LOOPBACK, add.internal_port)
    await change_voters(lambda: connect_local(cluster), deadline_s, add=endpoint, remove=remove)


async def _wait_quorum(
    cluster: local.LocalCluster,
    deadline_s: float,
    out: Renderer,
    description: str,
    done: Any,
) -> QuorumDescription:
    """Poll DescribeQuorum until done(quorum) or the deadline (a CliError)."""
    quorum: QuorumDescription | None = None
    with out.progress(description) as update:
        with trio.move_on_after(deadline_s):
            while True:
                try:
                    async with connect_local(cluster) as client:
                        quorum = await QuorumAdmin(client).describe_quorum()
                except (*PASSING_ERRORS, BaseExceptionGroup) as raised:
                    # A leader handing over answers NOT_LEADER_OR_FOLLOWER for a moment.
                    exc = leaf_exception(raised)
                    if not isinstance(exc, PASSING_ERRORS):
                        raise
                    update(f"(waiting for the controller: {exc})")
                else:
                    voters = sorted(v.replica_id for v in quorum.voters)
                    update(f"(leader {quorum.leader_id}, voters {voters})")
                    if done(quorum):
                        return quorum
                await trio.sleep(READY_POLL_INTERVAL_S)
    raise CliError(f"timed out after {deadline_s:g} s: {description.rstrip('.')}")


# ---------------------------------------------------------------------------- add-node
@click.command("add-node")
@dir_option
@click.option(
    "--voter",
    is_flag=True,
    help="Also make it a controller voter (AddRaftVoter) once it has caught up.",
)
@click.option(
    "--timeout-s",
    type=click.FloatRange(min=1),
    default=DEFAULT_READY_TIMEOUT_S,
    show_default=True,
    help="How long each step (start, catch up, voter change) may take.",
)
@click.option("--json", "json_mode", is_flag=True, help="Print JSON.")
def add_node(cluster_dir: Path, voter: bool, timeout_s: float, json_mode: bool) -> None:
    """Start one more node (a broker, with --voter also a controller) in the local cluster.

    It receives no partitions until they are moved to it (raftlog topics reassign)."""
    out = Renderer(json_mode=json_mode)
    cluster = require_cluster(cluster_dir)
    if cluster.secure:
        raise CliError(
            "add-node cannot issue a certificate for a new node of a --secure cluster (its CA "
            "key is not kept); recreate the cluster with more --nodes"
        )
    node = plan_new_node(cluster)
    busy = [port for port in node.ports if local.port_in_use(port)]
    if busy:
        raise CliError(
            f"node {node.node_id} would listen on ports {', '.join(map(str, node.ports))} but "
            f"{', '.join(map(str, busy))} {'is' if len(busy) == 1 else 'are'} in use "
            "(another cluster or program?)"
        )
    members = [n for n in cluster.nodes if local.running_pid(n) is not None]
    if not members:
        raise CliError(
            f"no node of the cluster in {cluster_dir} runs; start it: raftlog cluster up"
        )
    try:
        template = tomllib.loads(members[0].config_path.read_text())
        config = local.joining_node_config(template, node)
    except (OSError, tomllib.TOMLDecodeError, ConfigError) as exc:
        raise CliError(
            f"cannot write node {node.node_id}'s config from node {members[0].node_id}'s: {exc}"
        ) from None
    local.write_node(cluster, node, config.to_toml())
    grown = dataclasses.replace(cluster, nodes=(*cluster.nodes, node))
    process = local.start_node(node)
    # Recorded at once, so `down` stops it whatever happens next.
    local.save_cluster(grown)

    async def go() -> QuorumDescription | None:
        try:
            await wait_ready(grown, {node.node_id: process}, timeout_s, out)
        except BaseException:
            with trio.CancelScope(shield=True):
                await local.stop_nodes([node])
            local.save_cluster(cluster)
            raise
        if not voter:
            return None

        def caught_up(quorum: QuorumDescription) -> bool:
            return any(
                o.replica_id == node.node_id and o.log_end_offset >= quorum.high_watermark
                for o in quorum.observers
            ) or any(v.replica_id == node.node_id for v in quorum.voters)

        await _wait_quorum(
            grown,
            timeout_s,
            out,
            f"Node {node.node_id} catching up on the metadata log...",
            caught_up,
        )
        await _change_voters(grown, timeout_s, add=node, remove=-1)
        return await _wait_quorum(
            grown,
            timeout_s,
            out,
            f"Node {node.node_id} becoming a voter...",
            lambda q: any(v.replica_id == node.node_id for v in q.voters),
        )

    quorum = run_async(None, go)
    info: dict[str, Any] = {
        **node.to_json(),
        "voter": quorum is not None,
        "bootstrap_servers": grown.bootstrap_servers,
    }
    if quorum is not None:
        info["voters"] = sorted(v.replica_id for v in quorum.voters)
    role = (
        f"a controller voter (voters now {info['voters']})"
        if quorum is not None
        else "a broker (not a controller voter)"
    )
    out.message(
        f"Added node {node.node_id} (client {node.client_address}, internal "
        f"{local.LOOPBACK}:{node.internal_port}, log {node.log_path}): registered and "
        f"unfenced, {role}. It holds no partitions until they are moved to it "
        "(raftlog topics reassign).",
        info,
    )


# ---------------------------------------------------------------------------- remove-node
async def drain(
    client: Cluster,
    plan: Mapping[TopicPartition, Sequence[int]],
    timeout_s: float,
    out: Renderer,
) -> None:
    """Start the plan's reassignments and poll until every partition has its new replicas."""
    await start_moves(client, plan)
    await wait_moved(client, plan, timeout_s, out)


async def start_moves(client: Cluster, plan: Mapping[TopicPartition, Sequence[int]]) -> None:
    """AlterPartitionReassignments for the plan; a partition refused is a CliError."""
    results = await Admin(client).alter_partition_reassignments(plan)
    failed = [
        f"{r.topic}-{r.partition}: {kafka_message(r.error, r.message or r.error.name)}"
        for r in results
        if r.error != ErrorCode.none
    ]
    if failed:
        raise CliError("reassignment refused for " + "; ".join(failed))


async def wait_moved(
    client: Cluster,
    plan: Mapping[TopicPartition, Sequence[int]],
    timeout_s: float,
    out: Renderer,
) -> None:
    """Poll until every partition of the plan has its new replicas and no reassignment."""
    admin = Admin(client)
    done = 0
    with out.progress(f"Moving {len(plan)} replicas...") as update:
        with trio.move_on_after(timeout_s):
            while True:
                ongoing = await admin.list_partition_reassignments(list(plan))
                infos = await admin.describe_topics(sorted({t for t, _ in plan}))
                current = {
                    (name, p.partition): tuple(p.replicas)
                    for name, info in infos.items()
                    for p in info.partitions
                }
                done = sum(
                    1
                    for key, target in plan.items()
                    if key not in ongoing and current.get(key) == tuple(target)
                )
                update(f"{done} of {len(plan)} moved")
                if done == len(plan):
                    return
                # Polling a state the cluster does not push to clients.
                await trio.sleep(DRAIN_POLL_INTERVAL_S)
    raise CliError(
        f"the drain did not finish within {timeout_s:g} s ({done} of {len(plan)} replicas "
        "moved); the node was not removed. `raftlog topics reassign --verify` follows the "
        "moves; run remove-node again once they are done"
    )


async def move_leaders(client: Cluster, node_id: int, timeout_s: float, out: Renderer) -> None:
    """Preferred elections for partitions node_id still leads (a drain usually moved them
    all), until it leads none."""
    admin = Admin(client)
    with out.progress(f"Moving leadership off node {node_id}...") as update:
        with trio.move_on_after(timeout_s):
            while True:
                view = await gather_view(client)
                led = [key for key, leader in view.leaders.items() if leader == node_id]
                update(f"{len(led)} partitions left")
                if not led:
                    return
                await admin.elect_leaders(ElectionType.PREFERRED, led)
                await trio.sleep(DRAIN_POLL_INTERVAL_S)
    raise CliError(f"node {node_id} still leads partitions after {timeout_s:g} s")


async def _unregister(cluster: local.LocalCluster, node_id: int) -> str | None:
    """UnregisterBroker for the stopped node (a running broker would register again on its
    next heartbeat); None when done or it was never a broker, else why it failed (the node
    is gone either way: a registration left behind is fenced and holds nothing)."""
    try:
        async with connect_local(cluster) as client:
            await Admin(client).unregister_broker(node_id)
    except (KafkaError, OSError, ConnectionClosed, RequestTimeout, ExceptionGroup) as exc:
        leaf = leaf_exception(exc)
        if not isinstance(leaf, KafkaError):
            return str(leaf)
        if leaf.code == ErrorCode.broker_id_not_registered:
            return None  # a controller-only node, or a retry after the removal committed
        return kafka_message(leaf.code, leaf.message)
    return None


@click.command("remove-node")
@click.argument("node_id", metavar="NODE", type=int)
@dir_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--timeout-s",
    type=click.FloatRange(min=1),
    default=DEFAULT_DRAIN_TIMEOUT_S,
    show_default=True,
    help="How long the drain may take (each other step: a minute).",
)
@click.option("--json", "json_mode", is_flag=True, help="Print JSON.")
def remove_node(
    node_id: int, cluster_dir: Path, yes: bool, timeout_s: float, json_mode: bool
) -> None:
    """Drain NODE (move its replicas and leaderships to other brokers), remove it from the
    controller voters, stop it and drop it from the local cluster.

    Refused when the other live brokers could not hold every partition's replicas or fewer
    than three controller voters would remain."""
    out = Renderer(json_mode=json_mode)
    cluster = require_cluster(cluster_dir)
    try:
        node = cluster.node(node_id)
    except LookupError as exc:
        raise CliError(str(exc)) from None
    step_s = min(timeout_s, DEFAULT_READY_TIMEOUT_S)

    async def survey() -> tuple[ClusterView, dict[TopicPartition, tuple[int, ...]]]:
        async with connect_local(cluster) as client:
            view = await gather_view(client)
        refusals = removal_refusals(node_id, view)
        if refusals:
            raise CliError(f"refusing to remove node {node_id}: " + "; ".join(refusals))
        return view, drain_plan(node_id, view)

    view, plan = run_async(None, survey)
    is_voter = node_id in view.voters
    if not yes:
        click.echo(
            f"Node {node_id}: {len(plan)} replicas to move"
            + (", a controller voter to remove" if is_voter else "")
            + f"; its data directory {node.node_dir / 'data'} is deleted once it is stopped.",
            err=True,
        )
        click.confirm(f"Remove node {node_id}?", abort=True, err=True)

    async def go() -> tuple[dict[int, str], str | None]:
        async with connect_local(cluster) as client:
            if plan:
                await drain(client, plan, timeout_s, out)
            await move_leaders(client, node_id, step_s, out)
        if is_voter:
            await _change_voters(cluster, step_s, add=None, remove=node_id)
            await _wait_quorum(
                cluster,
                step_s,
                out,
                f"Node {node_id} leaving the voters...",
                lambda q: (
                    node_id not in {v.replica_id for v in q.voters}
                    and q.leader_id not in (-1, node_id)
                ),
            )
        stopped = await local.stop_nodes([node])
        return stopped, await _unregister(cluster, node_id)

    stopped, unregister_error = run_async(None, go)
    local.save_cluster(
        dataclasses.replace(cluster, nodes=tuple(n for n in cluster.nodes if n.node_id != node_id))
    )
    shutil.rmtree(node.node_dir / "data", ignore_errors=True)
    out.message(
        f"Removed node {node_id}: {len(plan)} replicas moved to other brokers"
        + (", removed from the controller voters" if is_voter else "")
        + f", {stopped.get(node_id, 'stopped')}"
        + (
            f"; its broker registration stays (unregister failed: {unregister_error})"
            if unregister_error
            else ", unregistered"
        )
        + f"; its log stays at {node.log_path}",
        {
            "node_id": node_id,
            "unregistered": unregister_error is None,
            "moved": [
                {"topic": t, "partition": p, "replicas": list(r)}
                for (t, p), r in sorted(plan.items())
            ],
            "was_voter": is_voter,
            "stopped": stopped.get(node_id),
        },
    )
