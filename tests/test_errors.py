"""Every exception raftlog defines is a RaftlogError, and either local or remote (as h11 splits
them): local for this process's own misuse, broken invariants or files, remote for what a peer
or client sent or could not do."""

import importlib
import inspect
import pkgutil

import raftlog_cli

import raftlog
from raftlog.errors import LocalError, RaftlogError, RemoteError

# Needs pyspark, which the unit-test environment may lack.
OPTIONAL = ("raftlog.spark.source", "raftlog.spark.reader")


def _defined_exceptions() -> list[type[BaseException]]:
    found = []
    for package in (raftlog, raftlog_cli):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            try:
                module = importlib.import_module(info.name)
            except ImportError:
                if info.name in OPTIONAL:
                    continue
                raise
            found += [
                obj
                for obj in vars(module).values()
                if inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
            ]
    return found


def test_every_exception_is_local_or_remote():
    classes = _defined_exceptions()
    assert len(classes) > 30
    bases = {RaftlogError, LocalError, RemoteError}
    for cls in classes:
        if cls in bases:
            continue
        name = f"{cls.__module__}.{cls.__qualname__}"
        assert issubclass(cls, RaftlogError), f"{name} is not a RaftlogError"
        assert issubclass(cls, LocalError) != issubclass(cls, RemoteError), (
            f"{name} must be exactly one of LocalError and RemoteError"
        )


def test_value_errors_stay_value_errors():
    from raftlog.client.consumer_protocol import ConsumerProtocolError
    from raftlog.codec import DecodeError
    from raftlog.config_keys import ConfigValueError
    from raftlog.spark.options import OptionError

    for cls in (ConsumerProtocolError, DecodeError, ConfigValueError, OptionError):
        assert issubclass(cls, ValueError), cls
