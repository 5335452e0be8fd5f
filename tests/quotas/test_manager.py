"""QuotaManager: throttling, convergence of an obedient producer, expiry and bounded memory."""

from __future__ import annotations

import random

import pytest

from raftlog.config import NodeConfig
from raftlog.constants import MIB
from raftlog.errors import ErrorCode
from raftlog.quotas import (
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaConfig,
    QuotaEntity,
    QuotaLimits,
    QuotaManager,
)


def manager_with(table: dict, **limits: object) -> QuotaManager:
    return QuotaManager(QuotaConfig(table), QuotaLimits(**limits))  # type: ignore[arg-type]


def test_no_quota_means_no_state_and_no_throttle() -> None:
    manager = manager_with({QuotaEntity.client("other"): {CONSUMER_BYTE_RATE: 1}})
    for step in range(1000):
        assert manager.record_produce(step, "u", f"client-{step}", 10 * MIB) == 0
        assert manager.record_fetch(step, "u", f"client-{step}", 10 * MIB) == 0
        assert manager.record_request_time(step, "u", f"client-{step}", 1000.0) == 0
        assert manager.record_mutations(step, "u", f"client-{step}", 100).accepted
    assert manager.tracked_entities == 0
    assert manager.usage(1000) == []


def test_throttle_paces_the_retained_bytes_to_the_quota() -> None:
    manager = manager_with({QuotaEntity.client("p"): {PRODUCER_BYTE_RATE: 1000}})
    # 1000 B at t=0 is one second of quota: hold the client until t=1000.
    assert manager.record_produce(0, "u", "p", 1000) == 1000
    # 2000 B spanning 1 s: another second. Kafka's formula over the unpadded window.
    assert manager.record_produce(1000, "u", "p", 1000) == 1000
    assert manager.record_produce(2000, "u", "p", 500) == 500
    assert manager.record_produce(3000, "u", "p", 0) == 0
    [row] = manager.usage(3000)
    assert (row.quota_key, row.user, row.client_id) == (PRODUCER_BYTE_RATE, "", "p")
    # The reported rate keeps Kafka's padding: 2500 B over 10 padded seconds.
    assert row.rate == pytest.approx(250.0)
    assert row.throttle_time_total_ms == 2500
    assert row.entity == QuotaEntity.client("p")


def test_throttle_is_capped_by_max_throttle_time() -> None:
    manager = manager_with({QuotaEntity.client("p"): {PRODUCER_BYTE_RATE: 1}})
    assert manager.record_produce(0, "u", "p", 10 * MIB) == 11_000  # default cap: one span
    capped = manager_with(
        {QuotaEntity.client("p"): {PRODUCER_BYTE_RATE: 1}}, max_throttle_time_ms=250
    )
    assert capped.record_produce(0, "u", "p", 10 * MIB) == 250


def test_request_percentage_counts_thread_time() -> None:
    manager = manager_with({QuotaEntity.user("u"): {REQUEST_PERCENTAGE: 50}})
    # 500 ms of thread time is one second's worth of 50 % of a thread.
    assert manager.record_request_time(0, "u", "c", 500.0) == 1000
    assert manager.record_request_time(1000, "u", "c", 0.0) == 0
    [row] = manager.usage(1000)
    assert row.rate == pytest.approx(5.0)  # 50 %-seconds over the padded 10 s
    assert (row.user, row.client_id) == ("u", "")


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("interval_ms", [1, 16, 100])
def test_obedient_producer_converges_to_the_quota(seed: int, interval_ms: int) -> None:
    """A producer offering 4 MiB/s against 1 MiB/s that waits out every throttle."""
    rng = random.Random(seed)
    manager = manager_with({QuotaEntity.user_client("u", None): {PRODUCER_BYTE_RATE: MIB}})
    now_ms = rng.randrange(0, 1000)
    warmup_end_ms = now_ms + 30_000
    end_ms = warmup_end_ms + 120_000
    measured_bytes = 0
    while now_ms < end_ms:
        # Jittered batch sizes averaging 4 MiB/s at the offered pace.
        size_bytes = int(4 * MIB * interval_ms / 1000 * rng.uniform(0.5, 1.5))
        throttle_ms = manager.record_produce(now_ms, "u", "app", size_bytes)
        if now_ms >= warmup_end_ms:
            measured_bytes += size_bytes
        now_ms += max(interval_ms, throttle_ms)
    rate = measured_bytes / ((end_ms - warmup_end_ms) / 1000)
    assert rate == pytest.approx(MIB, rel=0.05), f"seed={seed} rate={rate / MIB:.3f} MiB/s"


def test_default_entities_give_each_client_its_own_bucket() -> None:
    manager = manager_with({QuotaEntity.client(None): {PRODUCER_BYTE_RATE: 1000}})
    assert manager.record_produce(0, "u", "a", 5_000) == 5_000
    # Another client id is not charged for a's bytes.
    assert manager.record_produce(0, "u", "b", 1_000) == 1_000
    assert manager.tracked_entities == 2
    # A user-level quota is shared by all of that user's clients.
    shared = manager_with({QuotaEntity.user("u"): {PRODUCER_BYTE_RATE: 1000}})
    assert shared.record_produce(0, "u", "a", 1_000) == 1_000
    assert shared.record_produce(0, "u", "b", 1_000) == 2_000
    assert shared.tracked_entities == 1


def test_quota_change_keeps_the_history() -> None:
    config = QuotaConfig({QuotaEntity.client("p"): {PRODUCER_BYTE_RATE: 1000}})
    manager = QuotaManager(config)
    assert manager.record_produce(0, "u", "p", 1_000) == 1_000
    assert manager.record_produce(1_000, "u", "p", 0) == 0
    config.apply_delta({QuotaEntity.client("p"): {PRODUCER_BYTE_RATE: 500}})
    # Same 1000 B over the same second, now owed at 500 B/s.
    assert manager.record_produce(1_000, "u", "p", 0) == 1_000
    config.apply_delta({QuotaEntity.client("p"): {PRODUCER_BYTE_RATE: None}})
    assert manager.record_produce(0, "u", "p", 10 * MIB) == 0


def test_idle_sensors_expire() -> None:
    manager = manager_with(
        {QuotaEntity.client(None): {PRODUCER_BYTE_RATE: 1000}}, sensor_idle_expiry_ms=60_000
    )
    manager.record_produce(0, "u", "a", 1)
    manager.record_produce(30_000, "u", "b", 1)
    assert manager.tracked_entities == 2
    assert manager.expire_idle(59_999) == 0
    assert manager.expire_idle(60_000) == 1
    assert [row.client_id for row in manager.usage(60_000)] == ["b"]
    manager.record_produce(95_000, "u", "c", 1)  # recording sweeps too
    assert [row.client_id for row in manager.usage(95_000)] == ["c"]
    assert manager.expired_sensors == 2


def test_tracked_entities_are_bounded() -> None:
    manager = manager_with(
        {QuotaEntity.client(None): {PRODUCER_BYTE_RATE: 1000}}, max_tracked_entities=100
    )
    for step in range(10_000):
        manager.record_produce(step, "u", f"client-{step}", 1)
        assert manager.tracked_entities <= 100
    assert manager.tracked_entities == 100
    assert manager.evicted_sensors == 9_900
    # The least recently used went first: the newest 100 remain.
    remaining = {row.client_id for row in manager.usage(10_000)}
    assert remaining == {f"client-{step}" for step in range(9_900, 10_000)}


def test_mutations_strict_mode_refuses_while_overdrawn() -> None:
    manager = manager_with({QuotaEntity.user(None): {CONTROLLER_MUTATION_RATE: 2}})
    # Burst = 2/s * 11 windows * 1 s = 22 credits; one request may overdraw them.
    first = manager.record_mutations(0, "u", "c", 30)
    assert first.accepted and first.error == ErrorCode.none
    assert first.throttle_time_ms == 4_000  # 8 credits owed at 2/s
    refused = manager.record_mutations(1_000, "u", "c", 1)
    assert not refused.accepted
    assert refused.error == ErrorCode.throttling_quota_exceeded
    assert refused.throttle_time_ms == 3_000
    # Refused requests cost nothing: once the debt is paid the next one passes.
    again = manager.record_mutations(4_000, "u", "c", 1)
    assert again.accepted and again.throttle_time_ms == 500


def test_mutations_permissive_mode_only_delays() -> None:
    manager = manager_with(
        {QuotaEntity.user(None): {CONTROLLER_MUTATION_RATE: 2}}, controller_mutation_strict=False
    )
    assert manager.record_mutations(0, "u", "c", 30).throttle_time_ms == 4_000
    late = manager.record_mutations(1_000, "u", "c", 2)
    assert late.accepted and late.throttle_time_ms == 4_000
    # A per-call override (request version decides strictness in Kafka) wins.
    assert not manager.record_mutations(1_000, "u", "c", 1, strict=True).accepted


def test_limits_from_node_config_and_checks() -> None:
    limits = QuotaLimits.from_node_config(
        NodeConfig(quota_window_num=5, quota_window_size_s=2), max_tracked_entities=7
    )
    assert (limits.span_ms, limits.throttle_cap_ms, limits.max_tracked_entities) == (
        10_000,
        10_000,
        7,
    )
    with pytest.raises(ValueError, match="max_tracked_entities"):
        QuotaLimits(max_tracked_entities=0)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("window_s", [2, 5, 10])
def test_greedy_producer_from_a_standing_start_gets_the_quota_at_every_scale(
    seed: int, window_s: int
) -> None:
    """No initial burst and no sawtooth when a sample expires: any stretch of a few seconds
    from the first byte on carries the quota, give or take one request."""
    rng = random.Random(seed)
    manager = manager_with({QuotaEntity.client("app"): {PRODUCER_BYTE_RATE: MIB}})
    now_ms = start_ms = rng.randrange(0, 1000)
    sent: list[tuple[int, int]] = []
    while now_ms < start_ms + 40_000:
        size_bytes = rng.randrange(16 * 1024, 256 * 1024)
        sent.append((now_ms, size_bytes))
        now_ms += max(1, manager.record_produce(now_ms, "u", "app", size_bytes))
    for window_start_ms in range(start_ms, start_ms + 40_000 - window_s * 1000, 1000):
        window_end_ms = window_start_ms + window_s * 1000
        total = sum(size for at_ms, size in sent if window_start_ms <= at_ms < window_end_ms)
        rate = total / window_s
        assert rate == pytest.approx(MIB, rel=0.15), (
            f"seed={seed} window {window_start_ms}..{window_end_ms} ms: {rate / MIB:.3f} MiB/s"
        )
