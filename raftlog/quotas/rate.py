"""Windowed rates and token buckets, measured the way Kafka's metrics library measures them.

SampledRate mirrors Kafka's `Rate` over a `WindowedSum`: `window_num` samples of
`window_size_ms` each. A sample starts at the first record after the previous one filled
up (windows are not aligned to the clock), samples older than the whole span are reset, and
the rate divides the retained sum by the elapsed time since the oldest sample — including the
current, partial window. While fewer than `window_num - 1` full windows have elapsed the
divisor is padded up to that many, so a fresh client cannot look infinitely fast.

TokenBucket is KIP-599's controller-mutation meter: credits refill at `rate_per_s` up to a
burst of `rate_per_s * window_num * window_size_s`; a record spends credits and may go below
zero once, which is what the throttle time pays back.

Every call takes `now_ms`; nothing here reads a clock.
"""

from __future__ import annotations

from raftlog.constants import MS_PER_S


class SampledRate:
    """Kafka's Rate(WindowedSum): events per second over the retained sample windows."""

    __slots__ = ("_current", "_sample_start_ms", "_sample_value", "window_num", "window_size_ms")

    def __init__(self, window_num: int, window_size_ms: int) -> None:
        if window_num < 2:
            raise ValueError(f"window_num must be at least 2, got {window_num}")
        if window_size_ms < 1:
            raise ValueError(f"window_size_ms must be at least 1, got {window_size_ms}")
        self.window_num = window_num
        self.window_size_ms = window_size_ms
        # Parallel lists instead of sample objects: one of these exists per throttled entity,
        # and the lists only grow to window_num entries.
        self._sample_start_ms: list[int] = []
        self._sample_value: list[float] = []
        self._current = 0

    @property
    def span_ms(self) -> int:
        """The longest stretch of history a rate remembers."""
        return self.window_num * self.window_size_ms

    def record(self, value: float, now_ms: int) -> None:
        if not self._sample_start_ms:
            self._sample_start_ms.append(now_ms)
            self._sample_value.append(0.0)
            self._current = 0
        elif now_ms - self._sample_start_ms[self._current] >= self.window_size_ms:
            self._advance(now_ms)
        self._sample_value[self._current] += value

    def _advance(self, now_ms: int) -> None:
        self._current = (self._current + 1) % self.window_num
        if self._current >= len(self._sample_start_ms):
            self._sample_start_ms.append(now_ms)
            self._sample_value.append(0.0)
        else:
            self._sample_start_ms[self._current] = now_ms
            self._sample_value[self._current] = 0.0

    def _purge(self, now_ms: int) -> None:
        # A sample that started a whole span ago holds nothing the rate may still count.
        expire_age_ms = self.span_ms
        for index, start_ms in enumerate(self._sample_start_ms):
            if now_ms - start_ms >= expire_age_ms:
                self._sample_start_ms[index] = now_ms
                self._sample_value[index] = 0.0

    def window_ms(self, now_ms: int) -> int:
        """The divisor of the rate: elapsed time since the oldest sample, padded, at least 1."""
        self._purge(now_ms)
        oldest_ms = min(self._sample_start_ms) if self._sample_start_ms else now_ms
        elapsed_ms = now_ms - oldest_ms
        full_windows = elapsed_ms // self.window_size_ms
        min_full_windows = self.window_num - 1
        if full_windows < min_full_windows:
            elapsed_ms += (min_full_windows - full_windows) * self.window_size_ms
        return max(elapsed_ms, 1)

    def elapsed_ms(self, now_ms: int) -> int:
        """Time the retained samples really span: now minus the oldest start, unpadded."""
        self._purge(now_ms)
        oldest_ms = min(self._sample_start_ms) if self._sample_start_ms else now_ms
        return max(now_ms - oldest_ms, 0)

    def total(self, now_ms: int) -> float:
        self._purge(now_ms)
        return sum(self._sample_value)

    def measure(self, now_ms: int) -> float:
        """Events per second at now_ms."""
        window_ms = self.window_ms(now_ms)
        return sum(self._sample_value) / (window_ms / MS_PER_S)


def throttle_time_ms(rate: float, quota: float, window_ms: int, max_throttle_time_ms: int) -> int:
    """How long to hold a client so its rate over the stretched window falls to the quota.

    Kafka's QuotaUtils.throttleTime: (rate - quota) / quota * window. Delaying that long means
    the bytes already counted, spread over window + delay, come out at exactly the quota.
    """
    if rate <= quota:
        return 0
    delay_ms = (rate - quota) / quota * window_ms
    return int(min(round(delay_ms), max_throttle_time_ms))


def pacing_throttle_ms(
    total: float, quota_per_s: float, elapsed_ms: int, max_throttle_time_ms: int
) -> int:
    """How long to hold a client so the retained total, spread over the time it really spans
    plus the delay, comes out at the quota: total / quota - elapsed.

    This is Kafka's formula, (rate - quota) / quota * window, over the unpadded window. The
    padding (see window_ms) would credit a fresh client with window_num - 1 windows of quota
    as an instant burst, and hand it out again each time the sample holding the burst expires,
    so a client's throughput over any few seconds swings between a fraction and several times
    its quota. Unpadded, a client sending as fast as it can gets the quota at every scale
    above one request.
    """
    delay_ms = total / quota_per_s * MS_PER_S - elapsed_ms
    if delay_ms <= 0:
        return 0
    return int(min(round(delay_ms), max_throttle_time_ms))


class TokenBucket:
    """KIP-599 credits: refill at rate_per_s up to burst; a record may overdraw once."""

    __slots__ = ("_last_ms", "burst", "rate_per_s", "tokens")

    def __init__(self, rate_per_s: float, burst: float, now_ms: int) -> None:
        if rate_per_s <= 0 or burst <= 0:
            raise ValueError(f"rate_per_s and burst must be positive, got {rate_per_s}, {burst}")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.tokens = burst
        self._last_ms = now_ms

    def _refill(self, now_ms: int) -> None:
        elapsed_ms = max(0, now_ms - self._last_ms)
        self.tokens = min(self.burst, self.tokens + self.rate_per_s * elapsed_ms / MS_PER_S)
        self._last_ms = max(self._last_ms, now_ms)

    def set_rate(self, rate_per_s: float, burst: float, now_ms: int) -> None:
        """A quota changed: refill at the old rate up to now, then continue at the new one."""
        self._refill(now_ms)
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.tokens = min(self.tokens, burst)

    def exhausted(self, now_ms: int) -> bool:
        self._refill(now_ms)
        return self.tokens < 0

    def record(self, value: float, now_ms: int) -> None:
        self._refill(now_ms)
        self.tokens -= value

    def throttle_time_ms(self, now_ms: int, max_throttle_time_ms: int) -> int:
        """Time until the bucket is back at zero credits (0 if it is not overdrawn)."""
        self._refill(now_ms)
        if self.tokens >= 0:
            return 0
        return int(min(round(-self.tokens / self.rate_per_s * MS_PER_S), max_throttle_time_ms))
