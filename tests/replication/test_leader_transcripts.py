"""Transcript tests of the sans-IO leader (LeaderState): each file under testdata/ drives one
leader through follower fetches, ticks, appends, flushes and AlterPartition answers, and shows
every decision and state change. `pytest --rewrite` writes the actual output back.

Commands (times are absolute, in ms; every command but `leader` takes now=):
    leader replicas=1,2,3 isr=1,2,3 [leader-epoch=5] [partition-epoch=10] [lag-ms=100]
    append [n=1]                 the driver appended n records (on_local_append)
    flush                        the driver fsynced up to the LEO (on_flushed)
    fetch replica=2 offset=3 [epoch=E] [leader-epoch=E]   a follower fetch
    tick                         the periodic ISR check (on_tick)
    alter-ok [isr=1,2]           the controller committed the pending request (or isr=)
    alter-error error=NAME       the controller refused it
    metadata isr=1,2 partition-epoch=12   newer metadata for this leader epoch
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlog.errors import ErrorCode
from raftlog.replication.core.leader import LeaderState
from raftlog.replication.core.types import (
    AlterPartitionRequest,
    FetchDecision,
    LeaderAndIsr,
    LeaderEffects,
    ReplicationSettings,
)
from tests.datadriven import Command, run_transcript
from tests.replication.memory_log import MemoryLog, ReadOnlyView

TESTDATA = Path(__file__).parent / "testdata"
LEADER_ID = 1


def _ids(ids: frozenset[int] | set[int]) -> str:
    return "{" + ",".join(str(i) for i in sorted(ids)) + "}"


def _request(request: AlterPartitionRequest) -> str:
    return (
        f"AlterPartition isr={_ids(request.new_isr)} leader-epoch={request.leader_epoch} "
        f"partition-epoch={request.partition_epoch}"
    )


class LeaderHarness:
    """The driver of one LeaderState over a MemoryLog, printing what the core decides."""

    def __init__(self) -> None:
        self.log = MemoryLog()
        self.leader: LeaderState | None = None
        self.requests: list[AlterPartitionRequest] = []

    def handle(self, command: Command) -> str:
        if command.name == "leader":
            return self._start(command)
        leader = self.leader
        assert leader is not None, f"line {command.line_number}: no leader yet"
        now_ms = command.int_arg("now")
        before = self._state_lines()
        out: list[str] = []
        if command.name == "append":
            self.log.append(leader.leader_epoch, ["v"] * command.int_arg("n", 1))
            out += self._effects(leader.on_local_append(now_ms=now_ms))
        elif command.name == "flush":
            self.log.flush_to(self.log.log_end_offset)
            out += self._effects(leader.on_flushed(now_ms=now_ms))
        elif command.name == "fetch":
            decision = leader.on_follower_fetch(
                now_ms=now_ms,
                replica_id=command.int_arg("replica"),
                fetch_offset=command.int_arg("offset"),
                last_fetched_epoch=command.int_arg("epoch", leader.leader_epoch),
                current_leader_epoch=command.int_arg("leader-epoch", leader.leader_epoch),
            )
            out.append(self._decision(decision))
            out += self._effects(decision.effects)
        elif command.name == "tick":
            out += self._effects(leader.on_tick(now_ms=now_ms))
        elif command.name in ("alter-ok", "alter-error"):
            request = self.requests.pop(0)
            result: LeaderAndIsr | ErrorCode
            if command.name == "alter-ok":
                isr = frozenset(command.int_list("isr")) or request.new_isr
                result = LeaderAndIsr(
                    LEADER_ID,
                    request.leader_epoch,
                    request.partition_epoch + 1,
                    leader.state.replicas,
                    isr,
                )
                out.append(f"controller: committed isr={_ids(isr)} at {result.partition_epoch}")
            else:
                result = ErrorCode[command.args["error"]]
                out.append(f"controller: refused {result.name}")
            out += self._effects(leader.on_alter_partition_result(request=request, result=result))
        elif command.name == "metadata":
            state = LeaderAndIsr(
                LEADER_ID,
                leader.leader_epoch,
                command.int_arg("partition-epoch"),
                leader.state.replicas,
                frozenset(command.int_list("isr")),
            )
            out += self._effects(leader.update_state(state))
        else:
            raise ValueError(f"line {command.line_number}: unknown command {command.name}")
        after = self._state_lines()
        out += [f"~ {line}" for line in after if line not in before]
        return "\n".join(out)

    def _start(self, command: Command) -> str:
        settings = ReplicationSettings(replica_lag_time_max_ms=command.int_arg("lag-ms", 100))
        state = LeaderAndIsr(
            LEADER_ID,
            command.int_arg("leader-epoch", 5),
            command.int_arg("partition-epoch", 10),
            tuple(command.int_list("replicas")),
            frozenset(command.int_list("isr")),
        )
        self.leader = LeaderState(
            replica_id=LEADER_ID,
            log=ReadOnlyView(self.log),
            state=state,
            settings=settings,
            now_ms=0,
            high_watermark=0,
        )
        return "\n".join(self._state_lines())

    def _decision(self, decision: FetchDecision) -> str:
        line = f"-> {decision.outcome.name}"
        if decision.error != ErrorCode.none:
            line += f" {decision.error.name}"
        if decision.read_from_offset is not None:
            line += f" from={decision.read_from_offset}"
        if decision.diverging_epoch is not None:
            diverging = decision.diverging_epoch
            line += f" diverging=(epoch {diverging.epoch}, end {diverging.end_offset})"
        return line + f" hw={decision.high_watermark}"

    def _effects(self, effects: LeaderEffects) -> list[str]:
        out = []
        if effects.high_watermark_advanced:
            out.append(f"hw advanced to {effects.high_watermark}")
        if effects.alter_partition is not None:
            self.requests.append(effects.alter_partition)
            out.append(f"send {_request(effects.alter_partition)}")
        return out

    def _state_lines(self) -> list[str]:
        leader = self.leader
        assert leader is not None
        log = self.log
        lines = [
            f"log: leo={log.log_end_offset} flushed={log.flushed_offset}",
            f"hw={leader.high_watermark}",
            f"isr={_ids(leader.isr)} partition-epoch={leader.partition_epoch}",
            f"maximal-isr={_ids(leader.maximal_isr)}",
            "pending=" + ("none" if leader.pending is None else _request(leader.pending)),
        ]
        for replica_id, progress in sorted(leader.followers.items()):
            lines.append(
                f"follower {replica_id}: offset={progress.fetch_offset} "
                f"caught-up-at={progress.last_caught_up_time_ms}"
            )
        return lines


@pytest.mark.parametrize("path", sorted(TESTDATA.glob("*.txt")), ids=lambda p: p.stem)
def test_leader_transcript(path: Path, rewrite: bool) -> None:
    run_transcript(path, LeaderHarness().handle, rewrite=rewrite)
