"""`raftlog users create|list|delete`: SCRAM credentials (KIP-554).

The password is salted and hashed here (PBKDF2 with --iterations) and only the salted
password is sent, as kafka-configs.sh does. --password puts it on the command line (and in
the shell history); --password-stdin reads the first line of standard input instead.
"""

from __future__ import annotations

import sys
from typing import Any

import click
from raftlog_cli.common import Options, common_options, connect, run_async
from raftlog_cli.errors import CliError, kafka_message
from raftlog_cli.render_security import render_users

from raftlog.client import Admin, ScramDeletion, ScramUpsertion
from raftlog.client.admin_security import DEFAULT_ITERATIONS, check_iterations
from raftlog.errors import ErrorCode
from raftlog.security.acl import ScramMechanism
from raftlog.security.scram import MAX_ITERATIONS, MAX_PASSWORD_BYTES, MIN_ITERATIONS

MECHANISM_NAMES = [m.sasl_name for m in DEFAULT_ITERATIONS]
DEFAULT_MECHANISM = ScramMechanism.SCRAM_SHA_512.sasl_name


def _mechanism(name: str) -> ScramMechanism:
    return ScramMechanism[name.upper().replace("-", "_")]


def _user_error(user: str, code: ErrorCode, message: str | None) -> CliError:
    if code == ErrorCode.resource_not_found:
        return CliError(f"user {user!r} has no SCRAM credential" + _for(message))
    return CliError(kafka_message(code, f"user {user!r}" + _for(message)))


def _for(message: str | None) -> str:
    return f" ({message})" if message else ""


@click.group("users")
def users_group() -> None:
    """Create, list and delete SCRAM users (SASL SCRAM-SHA-256/512 credentials)."""


@users_group.command("create")
@click.option("--user", required=True, help="User name (its principal is User:NAME).")
@click.option(
    "--mechanism",
    type=click.Choice(MECHANISM_NAMES, case_sensitive=False),
    default=DEFAULT_MECHANISM,
    show_default=True,
)
@click.option("--password", default=None, help="The password (visible to other local users).")
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin's first line.")
@click.option(
    "--iterations",
    type=click.IntRange(MIN_ITERATIONS, MAX_ITERATIONS),
    default=None,
    help="PBKDF2 iterations (default: 8192 for SCRAM-SHA-512, 4096 for SCRAM-SHA-256).",
)
@common_options
def create(
    user: str,
    mechanism: str,
    password: str | None,
    password_stdin: bool,
    iterations: int | None,
    opts: Options,
) -> None:
    """Set USER's SCRAM password for one mechanism (creating the user, or replacing it)."""
    if (password is None) == (not password_stdin):
        raise click.UsageError("give exactly one of --password and --password-stdin")
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    assert password is not None
    if not password:
        raise click.UsageError("the password is empty")
    if len(password.encode("utf-8", "surrogatepass")) > MAX_PASSWORD_BYTES:
        raise click.UsageError(f"the password is longer than {MAX_PASSWORD_BYTES} bytes")
    if not user.strip():
        raise click.UsageError("the user name is empty")
    scram = _mechanism(mechanism)
    count = check_iterations(scram, iterations)
    upsertion = ScramUpsertion(user, scram, password, count)

    async def go() -> None:
        async with connect(opts) as cluster:
            results = await Admin(cluster).alter_user_scram_credentials([upsertion])
        for name, result in results.items():
            if result.error != ErrorCode.none:
                raise _user_error(name, result.error, result.message)

    run_async(opts, go)
    opts.out.message(
        f"Set the {scram.sasl_name} credential of user {user} ({count} iterations)",
        {"user": user, "mechanism": scram.sasl_name, "iterations": count},
    )


@users_group.command("list")
@click.option("--user", "users", multiple=True, help="Only this user (repeatable).")
@common_options
def list_users(users: tuple[str, ...], opts: Options) -> None:
    """List SCRAM users with their mechanisms and iteration counts (never a secret)."""

    async def go() -> list[dict[str, Any]]:
        async with connect(opts) as cluster:
            found = await Admin(cluster).describe_user_scram_credentials(list(users) or None)
        rows: list[dict[str, Any]] = []
        for name, described in sorted(found.items()):
            if described.error != ErrorCode.none:
                raise _user_error(name, described.error, described.message)
            rows.extend(
                {"user": name, "mechanism": mechanism.sasl_name, "iterations": count}
                for mechanism, count in sorted(described.credentials)
            )
        return rows

    render_users(opts.out, run_async(opts, go))


@users_group.command("delete")
@click.option("--user", required=True, help="User name.")
@click.option(
    "--mechanism",
    type=click.Choice(MECHANISM_NAMES, case_sensitive=False),
    default=None,
    help="Delete only this mechanism's credential (default: every one the user has).",
)
@common_options
def delete(user: str, mechanism: str | None, opts: Options) -> None:
    """Delete USER's SCRAM credentials; the user can no longer log in with them."""

    async def go() -> list[str]:
        async with connect(opts) as cluster:
            admin = Admin(cluster)
            if mechanism is not None:
                mechanisms = [_mechanism(mechanism)]
            else:
                described = (await admin.describe_user_scram_credentials([user])).get(user)
                if described is None or described.error != ErrorCode.none:
                    code = described.error if described else ErrorCode.resource_not_found
                    raise _user_error(user, code, described.message if described else None)
                mechanisms = [m for m, _ in sorted(described.credentials)]
            results = await admin.alter_user_scram_credentials(
                deletions=[ScramDeletion(user, m) for m in mechanisms]
            )
        for name, result in results.items():
            if result.error != ErrorCode.none:
                raise _user_error(name, result.error, result.message)
        return [m.sasl_name for m in mechanisms]

    removed = run_async(opts, go)
    opts.out.message(
        f"Deleted the {' and '.join(removed)} credential{'s' if len(removed) > 1 else ''} "
        f"of user {user}",
        {"user": user, "deleted": removed},
    )
