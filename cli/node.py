"""`raftlog node --config FILE`: run one node in the foreground."""

from __future__ import annotations

import sys
import textwrap

import click

from raftlog.config import NodeConfig, config_docs
from raftlog.errors import ConfigError


def _config_epilog() -> str:
    lines = ["\b", "Config keys (TOML, one flat table; defaults shown):"]
    for key, default, doc in config_docs():
        lines.append(f"  {key} = {default}")
        lines.extend("      " + part for part in textwrap.wrap(doc, 70))
    return "\n".join(lines)


@click.command("node", epilog=_config_epilog())
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="TOML file with this node's settings.",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    envvar="RAFTLOG_LOG_LEVEL",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
def node_command(config_path: str, log_level: str) -> None:
    """Run one raftlog node (controller, broker or both) until SIGTERM or Ctrl-C."""
    try:
        config = NodeConfig.load(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    from raftlog.node import run_node

    sys.exit(run_node(config, log_level=log_level.upper()))
