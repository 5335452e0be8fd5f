"""`raftlog topics create|list|describe|alter|add-partitions|delete|reassign|elect-leaders`."""

from __future__ import annotations

from typing import Any

import click
import trio
from raftlog_cli.common import Options, common_options, connect, parse_key_values, run_async
from raftlog_cli.errors import CliError, kafka_message, unknown_topic

from raftlog.client import Admin, ConfigOp, NewTopic, ResourceType
from raftlog.client.groups import partition_offsets
from raftlog.errors import ErrorCode, KafkaError


@click.group("topics")
def topics_group() -> None:
    """Create, list, describe, alter and delete topics."""


def _check(result_error: ErrorCode, name: str, message: str | None) -> None:
    if result_error == ErrorCode.unknown_topic_or_partition:
        raise unknown_topic(name)
    if result_error != ErrorCode.none:
        detail = f"topic {name!r}" + (f" ({message})" if message else "")
        raise CliError(kafka_message(result_error, detail))


@topics_group.command("create")
@click.argument("name")
@click.option("--partitions", type=click.IntRange(min=1), default=None, help="Partition count.")
@click.option(
    "--replication-factor", type=click.IntRange(min=1), default=None, help="Replicas per partition."
)
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE", help="Topic config.")
@common_options
def create(
    name: str,
    partitions: int | None,
    replication_factor: int | None,
    configs: tuple[str, ...],
    opts: Options,
) -> None:
    """Create topic NAME (defaults: the cluster's num_partitions and replication factor)."""
    config_map = parse_key_values(configs, "--config")

    async def go() -> dict[str, Any]:
        async with connect(opts) as cluster:
            topic = NewTopic(
                name,
                num_partitions=partitions or -1,
                replication_factor=replication_factor or -1,
                configs=config_map,
            )
            result = (await Admin(cluster).create_topics([topic]))[name]
            _check(result.error, name, result.message)
            shape = await _created_shape(Admin(cluster), name)
            if shape is None:
                # Not visible in time: say what was asked for, never a made-up 0.
                return {
                    "name": name,
                    "partitions": partitions,
                    "replication_factor": replication_factor,
                }
            count, rf = shape
            return {"name": name, "partitions": count, "replication_factor": rf}

    created = run_async(opts, go)
    count = created["partitions"]
    rf = created["replication_factor"]
    opts.out.message(
        f"Created topic {name} ({'the default number of' if count is None else count} "
        f"partitions, replication factor {'the default' if rf is None else rf})",
        {"created": created},
    )


# CreateTopics is answered once the controller has committed the topic; the broker the next
# Metadata request reaches may not have applied it yet (it then lists the topic without
# partitions). The defaults the cluster chose are read back once the topic shows them.
CREATED_VISIBLE_DEADLINE_S = 10.0
CREATED_POLL_INTERVAL_S = 0.1


async def _created_shape(admin: Admin, name: str) -> tuple[int, int] | None:
    """(partitions, replication factor) of the new topic once a broker lists it whole, or
    None if none does within CREATED_VISIBLE_DEADLINE_S."""
    with trio.move_on_after(CREATED_VISIBLE_DEADLINE_S):
        while True:
            info = (await admin.describe_topics([name])).get(name)
            if info is not None and info.partitions and all(p.replicas for p in info.partitions):
                return len(info.partitions), len(info.partitions[0].replicas)
            await trio.sleep(CREATED_POLL_INTERVAL_S)
    return None


@topics_group.command("list")
@click.option("--internal", is_flag=True, help="Include internal topics.")
@common_options
def list_topics(internal: bool, opts: Options) -> None:
    """List topics."""

    async def go() -> list[dict[str, Any]]:
        async with connect(opts) as cluster:
            admin = Admin(cluster)
            names = await admin.list_topics(include_internal=internal)
            infos = await admin.describe_topics(names) if names else {}
            return [
                {
                    "name": n,
                    "partitions": len(infos[n].partitions),
                    "replication_factor": (
                        len(infos[n].partitions[0].replicas) if infos[n].partitions else 0
                    ),
                }
                for n in names
                if n in infos
            ]

    opts.out.topic_list(run_async(opts, go))


@topics_group.command("describe")
@click.argument("name")
@common_options
def describe(name: str, opts: Options) -> None:
    """Leader, replicas, ISR, high watermark and log end offset of each partition."""

    async def go() -> dict[str, Any]:
        async with connect(opts) as cluster:
            admin = Admin(cluster)
            infos = await admin.describe_topics([name])
            info = infos.get(name)
            if info is None or info.error == ErrorCode.unknown_topic_or_partition:
                raise unknown_topic(name)
            _check(info.error, name, None)
            partitions = []
            for p in info.partitions:
                hw: int | None
                leo: int | None
                try:
                    offsets = await partition_offsets(cluster, name, p.partition)
                    hw, leo = offsets.high_watermark, offsets.log_end_offset
                except KafkaError:
                    hw = leo = None  # no leader right now: shown as "-"
                partitions.append(
                    {
                        "partition": p.partition,
                        "leader": p.leader_id,
                        "leader_epoch": p.leader_epoch,
                        "replicas": list(p.replicas),
                        "isr": list(p.isr),
                        "high_watermark": hw,
                        "log_end_offset": leo,
                    }
                )
            configs = await admin.describe_configs([(ResourceType.TOPIC, name)])
            values = configs.get((ResourceType.TOPIC, name), {})
            return {
                "name": name,
                "replication_factor": len(info.partitions[0].replicas) if info.partitions else 0,
                "configs": {k: v for k, v in sorted(values.items()) if v is not None},
                "partitions": partitions,
            }

    opts.out.topic_description(run_async(opts, go))


@topics_group.command("alter")
@click.argument("name")
@click.option(
    "--config", "configs", multiple=True, metavar="KEY=VALUE", help="Set a config (repeatable)."
)
@click.option(
    "--delete-config", "deletes", multiple=True, metavar="KEY", help="Remove a config override."
)
@common_options
def alter(name: str, configs: tuple[str, ...], deletes: tuple[str, ...], opts: Options) -> None:
    """Change topic configs (only the keys given; others keep their values)."""
    sets = parse_key_values(configs, "--config")
    if not sets and not deletes:
        raise click.UsageError("nothing to change: give --config KEY=VALUE or --delete-config")
    ops: list[tuple[str, ConfigOp, str | None]] = [
        (k, ConfigOp.SET, v) for k, v in sets.items()
    ] + [(k, ConfigOp.DELETE, None) for k in deletes]

    async def go() -> None:
        async with connect(opts) as cluster:
            if name not in await Admin(cluster).list_topics(include_internal=True):
                raise unknown_topic(name)
            await Admin(cluster).incremental_alter_configs((ResourceType.TOPIC, name), ops)

    run_async(opts, go)
    changes = [f"{k}={v}" for k, v in sets.items()] + [f"{k} (deleted)" for k in deletes]
    opts.out.message(
        f"Updated topic {name}: {', '.join(changes)}",
        {"topic": name, "set": sets, "deleted": list(deletes)},
    )


@topics_group.command("add-partitions")
@click.argument("name")
@click.option("--total", type=click.IntRange(min=1), required=True, help="New partition count.")
@common_options
def add_partitions(name: str, total: int, opts: Options) -> None:
    """Grow topic NAME to --total partitions (partitions are never removed)."""

    async def go() -> None:
        async with connect(opts) as cluster:
            result = (await Admin(cluster).create_partitions({name: total}))[name]
            _check(result.error, name, result.message)

    run_async(opts, go)
    opts.out.message(
        f"Topic {name} now has {total} partitions", {"topic": name, "partitions": total}
    )


@topics_group.command("delete")
@click.argument("name")
@common_options
def delete(name: str, opts: Options) -> None:
    """Delete topic NAME and its data."""

    async def go() -> None:
        async with connect(opts) as cluster:
            result = (await Admin(cluster).delete_topics([name]))[name]
            _check(result.error, name, result.message)

    run_async(opts, go)
    opts.out.message(f"Deleted topic {name}", {"deleted": name})


# Moving partitions and leaders: their own module, in the topics group as in Kafka's tools.
def _add_reassignment_commands() -> None:
    from raftlog_cli.reassign import elect_leaders, reassign

    topics_group.add_command(reassign)
    topics_group.add_command(elect_leaders)


_add_reassignment_commands()
