"""`raftlog acls ...` and `raftlog users ...` against the in-process server with the real
ACL/SCRAM Kafka handlers over an in-memory store (tests/cli/security_backend.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import pytest
import trio
from click.testing import Result

from raftlog.config import NodeConfig
from raftlog.net.kafka.server import serve
from raftlog.security.acl import ScramMechanism
from raftlog.security.scram import verify_password
from tests.cli.conftest import invoke
from tests.cli.security_backend import SecureMemoryBackend, security_registry

RULE = "\u2500"


class SecureCli:
    def __init__(self, backend: SecureMemoryBackend, port: int) -> None:
        self.backend = backend
        self.bootstrap = f"127.0.0.1:{port}"

    async def __call__(self, *args: str, input: str | None = None) -> Result:
        return await invoke([*args, "--bootstrap-server", self.bootstrap], input=input)


@pytest.fixture
async def cli(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[SecureCli]:
    backend = SecureMemoryBackend(tmp_path)
    listeners = await nursery.start(
        partial(serve, backend, "127.0.0.1", 0, NodeConfig(), registry=security_registry())
    )
    port = listeners[0].socket.getsockname()[1]
    backend.port = port
    yield SecureCli(backend, port)
    backend.close()


def table(rows: list[tuple[str, ...]]) -> str:
    """The plain-text table cli/render.py draws: columns 3 spaces apart, a rule under the
    header, trailing spaces stripped."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, RULE * (sum(widths) + 3 * (len(widths) - 1)))
    return "\n".join(lines) + "\n"


ACL_HEADER = ("PRINCIPAL", "PERMISSION", "OPERATION", "HOST", "RESOURCE", "NAME", "PATTERN")


async def test_acls_create_list_delete(cli: SecureCli) -> None:
    r = await cli(
        "acls", "create", "--allow-principal", "User:alice", "--operation", "Read",
        "--operation", "describe", "--topic", "events", "--group", "etl",
    )  # fmt: skip
    assert (r.exit_code, r.stderr) == (0, "")
    assert r.stdout == "Created 4 ACLs:\n" + table(
        [
            ACL_HEADER,
            ("User:alice", "ALLOW", "READ", "*", "TOPIC", "events", "LITERAL"),
            ("User:alice", "ALLOW", "DESCRIBE", "*", "TOPIC", "events", "LITERAL"),
            ("User:alice", "ALLOW", "READ", "*", "GROUP", "etl", "LITERAL"),
            ("User:alice", "ALLOW", "DESCRIBE", "*", "GROUP", "etl", "LITERAL"),
        ]
    )
    r = await cli(
        "acls", "create", "--deny-principal", "User:mallory", "--deny-host", "10.0.0.9",
        "--topic", "pay", "--resource-pattern-type", "prefixed", "--json",
    )  # fmt: skip
    mallory = {
        "principal": "User:mallory",
        "permission": "DENY",
        "operation": "ALL",
        "host": "10.0.0.9",
        "resource_type": "TOPIC",
        "resource_name": "pay",
        "pattern_type": "PREFIXED",
    }
    assert json.loads(r.stdout) == {"created": [mallory]}

    r = await cli("acls", "list")
    assert r.stdout == table(
        [
            ACL_HEADER,
            ("User:alice", "ALLOW", "READ", "*", "TOPIC", "events", "LITERAL"),
            ("User:alice", "ALLOW", "DESCRIBE", "*", "TOPIC", "events", "LITERAL"),
            ("User:mallory", "DENY", "ALL", "10.0.0.9", "TOPIC", "pay", "PREFIXED"),
            ("User:alice", "ALLOW", "READ", "*", "GROUP", "etl", "LITERAL"),
            ("User:alice", "ALLOW", "DESCRIBE", "*", "GROUP", "etl", "LITERAL"),
        ]
    )
    # match: every ACL that applies to the topic "payments" (the prefixed one does).
    r = await cli("acls", "list", "--topic", "payments", "--resource-pattern-type", "match",
                  "--json")  # fmt: skip
    assert json.loads(r.stdout) == [mallory]
    r = await cli("acls", "list", "--principal", "User:nobody")
    assert r.stdout == "(no ACLs)\n"

    r = await cli("acls", "delete", "--group", "etl", "--operation", "Read")
    assert r.stdout == "Deleted 1 ACL:\n" + table(
        [ACL_HEADER, ("User:alice", "ALLOW", "READ", "*", "GROUP", "etl", "LITERAL")]
    )
    r = await cli("acls", "delete", "--group", "etl", "--json")
    assert json.loads(r.stdout)["deleted"][0]["operation"] == "DESCRIBE"
    r = await cli("acls", "delete", "--group", "etl")
    assert (r.exit_code, r.stdout) == (0, "(no ACL matched)\n")
    assert len(cli.backend.acls) == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create", "--topic", "t"], "name a principal: --allow-principal or --deny-principal"),
        (["create", "--allow-principal", "User:a"], "name a resource: --topic, --group"),
        (["create", "--allow-principal", "alice", "--topic", "t"], "expected User:NAME"),
        (["create", "--allow-principal", "User:a", "--topic", "t", "--operation", "Fly"],
         "'Fly' is not an operation"),
        (["create", "--allow-principal", "User:a", "--topic", "t",
          "--resource-pattern-type", "match"], "create takes --resource-pattern-type literal"),
        (["create", "--allow-principal", "User:a", "--topic", "*",
          "--resource-pattern-type", "prefixed"], "a PREFIXED ACL cannot use the wildcard name"),
        (["create", "--allow-host", "h", "--topic", "t", "--deny-principal", "User:b"],
         "--allow-host needs --allow-principal"),
        (["delete"], "name what to delete"),
        (["list", "--resource-pattern-type", "fuzzy"], "'fuzzy' is not one of"),
    ],
)  # fmt: skip
async def test_acls_bad_arguments_are_usage_errors(
    cli: SecureCli, args: list[str], message: str
) -> None:
    r = await cli("acls", *args)
    assert r.exit_code == 2
    assert r.stdout == ""
    assert r.stderr.startswith("error: ") and message in r.stderr
    assert r.stderr.count("\n") == 1
    assert not cli.backend.acls


async def test_users_create_list_delete(cli: SecureCli) -> None:
    r = await cli("users", "create", "--user", "alice", "--password", "wonderland")
    assert (r.exit_code, r.stdout, r.stderr) == (
        0,
        "Set the SCRAM-SHA-512 credential of user alice (8192 iterations)\n",
        "",
    )
    r = await cli(
        "users", "create", "--user", "alice", "--mechanism", "scram-sha-256",
        "--password-stdin", "--json", input="rabbit hole\n",
    )  # fmt: skip
    assert json.loads(r.stdout) == {
        "user": "alice",
        "mechanism": "SCRAM-SHA-256",
        "iterations": 4096,
    }
    r = await cli("users", "create", "--user", "bob", "--password", "b", "--iterations", "5000")
    assert r.stdout == "Set the SCRAM-SHA-512 credential of user bob (5000 iterations)\n"
    # The server got salted keys that check against the passwords, never the passwords.
    stored = cli.backend.credentials
    assert verify_password(stored[("alice", ScramMechanism.SCRAM_SHA_512)], "wonderland")
    assert verify_password(stored[("alice", ScramMechanism.SCRAM_SHA_256)], "rabbit hole")

    r = await cli("users", "list")
    assert r.stdout == table(
        [
            ("USER", "MECHANISM", "ITERATIONS"),
            ("alice", "SCRAM-SHA-256", "4096"),
            ("alice", "SCRAM-SHA-512", "8192"),
            ("bob", "SCRAM-SHA-512", "5000"),
        ]
    )
    r = await cli("users", "list", "--user", "bob", "--json")
    assert json.loads(r.stdout) == [{"user": "bob", "mechanism": "SCRAM-SHA-512",
                                     "iterations": 5000}]  # fmt: skip

    r = await cli("users", "delete", "--user", "alice", "--mechanism", "SCRAM-SHA-256")
    assert r.stdout == "Deleted the SCRAM-SHA-256 credential of user alice\n"
    r = await cli("users", "delete", "--user", "alice")
    assert r.stdout == "Deleted the SCRAM-SHA-512 credential of user alice\n"
    r = await cli("users", "delete", "--user", "alice")
    assert (r.exit_code, r.stdout, r.stderr) == (
        1,
        "",
        "error: user 'alice' has no SCRAM credential\n",
    )
    r = await cli("users", "list", "--user", "nobody")
    assert (r.exit_code, r.stderr) == (1, "error: user 'nobody' has no SCRAM credential\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create", "--user", "a"], "give exactly one of --password and --password-stdin"),
        (["create", "--user", "a", "--password", "p", "--password-stdin"], "exactly one"),
        (["create", "--user", "a", "--password", ""], "the password is empty"),
        (["create", "--user", "a", "--password", "p", "--iterations", "10"],
         "'--iterations': 10 is not in the range 4096<=x<=16384"),
        (["create", "--user", "a", "--password", "p", "--mechanism", "MD5"], "'MD5' is not one"),
        (["create", "--user", "a", "--password", "p" * 1025], "longer than 1024 bytes"),
        (["delete"], "Missing option '--user'"),
    ],
)  # fmt: skip
async def test_users_bad_arguments_are_usage_errors(
    cli: SecureCli, args: list[str], message: str
) -> None:
    r = await cli("users", *args)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr.startswith("error: ") and message in r.stderr
    assert not cli.backend.credentials
