"""A damaged disk or a damaged fetch answer, on real segment files: what the log refuses,
what recovery cuts, what the scrubber finds."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlog.errors import CorruptRecordError
from raftlog.records import set_offset_and_epoch
from raftlog.storage import LogConfig, PartitionLog
from tests.storage.helpers import batch

SMALL = LogConfig(segment_bytes=2000, index_interval_bytes=200)


def leader_log(path: Path, batches: int = 6, epoch: int = 3) -> PartitionLog:
    lg = PartitionLog.open(path, SMALL, now_ms=0)
    for i in range(batches):
        lg.append_as_leader(batch(3, ts_ms=1000 + i), leader_epoch=epoch, now_ms=0)
    return lg


def test_follower_refuses_a_fetched_batch_with_a_flipped_byte_and_stores_nothing(
    tmp_path: Path,
) -> None:
    leader = leader_log(tmp_path / "l-0")
    follower = PartitionLog.open(tmp_path / "f-0", SMALL, now_ms=0)
    data = bytearray(leader.read(0, 10**6).read_bytes())
    data[-5] ^= 0x40  # a record byte of the last batch: covered by its CRC
    with pytest.raises(CorruptRecordError, match="CRC"):
        follower.append_as_follower(bytes(data), max_leader_epoch=3)
    assert follower.log_end_offset == 0 and follower.active_segment.size_bytes == 0


@pytest.mark.parametrize("epoch", [4, 1, -1, 2**31 - 1])
def test_follower_refuses_a_leader_epoch_outside_the_crc_that_cannot_be_right(
    tmp_path: Path, epoch: int
) -> None:
    leader = leader_log(tmp_path / "l-0")
    follower = PartitionLog.open(tmp_path / "f-0", SMALL, now_ms=0)
    follower.append_as_follower(leader.read(0, 10**6, max_offset=6).read_bytes())
    assert follower.latest_epoch() == 3
    data = bytearray(leader.read(6, 10**6).read_bytes())
    # partitionLeaderEpoch is not covered by the CRC: a flipped bit there passes it. Above
    # the epoch of the leader we fetch from, or below the epoch we already hold, it is damage.
    set_offset_and_epoch(data, 0, 6, epoch)
    with pytest.raises(CorruptRecordError, match="leader epoch"):
        follower.append_as_follower(bytes(data), max_leader_epoch=3)
    assert follower.log_end_offset == 6
    follower.append_as_follower(leader.read(6, 10**6).read_bytes(), max_leader_epoch=3)
    assert follower.log_end_offset == leader.log_end_offset
