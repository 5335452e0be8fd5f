"""Output of the security commands (acls, users) and of a secure `cluster up`, drawn with
the shared Renderer's table and JSON primitives (cli/render.py) so they look like the rest."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from raftlog_cli.render import Renderer

from raftlog.security.acl import AclBinding

ACL_COLUMNS = [
    ("principal", "PRINCIPAL"),
    ("permission", "PERMISSION"),
    ("operation", "OPERATION"),
    ("host", "HOST"),
    ("resource_type", "RESOURCE"),
    ("resource_name", "NAME"),
    ("pattern_type", "PATTERN"),
]
USER_COLUMNS = [("user", "USER"), ("mechanism", "MECHANISM"), ("iterations", "ITERATIONS")]


def acl_json(b: AclBinding) -> dict[str, Any]:
    """One ACL with Kafka's names for its parts (READ, ALLOW, TOPIC, LITERAL)."""
    return {
        "principal": b.principal,
        "permission": b.permission.name,
        "operation": b.operation.name,
        "host": b.host,
        "resource_type": b.resource_type.name,
        "resource_name": b.resource_name,
        "pattern_type": b.pattern_type.name,
    }


def render_acls(
    out: Renderer,
    bindings: Sequence[AclBinding],
    *,
    json_doc: Any,
    title: str | None = None,
    empty: str = "(no ACLs)",
) -> None:
    if out.json_mode:
        out.json(json_doc)
        return
    if title and bindings:
        out.text(title)
    out.table(ACL_COLUMNS, [acl_json(b) for b in bindings], empty=empty)


def render_users(out: Renderer, rows: Sequence[Mapping[str, Any]]) -> None:
    """rows: {"user", "mechanism", "iterations"}, one per credential."""
    if out.json_mode:
        out.json(list(rows))
        return
    out.table(USER_COLUMNS, rows, empty="(no SCRAM users)")


def render_secure_cluster(out: Renderer, info: Mapping[str, Any]) -> None:
    """What `cluster up --secure` prints: the usual summary plus how to connect."""
    if out.json_mode:
        out.json(dict(info))
        return
    properties = info["client_properties"]
    out.text(f"raftlog cluster is up (SASL_SSL): {len(info['nodes'])} nodes in {info['dir']}")
    out.text(f"  bootstrap servers: {info['bootstrap_servers']}")
    out.text(f"  admin user:        {info['admin_user']} (SCRAM-SHA-512; password in the file)")
    out.text(f"  client properties: {properties}")
    out.text(f"  CA certificate:    {info['ca_location']}")
    out.text("  raftlog commands in this directory use the properties file by themselves;")
    out.text(f"  elsewhere:         raftlog topics list --command-config {properties}")
    out.text(f"  kcat:              kcat -F {properties} -L")
    out.text("  status / stop:     raftlog cluster status / raftlog cluster down")
