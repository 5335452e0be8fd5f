"""Consumer-group coordinator: Kafka's classic group protocol, the consumer group protocol
(KIP-848) and committed offsets.

group.py is one group's pure state machine (group_members.py its member bookkeeping),
coordinator.py routes requests for the offsets partitions this broker leads and owns
committed offsets, txn_offsets.py the transactional offsets awaiting their transaction's
marker, offsets_format.py is the `__consumer_offsets` record format, coordinator_shell.py is
the trio driver. KIP-848: consumer_group.py (one group: epochs, reconciliation),
assignors.py, consumer_groups.py, consumer_coordinator.py, consumer_format.py. See
docs/groups.md.

Rules of this package: group.py and coordinator.py are sans-IO (requests and the time in,
replies and offsets-topic appends out); only coordinator_shell.py and node_service.py do I/O.
Offsets-topic keys and values are declared through raftlog.codec and checked when loaded.
"""

from raftlog.groups.coordinator import Append, Effects, GroupCoordinator
from raftlog.groups.coordinator_shell import GroupCoordinatorShell
from raftlog.groups.group import Group, GroupState
from raftlog.groups.hashing import java_string_hashcode, partition_for_group
from raftlog.groups.settings import OFFSETS_TOPIC, GroupConfig

__all__ = [
    "OFFSETS_TOPIC",
    "Append",
    "Effects",
    "Group",
    "GroupConfig",
    "GroupCoordinator",
    "GroupCoordinatorShell",
    "GroupState",
    "java_string_hashcode",
    "partition_for_group",
]
