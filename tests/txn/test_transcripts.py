"""Transcript tests of the transaction coordinator: each file under testdata/ drives one
`__transaction_state` partition's coordinator through requests, appends, marker answers, ticks
and failovers, and shows every reply, record and marker. `pytest --rewrite` writes the actual
output back.

Commands (appends and markers queue until answered; the clock starts at 1000000 ms):
    init id=tx [timeout=60000] [pid=P epoch=E] [v=5]    InitProducerId
    add id=tx pid=P epoch=E partitions=t-0,u-1 [verify] [v=3]   AddPartitionsToTxn
    offsets id=tx pid=P epoch=E group=g                 AddOffsetsToTxn
    end id=tx pid=P epoch=E commit|abort [v=3]          EndTxn
    appended [error=NAME]      answer every queued append (NONE: it is in the log)
    markers [error=NAME] [failing=t-1]   answer every queued marker write
    tick [advance=MS]          advance the clock, run the timers
    failover                   resign; a new coordinator (epoch + 1) loads the log
    verify id=tx pid=P epoch=E partition=t-0             KIP-890 verification
    show id=tx                 the id's state in memory and in the log
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raftlog.errors import ErrorCode
from raftlog.txn import log_format as fmt
from raftlog.txn.effects import Effects
from raftlog.txn.messages import (
    AddOffsetsToTxnRequest,
    AddPartitionsTxn,
    AddPartitionsTxnResult,
    EndTxnRequest,
    EndTxnResult,
    InitProducerIdRequest,
    InitProducerIdResult,
)
from raftlog.txn.settings import TxnConfig
from tests.datadriven import Command, run_transcript
from tests.txn.harness import Harness

TESTDATA = Path(__file__).parent / "testdata"
CONFIG = TxnConfig(
    transaction_state_log_num_partitions=1,
    transactional_id_expiration_ms=3_600_000,
)


def _partition(text: str) -> fmt.TopicPartition:
    topic, _, partition = text.rpartition("-")
    return topic, int(partition)


def _partitions(partitions: Any) -> str:
    return ",".join(f"{t}-{p}" for t, p in sorted(partitions)) or "-"


def _reply(result: object) -> str:
    if isinstance(result, InitProducerIdResult):
        return f"{result.error_code.name} pid={result.producer_id} epoch={result.producer_epoch}"
    if isinstance(result, EndTxnResult):
        return result.error_code.name
    if isinstance(result, ErrorCode):
        return result.name
    if isinstance(result, list):
        return "; ".join(_add_result(r) for r in result)
    raise AssertionError(result)


def _add_result(result: AddPartitionsTxnResult) -> str:
    codes = " ".join(f"{t}-{p}={code.name}" for (t, p), code in result.errors.items())
    return f"{result.transactional_id}: {codes}"


def _record(record: fmt.Record) -> str:
    key, value_bytes = record
    value = fmt.decode_value(value_bytes)
    if value is None:
        return f"{fmt.decode_key(key)} tombstone"
    text = (
        f"{fmt.decode_key(key)} {value.state.kafka_name} pid={value.producer_id} "
        f"epoch={value.producer_epoch} partitions={_partitions(value.partitions)}"
    )
    if value.previous_producer_id >= 0:
        text += f" previous-pid={value.previous_producer_id}"
    return text


class TranscriptHarness(Harness):
    def __init__(self) -> None:
        self.out: list[str] = []
        super().__init__(config=CONFIG, auto=False)

    def apply(self, fx: Effects) -> None:
        for token, response in fx.replies:
            self.out.append(f"reply #{token}: {_reply(response)}")
        for append in fx.appends:
            for record in append.records:
                self.out.append(f"append: {_record(record)}")
        for marker in fx.markers:
            kind = "COMMIT" if marker.commit else "ABORT"
            self.out.append(
                f"markers: {kind} pid={marker.producer_id} epoch={marker.producer_epoch} "
                f"coordinator-epoch={marker.coordinator_epoch} {_partitions(marker.partitions)}"
            )
        super().apply(fx)

    def handle(self, command: Command) -> str:
        self.out = []
        args = command.args
        version = {"v": command.int_arg("v")} if "v" in args else {}
        if command.name == "init":
            req = InitProducerIdRequest(
                args["id"],
                command.int_arg("timeout", 60_000),
                command.int_arg("pid", -1),
                command.int_arg("epoch", -1),
                **({"api_version": version["v"]} if version else {}),
            )
            self.call("init_producer_id", req)
        elif command.name == "add":
            parts = tuple(_partition(p) for p in args["partitions"].split(","))
            req_add = AddPartitionsTxn(
                args["id"],
                command.int_arg("pid"),
                command.int_arg("epoch"),
                parts,
                verify_only="verify" in command.words,
                **({"api_version": version["v"]} if version else {}),
            )
            self.call("add_partitions_to_txn", [req_add])
        elif command.name == "offsets":
            req_offsets = AddOffsetsToTxnRequest(
                args["id"], command.int_arg("pid"), command.int_arg("epoch"), args["group"]
            )
            self.call("add_offsets_to_txn", req_offsets)
        elif command.name == "end":
            req_end = EndTxnRequest(
                args["id"],
                command.int_arg("pid"),
                command.int_arg("epoch"),
                "commit" in command.words,
                **({"api_version": version["v"]} if version else {}),
            )
            self.call("end_txn", req_end)
        elif command.name == "appended":
            self.flush_appends(ErrorCode[args.get("error", "none")])
        elif command.name == "markers":
            failing = frozenset(_partition(p) for p in args.get("failing", "").split(",") if p)
            self.write_markers(ErrorCode[args.get("error", "none")], failing)
        elif command.name == "tick":
            self.tick(command.int_arg("advance", 0))
        elif command.name == "failover":
            self.failover()
            self.out.insert(0, f"coordinator epoch {self.coord.coordinator_epoch} loaded")
        elif command.name == "verify":
            code = self.coord.verify(
                args["id"],
                command.int_arg("pid"),
                command.int_arg("epoch"),
                *_partition(args["partition"]),
            )
            self.out.append(code.name)
        elif command.name == "show":
            txn = self.coord.transactions.get(args["id"])
            if txn is None:
                self.out.append("memory: none")
            else:
                self.out.append(
                    f"memory: {txn.state.kafka_name} pid={txn.producer_id} "
                    f"epoch={txn.producer_epoch} partitions={_partitions(txn.partitions)}"
                    + (" pending" if txn.pending else "")
                )
            stored = self.stored().get(args["id"])
            log_line = "none" if stored is None else _record(fmt.record(args["id"], stored))
            self.out.append(f"log: {log_line}")
        else:
            raise KeyError(f"line {command.line_number}: unknown command {command.name}")
        return "\n".join(self.out) or "ok"


@pytest.mark.parametrize("path", sorted(TESTDATA.glob("*.txt")), ids=lambda p: p.stem)
def test_txn_transcript(path: Path, rewrite: bool) -> None:
    run_transcript(path, TranscriptHarness().handle, rewrite=rewrite)
