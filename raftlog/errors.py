"""Kafka error codes and the project's exception types.

Error codes come from kio's generated enum (the Kafka protocol's own table); this module only
adds exceptions that carry one, so a layer deep in the broker can raise and the protocol layer
can answer with the right code.

Every exception raftlog defines derives from RaftlogError through exactly one of two bases, as
h11 splits its errors: LocalError (this process misused itself, broke an invariant, found its
own file damaged or its configuration wrong) and RemoteError (a peer or client sent something
invalid or could not do what was asked). tests/test_errors.py keeps it so.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = [
    "ConfigError",
    "CorruptRecordError",
    "ErrorCode",
    "KafkaError",
    "LocalError",
    "RaftlogError",
    "RemoteError",
    "exception_leaves",
]


class RaftlogError(Exception):
    """Base class of every error raised by raftlog itself."""


class LocalError(RaftlogError):
    """This process was misused or found its own state broken: a bug, a damaged file of its
    own, or a misconfiguration by its operator. Nothing a peer sent caused it."""


class RemoteError(RaftlogError):
    """A peer or client sent something invalid or asked for something that cannot be done; the
    input is refused (with an error code where the protocol has one) and the process goes on."""


class ConfigError(LocalError):
    """A node or cluster configuration value is missing or invalid (message says which)."""


class KafkaError(RemoteError):
    """An error that maps onto a Kafka protocol error code, answered to the peer."""

    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(f"{code.name}: {message}" if message else code.name)
        self.code = code
        self.message = message


class CorruptRecordError(KafkaError):
    """A record batch failed validation (magic, size, CRC); nothing from it was stored."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.corrupt_message, message)


def exception_leaves(error: BaseException) -> list[BaseException]:
    """The individual errors inside (nested) exception groups, as trio nurseries raise them."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in exception_leaves(inner)]
    return [error]
