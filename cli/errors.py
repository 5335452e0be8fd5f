"""The one place where exceptions become the CLI's one-line error messages.

Every command runs through `run_async` (cli/common.py), which hands anything that escapes to
`explain()`. Messages are single lines (so scripts can grep them) and never tracebacks;
RAFTLOG_DEBUG=1 re-raises for a developer who wants the traceback.
"""

from __future__ import annotations

import click
import trio

from raftlog.client.auth import AuthenticationFailed, TlsHandshakeFailed
from raftlog.client.connection import ConnectionClosed, RequestTimeout, UnsupportedVersion
from raftlog.errors import ConfigError, ErrorCode, KafkaError, LocalError
from raftlog.quotas.entity import QuotaValidationError

# What a Kafka error code means to someone at a terminal.
_KAFKA_MESSAGES: dict[ErrorCode, str] = {
    ErrorCode.unknown_topic_or_partition: "unknown topic or partition",
    ErrorCode.topic_already_exists: "topic already exists",
    ErrorCode.invalid_replication_factor: "not enough brokers for the replication factor",
    ErrorCode.invalid_partitions: "invalid number of partitions",
    ErrorCode.invalid_config: "bad config value",
    ErrorCode.invalid_topic_exception: "invalid topic name",
    ErrorCode.policy_violation: "refused by the cluster's policy",
    ErrorCode.leader_not_available: "the partition has no leader right now",
    ErrorCode.not_enough_replicas: "not enough in-sync replicas for acks=all",
    ErrorCode.not_enough_replicas_after_append: "not enough in-sync replicas for acks=all",
    ErrorCode.request_timed_out: "the cluster did not answer in time",
    ErrorCode.group_id_not_found: "unknown consumer group",
    ErrorCode.coordinator_not_available: "the group coordinator is not available",
    ErrorCode.not_coordinator: "the group coordinator moved",
    ErrorCode.offset_out_of_range: "offset out of range",
    ErrorCode.unknown_member_id: "the group has active members; stop them first",
    ErrorCode.illegal_generation: "the group has active members; stop them first",
    ErrorCode.rebalance_in_progress: "the group is rebalancing",
    ErrorCode.throttling_quota_exceeded: "controller mutation quota exceeded; retry later",
    ErrorCode.topic_authorization_failed: "not authorized for the topic",
    ErrorCode.group_authorization_failed: "not authorized for the group",
    ErrorCode.cluster_authorization_failed: "not authorized for this cluster operation",
    ErrorCode.transactional_id_authorization_failed: "not authorized for the transactional id",
    ErrorCode.sasl_authentication_failed: "authentication failed",
    ErrorCode.security_disabled: "security (the authorizer) is not enabled on the cluster",
}


class CliError(click.ClickException, LocalError):
    """A failure the user can act on; printed as `error: <message>` with exit code 1."""


def leaf_exception(exc: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups that trio nurseries raise."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        # Prefer an exception that says something over a Cancelled sibling.
        interesting = [e for e in exc.exceptions if not isinstance(e, trio.Cancelled)]
        exc = (interesting or list(exc.exceptions))[0]
    return exc


def unknown_topic(name: str) -> CliError:
    return CliError(f"unknown topic {name!r}")


def kafka_message(code: ErrorCode, detail: str = "") -> str:
    phrase = _KAFKA_MESSAGES.get(code, code.name.replace("_", " "))
    return f"{phrase}: {detail}" if detail else phrase


def explain(exc: BaseException, bootstrap: str | None = None) -> str | None:
    """A one-line message for exc, or None if it is not an error the CLI knows."""
    exc = leaf_exception(exc)
    where = f" at {bootstrap}" if bootstrap else ""
    if isinstance(exc, click.ClickException):
        return exc.format_message()
    if isinstance(exc, QuotaValidationError):
        return exc.message
    if isinstance(exc, KafkaError):
        if exc.code == ErrorCode.unknown_topic_or_partition and exc.message.startswith("topic "):
            return f"unknown {exc.message}"
        return kafka_message(exc.code, exc.message)
    if isinstance(exc, AuthenticationFailed | TlsHandshakeFailed):
        return str(exc)
    if isinstance(exc, UnsupportedVersion):
        return f"the cluster does not support this operation ({exc})"
    if isinstance(exc, ConnectionClosed) and "closed by the broker" in str(exc):
        # A TLS or SASL listener hangs up on a client that speaks neither.
        return (
            f"the cluster{where} closed the connection; if it is secured, pass "
            "--command-config with its security.protocol, sasl.* and ssl.* settings"
        )
    if isinstance(exc, ConnectionRefusedError | ConnectionClosed):
        return f"cannot reach the cluster{where}: is it running? (start one: raftlog cluster up)"
    if isinstance(exc, RequestTimeout | trio.TooSlowError | TimeoutError):
        return f"the cluster{where} did not answer in time"
    if isinstance(exc, OSError):
        return f"cannot reach the cluster{where}: {exc.strerror or exc}"
    if isinstance(exc, ConfigError | ValueError):
        return str(exc)
    return None


def one_line(message: str) -> str:
    return " ".join(message.split())
