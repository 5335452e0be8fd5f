"""Property test: arbitrary well-formed messages never crash the core or break its rules."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.metadata.raft.core import RaftCore
from raftlog.metadata.raft.messages import Entry, Message, VoteResponse
from raftlog.metadata.raft.roles import Leader
from raftlog.metadata.raft.types import ProtocolViolation, QuorumState, RaftConfig, Snapshot
from tests.metadata.test_raft_messages import message_strategy

CONFIG = RaftConfig(
    election_timeout_ms=100,
    fetch_timeout_ms=300,
    election_backoff_max_ms=100,
    fetch_max_wait_ms=50,
    max_fetch_entries=10,
)

# Small numbers, so that epochs, offsets and node ids collide with the core's own.
messages = message_strategy(st.integers(min_value=0, max_value=6))
steps = st.lists(
    st.one_of(
        st.tuples(st.just("receive"), st.integers(1, 4), messages),
        st.tuples(st.just("tick"), st.integers(0, 500)),
        st.tuples(st.just("flush"), st.integers(0, 20)),
        st.tuples(st.just("propose"), st.integers(1, 3)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.integers(0, 3), st.booleans(), st.booleans(), steps)
def test_random_inputs_keep_the_core_consistent(
    node_id: int, epoch: int, lead_first: bool, with_snapshot: bool, plan: list
) -> None:
    log = [Entry(0, 1, b"a"), Entry(1, 1, b"b"), Entry(2, 2, b"c")]
    snapshot = Snapshot(1, 1, b"state") if with_snapshot else None
    core = RaftCore(
        node_id=node_id,
        voters=frozenset({1, 2, 3}),
        config=CONFIG,
        persisted=QuorumState(epoch + 2, None, None),
        entries=log,
        snapshot=snapshot,
        rng=random.Random(node_id),
    )
    now_ms = 0
    if lead_first and core.is_voter:
        # Start from leadership so that random fetches hit the leader's code paths.
        core.tick(now_ms=core.next_deadline_ms())
        now_ms = core.next_deadline_ms() - 1
        others = [v for v in (1, 2, 3) if v != node_id]
        for voter in others:
            core.receive(
                now_ms=now_ms, from_id=voter, message=VoteResponse(True, core.epoch, None, True)
            )
        for voter in others:
            core.receive(
                now_ms=now_ms, from_id=voter, message=VoteResponse(False, core.epoch, None, True)
            )
        assert isinstance(core.role, Leader)
    persisted_epoch = core.epoch
    applied = 0
    for step in plan:
        if step[0] == "receive":
            message: Message = step[2]
            try:
                core.receive(now_ms=now_ms, from_id=step[1], message=message)
            except ProtocolViolation:
                pass
        elif step[0] == "tick":
            now_ms += step[1]
            core.tick(now_ms=now_ms)
        elif step[0] == "flush":
            core.flushed(offset=step[1])
        elif isinstance(core.role, Leader):
            core.propose(now_ms=now_ms, payloads=[b"x"] * step[1])
        ready = core.take_ready()
        if ready.quorum_state is not None:
            assert ready.quorum_state.epoch >= persisted_epoch
            persisted_epoch = ready.quorum_state.epoch
        for entry in ready.committed:
            assert entry.offset == applied
            applied += 1
        assert core.high_watermark <= core.log_end
        assert core.next_deadline_ms() > now_ms or core.next_deadline_ms() >= 0
