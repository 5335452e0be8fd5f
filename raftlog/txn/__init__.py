"""Transaction coordinator (KIP-98, KIP-360, KIP-890 part 1) and `__transaction_state`.

log_format.py is the record format of `__transaction_state` (Kafka's own bytes), state.py one
transactional id's state machine (Kafka's TransactionMetadata and its transition table),
coordinator.py the coordinator of one `__transaction_state` partition (effects.py what it
asks of its driver), describe.py what DescribeTransactions and ListTransactions answer,
messages.py the requests and results, settings.py the limits (Kafka's names) and the
transactional id -> partition rule.

Rules of this package: everything here is sans-IO. The coordinator takes requests, completions
and `now_ms`, and returns Effects (replies, appends to its partition, marker writes); a driver
performs them, as groups/coordinator_shell.py does for the group coordinator. See
docs/formats.md for the records.
"""

from raftlog.txn.coordinator import TxnCoordinator
from raftlog.txn.effects import Append, Effects, WriteMarkers
from raftlog.txn.log_format import TRANSACTION_STATE_TOPIC, TransactionState
from raftlog.txn.settings import TxnConfig, partition_for_transactional_id
from raftlog.txn.state import IllegalTransitionError, TransactionMetadata

__all__ = [
    "TRANSACTION_STATE_TOPIC",
    "Append",
    "Effects",
    "IllegalTransitionError",
    "TransactionMetadata",
    "TransactionState",
    "TxnConfig",
    "TxnCoordinator",
    "WriteMarkers",
    "partition_for_transactional_id",
]
