"""coordinator.with_coordinator: which failures it retries, how often, and how far apart
(FindCoordinator scripted, trio's clock jumping over the back-offs)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from raftlog.client import coordinator
from raftlog.client.connection import ConnectionClosed, RequestTimeout
from raftlog.client.coordinator import CoordinatorRetries, with_coordinator
from raftlog.errors import ErrorCode, KafkaError


class ScriptedLookups:
    """find_coordinator answers: each entry an exception to raise or a node id to name."""

    def __init__(self, *answers: Exception | int) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, cluster: Any, key: str, key_type: int) -> tuple[int, tuple[str, int]]:
        self.asked.append((key, key_type))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer, ("127.0.0.1", 9000 + answer)


class AddressBook:
    """The cluster's connect(): a connection is its address here."""

    async def connect(self, address: tuple[str, int]) -> Any:
        return address


async def _run(
    monkeypatch: pytest.MonkeyPatch,
    lookups: ScriptedLookups,
    retries: CoordinatorRetries = CoordinatorRetries(),
) -> tuple[Any, float]:
    monkeypatch.setattr(coordinator, "find_coordinator", lookups)
    started = trio.current_time()

    async def operation(node_id: int, connection: Any) -> Any:
        return node_id, connection

    result = await with_coordinator(AddressBook(), "g", 0, operation, retries)  # type: ignore[arg-type]
    return result, trio.current_time() - started


async def test_a_moved_or_loading_coordinator_is_found_again(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    lookups = ScriptedLookups(
        KafkaError(ErrorCode.coordinator_load_in_progress),
        KafkaError(ErrorCode.not_coordinator),
        ConnectionClosed("gone"),
        2,
    )
    result, waited_s = await _run(monkeypatch, lookups)
    assert result == (2, ("127.0.0.1", 9002))
    assert lookups.asked == [("g", 0)] * 4
    assert waited_s == pytest.approx(0.1 + 0.2 + 0.3)  # backoff_ms * n


async def test_other_errors_are_raised_at_once(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    lookups = ScriptedLookups(KafkaError(ErrorCode.group_authorization_failed), 2)
    with pytest.raises(KafkaError) as caught:
        await _run(monkeypatch, lookups)
    assert caught.value.code == ErrorCode.group_authorization_failed
    # A request timeout is not a transport error unless the caller says so.
    lookups = ScriptedLookups(RequestTimeout("slow"), 2)
    with pytest.raises(RequestTimeout):
        await _run(monkeypatch, lookups)
    assert len(lookups.asked) == 1


async def test_retries_are_bounded_and_the_back_off_capped(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    retries = CoordinatorRetries(
        retriable_codes=frozenset({ErrorCode.concurrent_transactions}),
        transport_errors=(RequestTimeout,),
        max_retries=4,
        backoff_ms=50,
        backoff_max_ms=100,
    )
    lookups = ScriptedLookups(RequestTimeout("slow"), KafkaError(ErrorCode.concurrent_transactions))
    started = trio.current_time()
    with pytest.raises(KafkaError) as caught:
        await _run(monkeypatch, lookups, retries)
    assert caught.value.code == ErrorCode.concurrent_transactions
    assert len(lookups.asked) == 5  # the first attempt and max_retries more
    assert trio.current_time() - started == pytest.approx((50 + 100 + 100 + 100) / 1000)
