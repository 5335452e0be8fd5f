"""The `raftlog` command: one module per command group, registered here."""

from __future__ import annotations

import sys
from typing import Any

import click
from raftlog_cli.errors import one_line
from raftlog_cli.render import error

from raftlog import __version__


class RaftlogGroup(click.Group):
    """click.Group whose errors are one line on stderr (`error: ...`), never a usage dump."""

    def main(  # type: ignore[override]
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
            error(one_line(exc.format_message()) + hint)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            error(one_line(exc.format_message()))
            sys.exit(exc.exit_code)
        except click.Abort:
            error("aborted")
            sys.exit(1)
        if not standalone_mode:
            return result
        sys.exit(result if isinstance(result, int) else 0)


@click.group(cls=RaftlogGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="raftlog")
def cli() -> None:
    """raftlog: a Kafka-compatible, Raft-replicated partitioned log."""


def _register() -> None:
    from raftlog_cli.acls import acls_group
    from raftlog_cli.cluster import cluster_group
    from raftlog_cli.consume import consume_command
    from raftlog_cli.groups import groups_group
    from raftlog_cli.node import node_command
    from raftlog_cli.produce import produce_command
    from raftlog_cli.quorum import describe_quorum  # noqa: F401 - adds cluster add-voter etc.
    from raftlog_cli.quotas import quotas_group
    from raftlog_cli.topics import topics_group
    from raftlog_cli.transactions import transactions_group
    from raftlog_cli.users import users_group

    for command in (
        node_command,
        cluster_group,
        topics_group,
        produce_command,
        consume_command,
        groups_group,
        quotas_group,
        acls_group,
        users_group,
        transactions_group,
    ):
        cli.add_command(command)


_register()


def main() -> None:
    cli(prog_name="raftlog")


if __name__ == "__main__":
    main()
