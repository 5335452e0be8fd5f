"""Replication throttles, sans-IO (raftlog/replication/core/throttle.py): Kafka's throttled
replica lists, which replicas each side throttles, and the byte budget a throttled read may
spend now. Time is an argument: every case here runs on a clock the test moves."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlog.replication.core.throttle import (
    BLOCKED_RECHECK_MS,
    FOLLOWER_THROTTLED_RATE,
    FOLLOWER_THROTTLED_REPLICAS,
    LEADER_THROTTLED_RATE,
    LEADER_THROTTLED_REPLICAS,
    THROTTLE_BURST_S,
    UNTHROTTLED_RATE,
    ByteRateLimit,
    ThrottledReplicas,
    ThrottlePolicy,
    ThrottleState,
    format_throttled_replicas,
    parse_throttled_replicas,
)

KIB = 1024


# ---------------------------------------------------------------- the replica lists
def test_kafkas_list_format() -> None:
    assert parse_throttled_replicas("*") == ThrottledReplicas(every=True)
    assert parse_throttled_replicas(" * ").covers(7, 9)
    listed = parse_throttled_replicas("0:1, 0:2,1:3,")
    assert listed.replicas == {(0, 1), (0, 2), (1, 3)}
    assert listed.covers(0, 2) and not listed.covers(1, 1)
    assert listed.partitions_of(2) == {0} and listed.partitions_of(3) == {1}
    assert listed.partitions_of(4) == frozenset()
    assert parse_throttled_replicas("") == ThrottledReplicas()
    assert format_throttled_replicas([(1, 3), (0, 2), (0, 1), (0, 2)]) == "0:1,0:2,1:3"


@pytest.mark.parametrize(
    "text", ["*,0:1", "0", "0:", ":1", "a:1", "0:1:2", "-1:2", "0:-2", "0;1", "99999999999:1"]
)
def test_malformed_lists_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_throttled_replicas(text)


@given(st.sets(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1)), max_size=20))
def test_lists_round_trip(pairs: set[tuple[int, int]]) -> None:
    assert parse_throttled_replicas(format_throttled_replicas(pairs)).replicas == pairs


# ---------------------------------------------------------------- which replicas
def configs(**values: dict[str, str]) -> dict[tuple[str, str], dict[str, str]]:
    """configs(topic_t={...}, broker_1={...}, cluster={...}) as the image holds them."""
    out = {}
    for name, keys in values.items():
        kind, _, resource = name.partition("_")
        out[(kind, resource)] = keys
    return out


def test_only_listed_replicas_outside_the_isr_are_throttled() -> None:
    view = configs(
        topic_t={LEADER_THROTTLED_REPLICAS: "0:1,1:2", FOLLOWER_THROTTLED_REPLICAS: "0:3"},
        topic_all={LEADER_THROTTLED_REPLICAS: "*"},
        cluster={LEADER_THROTTLED_RATE: "1000", FOLLOWER_THROTTLED_RATE: "2000"},
    )
    on_1 = ThrottlePolicy.from_configs(view, 1)
    assert on_1.leader_rate_bytes_per_s == 1000 and on_1.follower_rate_bytes_per_s == 2000
    # Broker 1 leads t-0 (listed with its id): it throttles what a follower outside the ISR
    # fetches, never an ISR member.
    assert on_1.leader_throttles("t", 0, follower_id=3, isr=frozenset({1, 2}))
    assert not on_1.leader_throttles("t", 0, follower_id=2, isr=frozenset({1, 2}))
    assert not on_1.leader_throttles("t", 1, follower_id=3, isr=frozenset({1}))  # 1:2, not 1:1
    assert not on_1.leader_throttles("other", 0, follower_id=3, isr=frozenset({1}))
    assert on_1.leader_throttles("all", 5, follower_id=3, isr=frozenset({1}))
    assert not on_1.follower_throttles("t", 0, replica_id=1, isr=frozenset({2}))
    on_3 = ThrottlePolicy.from_configs(view, 3)
    assert on_3.follower_throttles("t", 0, replica_id=3, isr=frozenset({1, 2}))
    assert not on_3.follower_throttles("t", 0, replica_id=3, isr=frozenset({1, 3}))


def test_rates_come_from_the_broker_else_the_cluster_default_else_none() -> None:
    view = configs(
        broker_1={LEADER_THROTTLED_RATE: "500"},
        cluster={LEADER_THROTTLED_RATE: "800", FOLLOWER_THROTTLED_RATE: str(UNTHROTTLED_RATE)},
        topic_t={LEADER_THROTTLED_REPLICAS: "*", FOLLOWER_THROTTLED_REPLICAS: "*"},
    )
    assert ThrottlePolicy.from_configs(view, 1).leader_rate_bytes_per_s == 500
    assert ThrottlePolicy.from_configs(view, 2).leader_rate_bytes_per_s == 800
    # Kafka's default (Long.MAX_VALUE) is no throttle at all, as is no value.
    assert ThrottlePolicy.from_configs(view, 2).follower_rate_bytes_per_s is None
    unthrottled = ThrottlePolicy.from_configs(configs(topic_t={LEADER_THROTTLED_REPLICAS: "*"}), 1)
    assert not unthrottled.leader_throttles("t", 0, follower_id=2, isr=frozenset({1}))
    # A listed replica without a rate, or a rate without a listed replica: nothing throttled.
    no_list = ThrottlePolicy.from_configs(configs(cluster={LEADER_THROTTLED_RATE: "5"}), 1)
    assert not no_list.leader_throttles("t", 0, follower_id=2, isr=frozenset({1}))


def test_state_rereads_only_a_changed_configs_mapping() -> None:
    state = ThrottleState(broker_id=1)
    view = configs(
        cluster={LEADER_THROTTLED_RATE: "1000"}, topic_t={LEADER_THROTTLED_REPLICAS: "*"}
    )
    policy = state.update(view, now_ms=0)
    assert state.update(view, now_ms=5) is policy
    limit = state.leader
    assert limit is not None and limit.rate_bytes_per_s == 1000
    limit.record(1000, now_ms=5)
    changed = configs(
        cluster={LEADER_THROTTLED_RATE: "4000"}, topic_t={LEADER_THROTTLED_REPLICAS: "*"}
    )
    state.update(changed, now_ms=5)
    assert state.leader is limit and limit.rate_bytes_per_s == 4000  # spent budget kept
    assert limit.allowance_bytes(now_ms=5) == 0
    state.update(configs(), now_ms=6)
    assert state.leader is None and state.policy == ThrottlePolicy()


# ---------------------------------------------------------------- the byte budget
def test_a_budget_starts_with_one_burst_then_keeps_to_the_rate() -> None:
    rate = 512 * KIB
    limit = ByteRateLimit(rate, now_ms=0)
    assert limit.allowance_bytes(now_ms=0) == rate * THROTTLE_BURST_S
    limit.record(rate, now_ms=0)
    assert limit.allowance_bytes(now_ms=0) == 0
    assert limit.wait_ms(now_ms=0) == 1  # one byte of credit comes back within a ms
    assert limit.allowance_bytes(now_ms=500) == rate // 2
    # A read may overdraw by one batch; the debt is paid back before anything moves again.
    limit.record(rate, now_ms=500)
    assert limit.allowance_bytes(now_ms=500) == 0
    assert 500 <= limit.wait_ms(now_ms=500) <= 501
    assert limit.allowance_bytes(now_ms=1000) == 0
    assert limit.allowance_bytes(now_ms=1002) > 0
    # Idle credit never exceeds one burst.
    assert limit.allowance_bytes(now_ms=60_000) == rate * THROTTLE_BURST_S


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 64 * KIB)), min_size=1, max_size=200))
def test_bytes_moved_never_exceed_burst_plus_rate_plus_one_batch(
    steps: list[tuple[int, int]],
) -> None:
    """A reader that takes what it is allowed (one batch more at most) moves, over any run,
    no more than one burst, the rate times the time elapsed, and one batch."""
    rate = 100 * KIB
    limit = ByteRateLimit(rate, now_ms=0)
    now_ms = 0
    moved = 0
    largest_batch = 0
    for advance_ms, batch_bytes in steps:
        now_ms += advance_ms
        allowance = limit.allowance_bytes(now_ms)
        if allowance == 0:
            assert limit.wait_ms(now_ms) > 0
            continue
        taken = max(batch_bytes, min(allowance, 4 * batch_bytes))
        largest_batch = max(largest_batch, batch_bytes)
        limit.record(taken, now_ms)
        moved += taken
        assert moved <= rate * THROTTLE_BURST_S + rate * now_ms / 1000 + 4 * largest_batch


def test_a_rate_of_zero_moves_nothing_and_a_rate_change_lifts_it() -> None:
    limit = ByteRateLimit(0, now_ms=0)
    assert limit.allowance_bytes(now_ms=10_000) == 0
    assert limit.wait_ms(now_ms=10_000) == BLOCKED_RECHECK_MS
    limit.set_rate(1000, now_ms=10_000)
    assert limit.allowance_bytes(now_ms=10_000) == 1000
    with pytest.raises(ValueError):
        limit.set_rate(-1, now_ms=0)
    with pytest.raises(ValueError):
        limit.record(-1, now_ms=0)


def test_a_list_too_long_to_store_becomes_every_replica() -> None:
    from raftlog.config_keys import MAX_THROTTLED_REPLICAS
    from raftlog.replication.core.throttle import format_throttled_replicas

    assert format_throttled_replicas([(1, 2), (0, 1), (1, 2)]) == "0:1,1:2"
    many = [(p, 1) for p in range(MAX_THROTTLED_REPLICAS + 1)]
    assert format_throttled_replicas(many) == "*"
