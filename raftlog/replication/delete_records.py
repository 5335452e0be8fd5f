"""DeleteRecords on the partition leader: move the log start offset up (KIP-107).

Records below the new log start are gone for every reader at once: a fetch below it is
answered OFFSET_OUT_OF_RANGE (consumers reset), ListOffsets earliest answers it, and whole
segments below it are deleted. The new log start is checkpointed before the answer, so a
restart never brings the records back; followers move theirs to it on their next fetch (the
leader's log start travels in every fetch answer, and a follower never moves past its own
high watermark).

What the answer promises is the leader's low watermark. Kafka waits until every replica's
log start has passed the requested offset; here a follower catches up on its next fetch,
within replica_fetch_wait_max_ms, and a leader change before that leaves the records
readable on the new leader until a DeleteRecords is sent again.
"""

from __future__ import annotations

import trio

from raftlog.errors import ErrorCode
from raftlog.net.kafka.backend import DeleteRecordsResult
from raftlog.replication.replicas import Replicas

# The checkpoint that makes the new log start durable is written by the flusher's next round;
# the answer waits at most this long for it (then REQUEST_TIMED_OUT: the start moved in
# memory, and a retry finds it moved and waits again).
CHECKPOINT_WAIT_S = 10.0
# DeleteRecords' "delete everything up to the high watermark".
TO_HIGH_WATERMARK = -1


async def delete_records(
    replicas: Replicas, topic: str, partition: int, offset: int
) -> DeleteRecordsResult:
    """Move the partition's log start to `offset` (TO_HIGH_WATERMARK: the high watermark) if
    this broker leads it; records below stay readable nowhere."""
    key = (topic, partition)
    hosted = replicas.partitions.get(key)
    leader = None if hosted is None else hosted.replica.leader
    if hosted is None or leader is None:
        return DeleteRecordsResult(replicas.not_leader_error(topic, partition))
    if hosted.log.offline:
        return DeleteRecordsResult(ErrorCode.kafka_storage_error)
    high_watermark = leader.high_watermark
    target = high_watermark if offset == TO_HIGH_WATERMARK else offset
    if not 0 <= target <= high_watermark:
        # Above the high watermark would delete records not yet committed (Kafka refuses it
        # the same way); -1 is the only negative offset the API has.
        return DeleteRecordsResult(
            ErrorCode.offset_out_of_range,
            error_message=f"offset {offset} is not in 0..{high_watermark} (the high watermark)",
        )
    # No await between the checks and the move: the leadership and the log are as checked.
    if target > hosted.log.log_start_offset:
        await hosted.wait_for_log_cut()
        if hosted.replica.leader is not leader or replicas.partitions.get(key) is not hosted:
            return DeleteRecordsResult(replicas.not_leader_error(topic, partition))
        if target > hosted.log.log_start_offset:
            hosted.log.advance_log_start(target)
            replicas.flusher.wake()
    if hosted.log.checkpoint_due:
        with trio.move_on_after(CHECKPOINT_WAIT_S):
            while hosted.log.checkpoint_due and not hosted.log.closed:
                replicas.flusher.wake()
                await replicas.flusher.wait_round()
        if hosted.log.checkpoint_due:
            return DeleteRecordsResult(
                ErrorCode.request_timed_out, error_message="the new log start is not durable yet"
            )
    return DeleteRecordsResult(low_watermark=hosted.log.log_start_offset)
