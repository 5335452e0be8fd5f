"""Window math of SampledRate, the throttle formula and KIP-599 token buckets, exact numbers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlog.quotas import SampledRate, TokenBucket, pacing_throttle_ms, throttle_time_ms


def rate_11x1s() -> SampledRate:
    return SampledRate(window_num=11, window_size_ms=1000)


def test_fresh_rate_is_padded_to_window_num_minus_one_windows() -> None:
    rate = rate_11x1s()
    rate.record(1000, now_ms=0)
    assert rate.window_ms(0) == 10_000  # 0 ms elapsed + 10 padded windows
    assert rate.measure(0) == pytest.approx(100.0)


def test_partial_current_window_counts_as_elapsed_time() -> None:
    rate = rate_11x1s()
    rate.record(1000, now_ms=0)
    rate.record(1000, now_ms=500)
    assert rate.window_ms(500) == 10_500  # 500 ms elapsed + 10 padded windows
    assert rate.measure(500) == pytest.approx(2000 / 10.5)


def test_padding_shrinks_as_full_windows_elapse() -> None:
    rate = rate_11x1s()
    rate.record(1000, now_ms=0)
    rate.record(1000, now_ms=1000)  # starts a second sample
    assert rate.window_ms(1000) == 10_000  # 1 full window + 9 padded
    assert rate.measure(1000) == pytest.approx(200.0)
    assert rate.window_ms(10_999) == 10_999  # 10 full windows: no padding
    assert rate.measure(10_999) == pytest.approx(2000 / 10.999)


def test_samples_expire_after_the_whole_span() -> None:
    rate = rate_11x1s()
    rate.record(1000, now_ms=0)
    rate.record(500, now_ms=1000)
    # At 11 000 ms the first sample is a whole span old: it is reset, its bytes forgotten.
    assert rate.total(11_000) == 500
    assert rate.window_ms(11_000) == 10_000  # oldest is now the sample that began at 1000
    assert rate.measure(11_000) == pytest.approx(50.0)
    assert rate.total(12_000) == 0
    assert rate.measure(12_000) == 0.0


def test_ring_reuses_samples_beyond_window_num() -> None:
    rate = SampledRate(window_num=3, window_size_ms=100)
    for step in range(10):
        rate.record(1, now_ms=step * 100)
    # Only the last three samples (700, 800, 900) survive.
    assert rate.total(900) == 3
    assert rate.window_ms(950) == 250
    assert rate.measure(950) == pytest.approx(3 / 0.25)


def test_minimum_window_is_one_ms() -> None:
    rate = SampledRate(window_num=2, window_size_ms=1)
    rate.record(5, now_ms=7)
    assert rate.window_ms(7) == 1


def test_throttle_formula() -> None:
    # 2000 B/s observed over 10 s against 1000 B/s: 10 s more brings it to exactly 1000 B/s.
    assert throttle_time_ms(2000, 1000, 10_000, max_throttle_time_ms=60_000) == 10_000
    assert throttle_time_ms(1250, 1000, 10_000, max_throttle_time_ms=60_000) == 2_500
    assert throttle_time_ms(1000, 1000, 10_000, max_throttle_time_ms=60_000) == 0
    assert throttle_time_ms(900, 1000, 10_000, max_throttle_time_ms=60_000) == 0
    assert throttle_time_ms(10**9, 1000, 10_000, max_throttle_time_ms=11_000) == 11_000


@given(
    total=st.integers(1, 10**9),
    quota=st.integers(1, 10**7),
    window_ms=st.integers(1, 100_000),
)
def test_obeying_the_throttle_brings_the_rate_to_the_quota(
    total: int, quota: int, window_ms: int
) -> None:
    rate = total / (window_ms / 1000)
    delay_ms = throttle_time_ms(rate, quota, window_ms, max_throttle_time_ms=2**62)
    if rate <= quota:
        assert delay_ms == 0
    else:
        # Waiting one ms less leaves the rate at or above the quota, one ms more at or below:
        # rounding the delay to a whole ms is the only error.
        assert total / ((window_ms + max(delay_ms - 1, 0)) / 1000) >= quota
        assert total / ((window_ms + delay_ms + 1) / 1000) <= quota


@given(
    total=st.integers(0, 10**9),
    quota=st.integers(1, 10**7),
    elapsed_ms=st.integers(0, 100_000),
)
def test_pacing_holds_the_client_until_its_bytes_span_bytes_over_quota(
    total: int, quota: int, elapsed_ms: int
) -> None:
    delay_ms = pacing_throttle_ms(total, quota, elapsed_ms, max_throttle_time_ms=2**62)
    # Released at the moment the bytes, spread over elapsed + delay, average out at exactly
    # the quota (to the rounded ms); no padding, so a fresh client (elapsed 0) is held for
    # all of total / quota.
    exact_ms = total / quota * 1000 - elapsed_ms
    if exact_ms <= 0:
        assert delay_ms == 0
    else:
        assert abs(delay_ms - exact_ms) <= 0.5 + 1e-9


def test_pacing_is_capped() -> None:
    assert pacing_throttle_ms(10**9, 1, 0, max_throttle_time_ms=11_000) == 11_000
    assert pacing_throttle_ms(1000, 1000, 0, max_throttle_time_ms=11_000) == 1000
    assert pacing_throttle_ms(1000, 1000, 1000, max_throttle_time_ms=11_000) == 0


def test_token_bucket_overdraw_and_refill() -> None:
    bucket = TokenBucket(rate_per_s=2, burst=22, now_ms=0)
    assert not bucket.exhausted(0)
    bucket.record(30, now_ms=0)  # 22 - 30 = -8 credits
    assert bucket.exhausted(0)
    assert bucket.throttle_time_ms(0, max_throttle_time_ms=60_000) == 4_000
    assert bucket.throttle_time_ms(0, max_throttle_time_ms=500) == 500
    assert bucket.throttle_time_ms(1_000, max_throttle_time_ms=60_000) == 3_000
    assert not bucket.exhausted(4_000)
    assert bucket.tokens == pytest.approx(0.0)
    # A stale now_ms (an earlier timestamp) neither refills nor takes credits back.
    assert not bucket.exhausted(3_999)
    assert bucket.tokens == pytest.approx(0.0)
    bucket.record(0, now_ms=100_000)
    assert bucket.tokens == 22  # refills up to the burst, not beyond


def test_token_bucket_rate_change_keeps_credits() -> None:
    bucket = TokenBucket(rate_per_s=2, burst=22, now_ms=0)
    bucket.record(22, now_ms=0)
    bucket.set_rate(10, 110, now_ms=1_000)  # 2 credits earned at the old rate
    assert bucket.tokens == pytest.approx(2)
    bucket.record(0, now_ms=2_000)
    assert bucket.tokens == pytest.approx(12)


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="window_num"):
        SampledRate(1, 1000)
    with pytest.raises(ValueError, match="window_size_ms"):
        SampledRate(2, 0)
    with pytest.raises(ValueError, match="positive"):
        TokenBucket(0, 1, 0)
