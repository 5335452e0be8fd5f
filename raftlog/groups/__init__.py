"""Consumer-group coordinator: Kafka's classic group protocol and committed offsets.

group.py is one group's pure state machine (group_members.py its member bookkeeping),
coordinator.py routes requests for the offsets partitions this broker leads and owns
committed offsets, offsets_format.py is the `__consumer_offsets` record format,
coordinator_shell.py is the trio driver. See docs/groups.md.
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
