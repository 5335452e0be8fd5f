"""BrokerQuotas: fed from the metadata image, robust to values the broker cannot enforce,
the per-fetch cap, mutation outcomes and the msgpack-able "quotas.usage" rows."""

from __future__ import annotations

from dataclasses import fields
from types import SimpleNamespace

import msgpack

from raftlog.constants import MIB
from raftlog.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, QuotaEntity, QuotaLimits
from raftlog.quotas.broker_hook import (
    MIN_FETCH_QUOTA_MAX_BYTES,
    SMALLEST_QUOTA,
    BrokerQuotas,
    UsageRowWire,
)


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 0

    def __call__(self) -> int:
        return self.now_ms


def hook_with(quotas: dict) -> tuple[BrokerQuotas, FakeClock]:
    clock = FakeClock()
    hook = BrokerQuotas(QuotaLimits(), clock)
    hook.on_metadata(SimpleNamespace(client_quotas=quotas), None)  # type: ignore[arg-type]
    return hook, clock


def test_image_quotas_in_controller_order_are_enforced() -> None:
    # The controller stores components sorted by type name (client-id before user).
    entity = (("client-id", "app"), ("user", "ANONYMOUS"))
    hook, _ = hook_with({entity: {PRODUCER_BYTE_RATE: 1000.0}})
    assert hook.config.get(QuotaEntity.user_client("ANONYMOUS", "app")) == {
        PRODUCER_BYTE_RATE: 1000.0
    }
    assert hook.record_produce("app", "ANONYMOUS", 20_000) > 0
    assert hook.record_produce("other", "ANONYMOUS", 20_000) == 0


def test_same_image_mapping_is_not_reloaded_and_a_new_one_replaces() -> None:
    quotas = {(("client-id", "a"),): {PRODUCER_BYTE_RATE: 10.0}}
    hook, _ = hook_with(quotas)
    version = hook.config.version
    hook.on_metadata(SimpleNamespace(client_quotas=quotas), None)  # type: ignore[arg-type]
    assert hook.config.version == version
    hook.on_metadata(SimpleNamespace(client_quotas={}), None)  # type: ignore[arg-type]
    assert len(hook.config) == 0


def test_values_the_broker_cannot_hold_cost_a_log_line_not_the_listener(caplog) -> None:
    hook, _ = hook_with(
        {
            (("client-id", "zero"),): {PRODUCER_BYTE_RATE: 0.0},
            (("client-id", "frac"),): {PRODUCER_BYTE_RATE: 1.5, CONSUMER_BYTE_RATE: 100.0},
            (("group", "x"),): {PRODUCER_BYTE_RATE: 100.0},
            (("client-id", "gone"),): {},
        }
    )
    assert hook.config.get(QuotaEntity.client("zero")) == {PRODUCER_BYTE_RATE: SMALLEST_QUOTA}
    assert hook.config.get(QuotaEntity.client("frac")) == {CONSUMER_BYTE_RATE: 100.0}
    assert len(hook.config) == 2
    assert "ignoring" in caplog.text


def test_fetch_cap_is_one_window_of_the_consumer_quota() -> None:
    hook, _ = hook_with(
        {
            (("client-id", "c"),): {CONSUMER_BYTE_RATE: float(MIB)},
            (("client-id", "tiny"),): {CONSUMER_BYTE_RATE: 10.0},
        }
    )
    assert hook.fetch_max_bytes("c", "ANONYMOUS") == MIB
    assert hook.fetch_max_bytes("tiny", "ANONYMOUS") == MIN_FETCH_QUOTA_MAX_BYTES
    assert hook.fetch_max_bytes("free", "ANONYMOUS") is None


def test_mutations_overdraw_once_then_refuse_when_strict() -> None:
    hook, clock = hook_with({(("client-id", "adm"),): {"controller_mutation_rate": 1.0}})
    accepted, throttle_ms = hook.record_mutations("adm", "ANONYMOUS", 20, True)
    assert accepted and throttle_ms == 9_000  # burst 11 credits, 9 in debt at 1/s
    assert hook.record_mutations("adm", "ANONYMOUS", 1, True) == (False, 9_000)
    assert hook.record_mutations("adm", "ANONYMOUS", 1, False)[0]  # permissive: delayed only
    clock.now_ms = 20_000
    assert hook.record_mutations("adm", "ANONYMOUS", 1, True) == (True, 0)


async def test_usage_rows_survive_msgpack() -> None:
    hook, clock = hook_with({(("user", None),): {PRODUCER_BYTE_RATE: 1000.0}})
    hook.record_produce("app", "ANONYMOUS", 50_000)
    clock.now_ms = 1000
    rows = msgpack.unpackb(msgpack.packb(await hook.usage_rows(None)))
    assert len(rows) == 1
    row = dict(zip([f.name for f in fields(UsageRowWire)], rows[0], strict=True))
    assert row["quota_key"] == PRODUCER_BYTE_RATE
    assert (row["user"], row["client_id"]) == ("ANONYMOUS", "")
    assert row["entity"] == [["user", None]]
    assert row["quota"] == 1000.0
    assert row["rate"] > 1000.0
    assert row["throttle_time_total_ms"] > 0
