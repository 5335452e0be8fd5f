"""TxnConfig bounds and Kafka's transactional id -> `__transaction_state` partition rule."""

from __future__ import annotations

import pytest

from raftlog.errors import ErrorCode
from raftlog.txn import TxnConfig, partition_for_transactional_id
from raftlog.txn.messages import TxnApi, for_version


def test_partition_is_kafkas():
    # Java: "hello".hashCode() == 99162322; abs(...) % 50 == 22.
    assert partition_for_transactional_id("hello", 50) == 22
    assert TxnConfig().partition_for("hello") == 22
    # Integer.MIN_VALUE hashes to partition 0 (Kafka's Utils.abs): "polygenelubricants".
    assert partition_for_transactional_id("polygenelubricants", 7) == 0
    with pytest.raises(ValueError):
        partition_for_transactional_id("x", 0)


@pytest.mark.parametrize(
    "overrides",
    [
        {"transaction_state_log_num_partitions": 0},
        {"transaction_max_timeout_ms": 0},
        {"transaction_max_timeout_ms": 2**31},
        {"max_partitions_per_transaction": 0},
        {"transaction_marker_retry_backoff_ms": -1},
    ],
)
def test_config_bounds(overrides):
    with pytest.raises(ValueError):
        TxnConfig(**overrides)


@pytest.mark.parametrize(
    ("api", "fenced_since"),
    [
        (TxnApi.INIT_PRODUCER_ID, 4),
        (TxnApi.ADD_PARTITIONS_TO_TXN, 2),
        (TxnApi.ADD_OFFSETS_TO_TXN, 2),
        (TxnApi.END_TXN, 2),
    ],
)
def test_producer_fenced_per_version(api, fenced_since):
    fenced = ErrorCode.producer_fenced
    assert for_version(fenced, api, fenced_since) is fenced
    assert for_version(fenced, api, fenced_since - 1) is ErrorCode.invalid_producer_epoch
    assert for_version(ErrorCode.none, api, 0) is ErrorCode.none
