"""Every piece of CLI output is rendered here: tables, messages, records, progress, --json.

Commands compute plain data and call one function of this module, so the look of the tool
lives in one file and `--json` is handled the same way everywhere: one compact JSON document
per command (one per record for `consume`), nothing else on stdout.

On a terminal, rich draws with colour. Anywhere else (pipes, files, tests) the output is
plain text of a fixed width with trailing spaces stripped, so it is byte-for-byte stable.
"""

from __future__ import annotations

import base64
import io
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import click
from rich import box
from rich.console import Console, RenderableType
from rich.table import Table

# Wide enough that piped tables are never wrapped mid-row.
PLAIN_WIDTH_CHARS = 200

Column = tuple[str, str]  # (key in the row dict, header)


def _plain_console(buffer: io.StringIO) -> Console:
    return Console(
        file=buffer,
        width=PLAIN_WIDTH_CHARS,
        color_system=None,
        force_terminal=False,
        highlight=False,
        emoji=False,
        markup=False,
    )


def _emit(renderable: RenderableType, *, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    if stream.isatty():
        Console(file=stream, highlight=False, emoji=False, markup=False).print(renderable)
        return
    buffer = io.StringIO()
    _plain_console(buffer).print(renderable)
    text = "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())
    click.echo(text, err=err)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value) if value else "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class Renderer:
    """Output of one command; json_mode decides between JSON and human text."""

    def __init__(self, *, json_mode: bool) -> None:
        self.json_mode = json_mode

    # ------------------------------------------------------------------ primitives
    def json(self, obj: Any) -> None:
        click.echo(json.dumps(obj, separators=(",", ":"), default=str))

    def text(self, line: str) -> None:
        click.echo(line)

    def message(self, line: str, data: Mapping[str, Any] | None = None) -> None:
        """A one-line confirmation; in JSON mode the data (or {"message": line})."""
        if self.json_mode:
            self.json(dict(data) if data is not None else {"message": line})
        else:
            self.text(line)

    def table(
        self,
        columns: Sequence[Column],
        rows: Sequence[Mapping[str, Any]],
        *,
        title: str | None = None,
        empty: str = "(none)",
    ) -> None:
        """A table in text mode; callers in JSON mode print their own document instead."""
        if title:
            self.text(title)
        if not rows:
            self.text(empty)
            return
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
        for _, header in columns:
            table.add_column(header, no_wrap=True)
        for row in rows:
            table.add_row(*(_cell(row.get(key)) for key, _ in columns))
        _emit(table)

    # ------------------------------------------------------------------ topics
    def topic_list(self, topics: Sequence[Mapping[str, Any]]) -> None:
        if self.json_mode:
            self.json(list(topics))
            return
        columns = [
            ("name", "TOPIC"),
            ("partitions", "PARTITIONS"),
            ("replication_factor", "REPLICATION"),
        ]
        self.table(columns, topics, empty="(no topics)")

    def topic_description(self, topic: Mapping[str, Any]) -> None:
        if self.json_mode:
            self.json(dict(topic))
            return
        configs = topic.get("configs") or {}
        self.text(
            f"Topic: {topic['name']}  partitions: {len(topic['partitions'])}  "
            f"replication factor: {topic['replication_factor']}"
        )
        if configs:
            self.text("Configs: " + ", ".join(f"{k}={v}" for k, v in sorted(configs.items())))
        columns = [
            ("partition", "PARTITION"),
            ("leader", "LEADER"),
            ("leader_epoch", "EPOCH"),
            ("replicas", "REPLICAS"),
            ("isr", "ISR"),
            ("high_watermark", "HW"),
            ("log_end_offset", "LEO"),
        ]
        rows = [
            {**p, "leader": p["leader"] if p["leader"] >= 0 else "none"}
            for p in topic["partitions"]
        ]
        self.table(columns, rows)

    # ------------------------------------------------------------------ records
    def record(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp_ms: int | None,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] = (),
        *,
        key_separator: str | None = None,
    ) -> None:
        """One consumed record: its value (key SEP value with a separator), or a JSON line."""
        if self.json_mode:
            self.json(
                {
                    "topic": topic,
                    "partition": partition,
                    "offset": offset,
                    "timestamp_ms": timestamp_ms,
                    "key": _bytes_text(key),
                    "value": _bytes_text(value),
                    "headers": {k: _bytes_text(v) for k, v in headers},
                }
            )
            return
        shown = _display(value)
        if key_separator is not None:
            shown = f"{_display(key)}{key_separator}{shown}"
        click.echo(shown)

    def produced(self, topic: str, by_partition: Mapping[int, tuple[int, int]]) -> None:
        """Summary of a produce: partition -> (first offset, record count)."""
        total = sum(count for _, count in by_partition.values())
        if self.json_mode:
            self.json(
                {
                    "topic": topic,
                    "records": total,
                    "partitions": {
                        str(p): {"base_offset": base, "records": count}
                        for p, (base, count) in sorted(by_partition.items())
                    },
                }
            )
            return
        parts = []
        for p, (base, count) in sorted(by_partition.items()):
            span = "offset unknown (acks=0)" if base < 0 else _offset_span(base, count)
            parts.append(f"partition {p}: {span}")
        noun = "record" if total == 1 else "records"
        detail = f" ({'; '.join(parts)})" if parts else ""
        click.echo(f"Produced {total} {noun} to {topic}{detail}")

    def consumed(self, count: int, topic: str) -> None:
        if not self.json_mode:
            noun = "record" if count == 1 else "records"
            click.echo(f"Consumed {count} {noun} from {topic}", err=True)

    # ------------------------------------------------------------------ groups
    def group_list(self, groups: Sequence[Mapping[str, Any]]) -> None:
        if self.json_mode:
            self.json(list(groups))
            return
        columns = [("group_id", "GROUP"), ("state", "STATE"), ("protocol_type", "TYPE")]
        self.table(columns, groups, empty="(no groups)")

    def group_description(self, group: Mapping[str, Any]) -> None:
        if self.json_mode:
            self.json(dict(group))
            return
        self.text(
            f"Group: {group['group_id']}  state: {group['state']}  "
            f"coordinator: {group['coordinator_id']}  members: {len(group['members'])}"
        )
        member_rows = [
            {**m, "assignment": [f"{t}-{p}" for t, p in m["assignment"]]} for m in group["members"]
        ]
        columns = [
            ("member_id", "MEMBER"),
            ("client_id", "CLIENT-ID"),
            ("client_host", "HOST"),
            ("assignment", "ASSIGNMENT"),
        ]
        self.table(columns, member_rows, title="Members:", empty="(no active members)")
        offset_columns = [
            ("topic", "TOPIC"),
            ("partition", "PARTITION"),
            ("committed_offset", "COMMITTED"),
            ("high_watermark", "HW"),
            ("lag", "LAG"),
        ]
        self.table(
            offset_columns, group["offsets"], title="Offsets:", empty="(no committed offsets)"
        )

    # ------------------------------------------------------------------ quotas
    def quotas(self, entries: Sequence[Mapping[str, Any]]) -> None:
        """entries: {"entity": path, "components": {...}, "quotas": {key: value}}."""
        if self.json_mode:
            self.json(list(entries))
            return
        rows = [
            {"entity": e["entity"], "key": key, "value": value}
            for e in entries
            for key, value in sorted(e["quotas"].items())
        ]
        columns = [("entity", "ENTITY"), ("key", "KEY"), ("value", "VALUE")]
        self.table(columns, rows, empty="(no quotas)")

    def quota_usage(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Per-broker sensors: measured rate against the quota, and time spent throttled."""
        if self.json_mode:
            self.json(list(rows))
            return
        columns = [
            ("node", "NODE"),
            ("entity", "ENTITY"),
            ("key", "KEY"),
            ("client_id", "CLIENT ID"),
            ("quota", "QUOTA"),
            ("rate", "RATE"),
            ("throttle_time_total_ms", "THROTTLED MS"),
        ]
        self.table(columns, list(rows), empty="(no client is near a quota)")

    # ------------------------------------------------------------------ cluster
    def cluster_started(self, info: Mapping[str, Any]) -> None:
        if self.json_mode:
            self.json(dict(info))
            return
        bootstrap = info["bootstrap_servers"]
        self.text(f"raftlog cluster is up: {len(info['nodes'])} nodes in {info['dir']}")
        self.text(f"  bootstrap servers: {bootstrap}")
        self.text("  create a topic:    raftlog topics create events --partitions 3")
        self.text("  produce:           echo hello | raftlog produce events")
        self.text("  consume:           raftlog consume events --from-beginning -n 1")
        self.text("  status / stop:     raftlog cluster status / raftlog cluster down")

    def cluster_status(self, status: Mapping[str, Any]) -> None:
        if self.json_mode:
            self.json(dict(status))
            return
        quorum = status.get("quorum")
        verdict = "healthy" if status["healthy"] else "DEGRADED"
        self.text(f"Cluster {status.get('cluster_id') or '?'}: {verdict}")
        if quorum:
            self.text(
                f"Quorum: leader {quorum['leader_id']}  epoch {quorum['leader_epoch']}  "
                f"high watermark {quorum['high_watermark']}"
            )
        node_columns = [
            ("node_id", "NODE"),
            ("process", "PROCESS"),
            ("voter_lag", "VOTER LAG"),
            ("broker", "BROKER"),
            ("address", "ADDRESS"),
        ]
        self.table(node_columns, status["nodes"])
        self.text(
            f"Partitions: {status['partitions_total']} total, "
            f"{len(status['under_replicated'])} under-replicated, "
            f"{len(status['offline'])} offline"
        )
        reasons = status.get("reasons", {})
        for kind, names in (
            ("under-replicated", status["under_replicated"]),
            ("offline", status["offline"]),
        ):
            for name in names:
                why = reasons.get(name)
                self.text(f"  {kind}: {name}" + (f" ({why})" if why else ""))
        for problem in status.get("problems", ()):
            self.text(f"  problem: {problem}")

    @contextmanager
    def progress(self, description: str) -> Iterator[Any]:
        """A spinner on stderr while waiting; yields a callable that updates its text."""
        if self.json_mode or not sys.stderr.isatty():
            click.echo(description, err=True)
            yield lambda text: None
            return
        console = Console(file=sys.stderr, highlight=False, emoji=False, markup=False)
        with console.status(description) as status:
            yield lambda text: status.update(f"{description} {text}")


def _offset_span(base: int, count: int) -> str:
    return f"offset {base}" if count == 1 else f"offsets {base}-{base + count - 1}"


def _display(data: bytes | None) -> str:
    if data is None:
        return "null"
    return data.decode("utf-8", errors="replace")


def _bytes_text(data: bytes | None) -> str | None:
    """UTF-8 text when the bytes are text, else "base64:..." so JSON never loses bytes."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode("ascii")


def error(message: str) -> None:
    """The one-line error format every command uses."""
    click.echo(f"error: {message}", err=True)
