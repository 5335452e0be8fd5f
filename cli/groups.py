"""`raftlog groups list|describe GROUP|reset-offsets|delete`, as kafka-consumer-groups.sh.

describe shows members, assignments, committed offsets and lag. reset-offsets moves an
inactive group's committed offsets (a dry run unless --execute; the argument forms and the
plan are in groups_reset.py). delete removes empty groups and their offsets.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import click
from raftlog_cli.common import Options, common_options, connect, run_async
from raftlog_cli.errors import CliError, kafka_message
from raftlog_cli.groups_reset import (
    OFFSET_MAX,
    DateTimeType,
    DurationType,
    PartitionInputs,
    PlannedOffset,
    ResetError,
    ResetKind,
    ResetSpec,
    TopicPartitionsType,
    plan_resets,
    scope_partitions,
)

from raftlog.client.admin import list_offset
from raftlog.client.cluster import Cluster
from raftlog.client.groups import MAX_DELETE_GROUPS, GroupAdmin
from raftlog.errors import ErrorCode, KafkaError

# Group states in which nobody consumes, so offsets may be reset (Kafka's tool: Empty, Dead).
INACTIVE_STATES = frozenset({"Empty", "Dead"})
# A standalone commit's answer when the group has members again (Kafka's coordinator).
MEMBER_COMMIT_ONLY = frozenset({ErrorCode.unknown_member_id, ErrorCode.illegal_generation})


@click.group("groups")
def groups_group() -> None:
    """Inspect, reset and delete consumer groups."""


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


def _reset_spec(
    to_earliest: bool,
    to_latest: bool,
    to_offset: int | None,
    to_datetime_ms: int | None,
    by_duration_ms: int | None,
    shift_by: int | None,
    to_current: bool,
) -> ResetSpec:
    """The one reset spec given; a usage error for none or several."""
    given = [
        (kind, value)
        for kind, value, present in (
            (ResetKind.EARLIEST, 0, to_earliest),
            (ResetKind.LATEST, 0, to_latest),
            (ResetKind.OFFSET, to_offset, to_offset is not None),
            (ResetKind.DATETIME, to_datetime_ms, to_datetime_ms is not None),
            (ResetKind.DURATION, by_duration_ms, by_duration_ms is not None),
            (ResetKind.SHIFT, shift_by, shift_by is not None),
            (ResetKind.CURRENT, 0, to_current),
        )
        if present
    ]
    if len(given) != 1:
        flags = ", ".join(kind.value for kind in ResetKind)
        if not given:
            raise click.UsageError(f"give one of {flags}")
        named = " and ".join(kind.value for kind, _ in given)
        raise click.UsageError(f"give only one reset spec, not {named}")
    kind, value = given[0]
    return ResetSpec(kind, int(value or 0))


async def _reset_inputs(
    cluster: Cluster,
    spec: ResetSpec,
    partitions: Sequence[tuple[str, int]],
    committed: dict[tuple[str, int], int],
) -> dict[tuple[str, int], PartitionInputs]:
    inputs = {}
    for topic, partition in partitions:
        log_start = (await list_offset(cluster, topic, partition, "earliest")).offset
        high_watermark = (await list_offset(cluster, topic, partition, "latest")).offset
        by_timestamp = None
        if spec.kind.by_timestamp:
            found = (await list_offset(cluster, topic, partition, spec.value)).offset
            by_timestamp = found if found >= 0 else None
        inputs[(topic, partition)] = PartitionInputs(
            log_start_offset=log_start,
            high_watermark=high_watermark,
            committed=committed.get((topic, partition)),
            by_timestamp=by_timestamp,
        )
    return inputs


@groups_group.command("reset-offsets")
@click.option("--group", "group_id", required=True, help="The consumer group.")
@click.option(
    "--topic",
    "topics",
    multiple=True,
    type=TopicPartitionsType(),
    metavar="TOPIC[:P,P...]",
    help="A topic, or some of its partitions, to reset (repeatable).",
)
@click.option("--all-topics", is_flag=True, help="Every topic the group has committed offsets for.")
@click.option("--to-earliest", is_flag=True, help="Reset to the log start offset.")
@click.option("--to-latest", is_flag=True, help="Reset to the high watermark.")
@click.option(
    "--to-offset", type=click.IntRange(0, OFFSET_MAX), default=None, help="Reset to this offset."
)
@click.option(
    "--to-datetime",
    "to_datetime_ms",
    type=DateTimeType(),
    default=None,
    metavar="YYYY-MM-DDTHH:mm:SS[.sss][Z|+HH:MM]",
    help="Reset to the first offset at or after this time (no zone: local time).",
)
@click.option(
    "--by-duration",
    "by_duration_ms",
    type=DurationType(),
    default=None,
    metavar="PnDTnHnMnS",
    help="Reset to the first offset at or after now minus this duration.",
)
@click.option(
    "--shift-by",
    type=click.IntRange(-OFFSET_MAX, OFFSET_MAX),
    default=None,
    metavar="N",
    help="Move the committed offset by N (negative: back).",
)
@click.option("--to-current", is_flag=True, help="Reset to the committed offset.")
@click.option("--dry-run", is_flag=True, help="Show the new offsets only (the default).")
@click.option("--execute", is_flag=True, help="Commit the new offsets.")
@common_options
def reset_offsets(
    group_id: str,
    topics: tuple[tuple[str, tuple[int, ...] | None], ...],
    all_topics: bool,
    to_earliest: bool,
    to_latest: bool,
    to_offset: int | None,
    to_datetime_ms: int | None,
    by_duration_ms: int | None,
    shift_by: int | None,
    to_current: bool,
    dry_run: bool,
    execute: bool,
    opts: Options,
) -> None:
    """Reset the committed offsets of an inactive group (a dry run unless --execute).

    New offsets are kept within [log start, high watermark] of each partition.
    """
    if not group_id:
        raise click.BadParameter("must not be empty", param_hint="'--group'")
    if bool(topics) == all_topics:
        raise click.UsageError("give --topic (repeatable) or --all-topics, not both or neither")
    spec = _reset_spec(
        to_earliest, to_latest, to_offset, to_datetime_ms, by_duration_ms, shift_by, to_current
    )
    if dry_run and execute:
        raise click.UsageError("--dry-run and --execute do not combine")
    if spec.kind is ResetKind.DURATION:
        # The duration counts back from now; before the epoch is "everything there is".
        spec = ResetSpec(spec.kind, max(0, int(time.time() * 1000) - spec.value))

    async def go() -> list[PlannedOffset]:
        async with connect(opts) as cluster:
            admin = GroupAdmin(cluster)
            description = await admin.describe_group(group_id)
            if description.state not in INACTIVE_STATES or description.members:
                raise CliError(
                    f"Assignments can only be reset if the group '{group_id}' is inactive, "
                    f"but the current state is {description.state}."
                )
            if all_topics:
                committed = await admin.committed_positions(group_id, None)
                partitions = sorted(committed)
            else:
                names = sorted({topic for topic, _ in topics})
                await cluster.refresh_metadata(names)
                counts = {
                    name: len(info.partitions)
                    for name in names
                    if (info := cluster.topics.get(name)) is not None
                    and info.error == ErrorCode.none
                }
                try:
                    partitions = scope_partitions(topics, counts)
                except ResetError as exc:
                    raise CliError(str(exc)) from None
                committed = await admin.committed_positions(group_id, partitions)
            inputs = await _reset_inputs(cluster, spec, partitions, committed)
            try:
                planned = plan_resets(spec, inputs)
            except ResetError as exc:
                raise CliError(str(exc)) from None
            if execute and planned:
                try:
                    await admin.commit_offsets(
                        group_id, {(p.topic, p.partition): p.new_offset for p in planned}
                    )
                except KafkaError as exc:
                    if exc.code not in MEMBER_COMMIT_ONLY:
                        raise
                    # A member joined after the state was read: the coordinator now takes
                    # commits from members only.
                    raise CliError(
                        f"Assignments can only be reset if the group '{group_id}' is "
                        "inactive, but a member joined while resetting; nothing was committed."
                    ) from None
            return planned

    planned = run_async(opts, go)
    rows = [
        {
            "group": group_id,
            "topic": p.topic,
            "partition": p.partition,
            "previous_offset": p.previous_offset,
            "new_offset": p.new_offset,
        }
        for p in planned
    ]
    out = opts.out
    if out.json_mode:
        out.json({"group": group_id, "executed": execute, "offsets": rows})
        return
    columns = [
        ("group", "GROUP"),
        ("topic", "TOPIC"),
        ("partition", "PARTITION"),
        ("previous_offset", "PREVIOUS-OFFSET"),
        ("new_offset", "NEW-OFFSET"),
    ]
    out.table(columns, rows, empty="(no partitions to reset)")
    if not execute:
        out.text("Dry run: nothing was committed (add --execute to commit these offsets).")


def _delete_failure(group_id: str, code: ErrorCode) -> str:
    if code == ErrorCode.non_empty_group:
        return f"group {group_id!r} is not empty: it has active members (stop them first)"
    if code == ErrorCode.group_id_not_found:
        return f"group {group_id!r} does not exist"
    return kafka_message(code, f"group {group_id!r}")


@groups_group.command("delete")
@click.option(
    "--group", "group_ids", multiple=True, required=True, help="A group to delete (repeatable)."
)
@common_options
def delete(group_ids: tuple[str, ...], opts: Options) -> None:
    """Delete empty consumer groups and their committed offsets."""
    wanted = list(dict.fromkeys(group_ids))
    if any(not g for g in wanted):
        raise click.BadParameter("must not be empty", param_hint="'--group'")
    if len(wanted) > MAX_DELETE_GROUPS:
        raise click.BadParameter(f"at most {MAX_DELETE_GROUPS} groups", param_hint="'--group'")

    async def go() -> dict[str, ErrorCode]:
        async with connect(opts) as cluster:
            return await GroupAdmin(cluster).delete_groups(wanted)

    results = run_async(opts, go)
    rows = [
        {
            "group_id": group_id,
            "deleted": code == ErrorCode.none,
            "error": None if code == ErrorCode.none else code.name.upper(),
            "result": "deleted" if code == ErrorCode.none else _delete_failure(group_id, code),
        }
        for group_id, code in results.items()
    ]
    out = opts.out
    if out.json_mode:
        out.json(rows)
    else:
        out.table([("group_id", "GROUP"), ("result", "RESULT")], rows)
    failed = [r for r in rows if not r["deleted"]]
    if failed:
        detail = "; ".join(str(r["result"]) for r in failed)
        raise CliError(f"{len(failed)} of {len(rows)} groups not deleted: {detail}")
