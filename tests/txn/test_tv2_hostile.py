"""Forged KIP-890 part 2 requests: an EndTxn v5 or an internal add with out-of-range or
stale producer ids and epochs is refused with a code, one rate-limited log line, and an
answer that names no epoch."""

from __future__ import annotations

import logging
from typing import Any

import trio

from raftlog.errors import ErrorCode
from raftlog.net.kafka import handlers_txn
from raftlog.net.kafka.apis import ApiKey
from raftlog.net.limits import RateLimitedLog
from raftlog.txn import node_service
from raftlog.txn.rpc_bodies import TXN_VERIFY_METHOD, decode_verify_response
from tests.kafka.test_txn_wire import call, start_txn_broker
from tests.kafka.wire import WireClient
from tests.txn.test_node_service import DATA, Cluster, roundtrip, start_cluster

E = ErrorCode


async def _end_v5(client: WireClient, pid: int, epoch: int, txn_id: str = "forged") -> Any:
    return await call(
        client,
        ApiKey.END_TXN,
        5,
        transactional_id=txn_id,
        producer_id=pid,
        producer_epoch=epoch,
        committed=True,
    )


async def test_forged_end_txn_v5_is_refused_without_echoing_epochs(
    tmp_path, caplog, monkeypatch
) -> None:
    # A fresh limiter: an earlier test's refusal may have used up this interval's line.
    monkeypatch.setattr(handlers_txn, "_bad_producers", RateLimitedLog(handlers_txn.log))
    async with trio.open_nursery() as nursery:
        broker = await start_txn_broker(nursery, tmp_path)
        client = await WireClient.connect(broker.port)
        try:
            await _forge_end_txn(client, caplog)
        finally:
            await client.aclose()
            broker.backend.close()
        nursery.cancel_scope.cancel()


async def _forge_end_txn(client: WireClient, caplog: Any) -> None:
    init = await call(
        client,
        ApiKey.INIT_PRODUCER_ID,
        4,
        transactional_id="forged",
        transaction_timeout=60_000,
        producer_id=-1,
        producer_epoch=-1,
    )
    assert init.error_code == E.none
    pid, epoch = int(init.producer_id), int(init.producer_epoch)
    caplog.set_level(logging.WARNING, logger="raftlog.kafka")
    for _ in range(20):
        bad = await _end_v5(client, pid, -7)
        assert (bad.error_code, int(bad.producer_id), int(bad.producer_epoch)) == (
            E.invalid_request,
            -1,
            -1,
        )
    refusals = [r for r in caplog.records if "EndTxn v5" in r.getMessage()]
    assert 1 <= len(refusals) < 20  # rate-limited
    for forged_pid, forged_epoch, code in (
        (pid, epoch + 3, E.producer_fenced),  # a newer epoch than the coordinator's
        (pid + 1, epoch, E.invalid_producer_id_mapping),
        (-5, epoch, E.invalid_request),
    ):
        answer = await _end_v5(client, forged_pid, forged_epoch)
        assert answer.error_code == code
        assert (int(answer.producer_id), int(answer.producer_epoch)) == (-1, -1)
    unknown = await _end_v5(client, pid, epoch, txn_id="never-initialized")
    assert (unknown.error_code, int(unknown.producer_epoch)) == (
        E.invalid_producer_id_mapping,
        -1,
    )


async def test_internal_add_with_out_of_range_fields_is_refused(
    autojump_clock, caplog, monkeypatch
) -> None:
    monkeypatch.setattr(node_service, "_bad_requests", RateLimitedLog(node_service.log))
    cluster = Cluster()
    cluster.set_topic(DATA, {0: (1, 0)})
    caplog.set_level(logging.WARNING, logger="raftlog.txn")
    async with trio.open_nursery() as nursery:
        await start_cluster(nursery, cluster)
        handle = cluster.rpc[1][TXN_VERIFY_METHOD]
        good = {
            "transactional_id": "t",
            "producer_id": 5,
            "producer_epoch": 0,
            "topic": DATA,
            "partition": 0,
            "mode": 1,
        }
        for field, value in (
            ("mode", 2),
            ("mode", -1),
            ("producer_epoch", 2**15),
            ("producer_epoch", -1),
            ("producer_id", -3),
            ("partition", -1),
        ):
            answer = await handle(2, roundtrip(dict(good, **{field: value})))
            assert decode_verify_response(roundtrip(answer)) is E.invalid_request, field
        lines = [r for r in caplog.records if "txn.verify" in r.getMessage()]
        assert 1 <= len(lines) < 6  # one line per interval, not one per request
        nursery.cancel_scope.cancel()
