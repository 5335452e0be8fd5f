"""`raftlog cluster describe-quorum|add-voter|remove-voter`: controller membership (KIP-853),
like kafka-metadata-quorum.sh describe / add-controller / remove-controller.

A new controller starts as an observer: its config names the existing voters in
controller_quorum_voters so it can find the leader, and it fetches the metadata log. Once it
has caught up (describe-quorum lists it among the observers, its log end at the high
watermark), `add-voter` makes it a voter. One change at a time: while a change has not
committed, the next is refused (REQUEST_TIMED_OUT; retry). The principal needs ALTER on the
cluster, as with Kafka (DESCRIBE for describe-quorum).

The commands register themselves on the `cluster` group when this module is imported
(cli/main.py imports it).
"""

from __future__ import annotations

import uuid
from typing import Any

import click
from raftlog_cli.cluster import cluster_group
from raftlog_cli.common import Options, common_options, connect, run_async

from raftlog.client.quorum import QuorumAdmin, QuorumDescription, QuorumReplica

VOTER_COLUMNS = [
    ("replica_id", "NODE"),
    ("role", "ROLE"),
    ("directory_id", "DIRECTORY ID"),
    ("log_end_offset", "LOG END"),
    ("lag", "LAG"),
    ("last_fetch_timestamp", "LAST FETCH MS"),
    ("last_caught_up_timestamp", "LAST CAUGHT UP MS"),
    ("endpoints", "ENDPOINTS"),
]
MAX_NODE_ID = 2**31 - 1


def _rows(quorum: QuorumDescription) -> list[dict[str, Any]]:
    endpoints = {
        n.node_id: ",".join(f"{name}://{host}:{port}" for name, host, port in n.listeners)
        for n in quorum.nodes
    }

    def row(replica: QuorumReplica, role: str) -> dict[str, Any]:
        return {
            "replica_id": replica.replica_id,
            "role": role,
            "directory_id": str(replica.directory_id) if replica.directory_id else None,
            "log_end_offset": replica.log_end_offset,
            "lag": max(quorum.high_watermark - replica.log_end_offset, 0),
            "last_fetch_timestamp": replica.last_fetch_timestamp,
            "last_caught_up_timestamp": replica.last_caught_up_timestamp,
            "endpoints": endpoints.get(replica.replica_id),
        }

    rows = [
        row(v, "leader" if v.replica_id == quorum.leader_id else "voter") for v in quorum.voters
    ]
    rows += [row(o, "observer") for o in quorum.observers]
    return rows


@click.command("describe-quorum")
@common_options
def describe_quorum(opts: Options) -> None:
    """Leader, epoch, high watermark, voters (with endpoints) and observers."""

    async def go() -> QuorumDescription:
        async with connect(opts) as cluster:
            return await QuorumAdmin(cluster).describe_quorum()

    quorum = run_async(opts, go)
    rows = _rows(quorum)
    out = opts.out
    if out.json_mode:
        out.json(
            {
                "leader_id": quorum.leader_id,
                "leader_epoch": quorum.leader_epoch,
                "high_watermark": quorum.high_watermark,
                "replicas": rows,
            }
        )
        return
    out.text(
        f"leader {quorum.leader_id}, epoch {quorum.leader_epoch}, "
        f"high watermark {quorum.high_watermark}"
    )
    out.table(VOTER_COLUMNS, rows, empty="(no replicas)")


def _parse_endpoint(text: str) -> tuple[str, str, int]:
    """NAME://HOST:PORT, or HOST:PORT (the CONTROLLER listener, Raft's)."""
    name, sep, rest = text.partition("://")
    if not sep:
        name, rest = "CONTROLLER", text
    host, colon, port_text = rest.rpartition(":")
    if not colon or not host or not name:
        raise click.BadParameter(f"expected [NAME://]HOST:PORT, got {text!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise click.BadParameter(f"bad port in {text!r}") from None
    if not 0 < port <= 65535:
        raise click.BadParameter(f"port out of range in {text!r}")
    return name, host, port


def _parse_directory(text: str | None) -> uuid.UUID | None:
    if text is None:
        return None
    try:
        return uuid.UUID(text)
    except ValueError:
        raise click.BadParameter(f"not a UUID: {text!r}", param_hint="'--directory-id'") from None


@click.command("add-voter")
@click.option(
    "--node-id",
    required=True,
    type=click.IntRange(0, MAX_NODE_ID),
    help="The observer to make a voter.",
)
@click.option(
    "--endpoint",
    "endpoints",
    required=True,
    multiple=True,
    metavar="[NAME://]HOST:PORT",
    help="Its internal (Raft) listener; repeat for more listeners.",
)
@click.option("--directory-id", default=None, metavar="UUID", help="Its metadata log directory id.")
@common_options
def add_voter(
    node_id: int, endpoints: tuple[str, ...], directory_id: str | None, opts: Options
) -> None:
    """Make a caught-up observer a voter of the metadata quorum (AddRaftVoter)."""
    listeners = [_parse_endpoint(e) for e in endpoints]
    directory = _parse_directory(directory_id)

    async def go() -> None:
        async with connect(opts) as cluster:
            await QuorumAdmin(cluster).add_voter(node_id, listeners, directory_id=directory)

    run_async(opts, go)
    opts.out.message(f"node {node_id} is a voter", {"node_id": node_id, "voter": True})


@click.command("remove-voter")
@click.option(
    "--node-id", required=True, type=click.IntRange(0, MAX_NODE_ID), help="The voter to remove."
)
@click.option("--directory-id", default=None, metavar="UUID", help="Its metadata log directory id.")
@common_options
def remove_voter(node_id: int, directory_id: str | None, opts: Options) -> None:
    """Remove a voter from the metadata quorum (RemoveRaftVoter); a leader hands over."""
    directory = _parse_directory(directory_id)

    async def go() -> None:
        async with connect(opts) as cluster:
            await QuorumAdmin(cluster).remove_voter(node_id, directory_id=directory)

    run_async(opts, go)
    opts.out.message(f"node {node_id} is no longer a voter", {"node_id": node_id, "voter": False})


for _command in (describe_quorum, add_voter, remove_voter):
    cluster_group.add_command(_command)
