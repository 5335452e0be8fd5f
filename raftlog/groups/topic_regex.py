"""Regular-expression subscriptions of the consumer group protocol (KIP-848), sans-IO.

A member may subscribe with `SubscribedTopicRegex`; the coordinator, not the client, resolves
it against the cluster's topic names, as Kafka 4.0 does. Kafka compiles it with RE2/J; this
uses RE2 (google-re2), the same syntax family and, more to the point, matching in time
linear in the name: a hostile pattern such as "(a+)+$" cannot hang the coordinator, which
serves every group of its offsets partitions on one event loop.

A topic matches when the whole name matches (Java's Matcher.matches(), which Kafka uses),
internal topics never do (the caller leaves them out of the names it passes), and one regex
matches at most MAX_REGEX_MATCHED_TOPICS topics (the first ones by name; the rest are logged
and left out), so one subscription cannot grow a group's stored record or its assignment
without bound.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable

import re2

from raftlog.errors import RemoteError

log = logging.getLogger(__name__)

# Kafka bounds a regex only by the request's size; raftlog bounds its text and the memory RE2
# may use to compile it (RE2's own default budget), which bounds the matching work too.
MAX_REGEX_CHARS = 4096
REGEX_MAX_MEM_BYTES = 8 << 20
# As many topics as a member may name (SubscribedTopicNames' limit in the handler).
MAX_REGEX_MATCHED_TOPICS = 10_000
# Compiled patterns kept: a group's members mostly share one regex, re-resolved on changes.
_COMPILED_CACHE_SIZE = 256


class InvalidRegex(RemoteError, ValueError):
    """The pattern is too long or RE2 refuses it (INVALID_REGULAR_EXPRESSION). A ValueError
    too: a stored group whose regex no longer compiles is refused at load like any other
    inconsistent value."""


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = REGEX_MAX_MEM_BYTES
    options.log_errors = False  # refused patterns are answered to the client, not logged
    return options


@functools.lru_cache(maxsize=_COMPILED_CACHE_SIZE)
def compile_regex(pattern: str) -> re2._Regexp:
    """The compiled pattern; raises InvalidRegex with Kafka's wording of the problem."""
    if len(pattern) > MAX_REGEX_CHARS:
        raise InvalidRegex(
            f"SubscribedTopicRegex is {len(pattern)} characters, the limit is {MAX_REGEX_CHARS}."
        )
    try:
        return re2.compile(pattern, _options())
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise InvalidRegex(
            f"SubscribedTopicRegex `{pattern}` is not a valid regular expression: {reason}."
        ) from None


def check_regex(pattern: str) -> None:
    """Raises InvalidRegex unless `pattern` compiles within the limits."""
    compile_regex(pattern)


def match_topics(pattern: str, topic_names: Iterable[str]) -> frozenset[str]:
    """The names `pattern` matches whole, at most MAX_REGEX_MATCHED_TOPICS of them (the
    first by name); an invalid pattern matches nothing."""
    try:
        regex = compile_regex(pattern)
    except InvalidRegex as exc:
        # Checked at decode, so only a stored pattern from an older, laxer node gets here.
        log.warning("regex subscription matches nothing: %s", exc)
        return frozenset()
    matched = sorted(name for name in topic_names if regex.fullmatch(name) is not None)
    if len(matched) > MAX_REGEX_MATCHED_TOPICS:
        log.warning(
            "SubscribedTopicRegex `%s` matches %d topics; only the first %d (by name) are "
            "subscribed",
            pattern,
            len(matched),
            MAX_REGEX_MATCHED_TOPICS,
        )
        matched = matched[:MAX_REGEX_MATCHED_TOPICS]
    return frozenset(matched)
