"""`raftlog groups list|describe GROUP`: members, assignments, committed offsets, lag."""

from __future__ import annotations

from typing import Any

import click
from raftlog_cli.common import Options, common_options, connect, run_async
from raftlog_cli.errors import CliError

from raftlog.client.groups import GroupAdmin


@click.group("groups")
def groups_group() -> None:
    """Inspect consumer groups."""


@groups_group.command("list")
@common_options
def list_groups(opts: Options) -> None:
    """List consumer groups."""

    async def go() -> list[dict[str, Any]]:
        async with connect(opts) as cluster:
            listed = await GroupAdmin(cluster).list_groups()
            return [
                {"group_id": g.group_id, "state": g.state, "protocol_type": g.protocol_type}
                for g in listed
            ]

    opts.out.group_list(run_async(opts, go))


@groups_group.command("describe")
@click.argument("group")
@common_options
def describe(group: str, opts: Options) -> None:
    """Members and their assignments, committed offsets and lag of GROUP."""

    async def go() -> dict[str, Any]:
        async with connect(opts) as cluster:
            admin = GroupAdmin(cluster)
            description = await admin.describe_group(group)
            offsets = await admin.committed_offsets(group)
            if description.state == "Dead" and not description.members and not offsets:
                raise CliError(f"unknown consumer group {group!r}")
            return {
                "group_id": description.group_id,
                "state": description.state,
                "protocol_type": description.protocol_type,
                "protocol": description.protocol,
                "coordinator_id": description.coordinator_id,
                "members": [
                    {
                        "member_id": m.member_id,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "assignment": [list(tp) for tp in m.assignment],
                    }
                    for m in description.members
                ],
                "offsets": [
                    {
                        "topic": o.topic,
                        "partition": o.partition,
                        "committed_offset": o.offset,
                        "high_watermark": o.high_watermark,
                        "lag": o.lag,
                    }
                    for o in offsets
                ],
            }

    opts.out.group_description(run_async(opts, go))
