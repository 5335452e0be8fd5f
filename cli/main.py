"""The `raftlog` command: one module per command group, registered here."""

from __future__ import annotations

import click

from raftlog import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="raftlog")
def cli() -> None:
    """raftlog: a Kafka-compatible, Raft-replicated partitioned log."""


def _register() -> None:
    from raftlog_cli.node import node_command

    cli.add_command(node_command)


_register()


def main() -> None:
    cli(prog_name="raftlog")


if __name__ == "__main__":
    main()
