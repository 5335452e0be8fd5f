"""MetadataLogStore and QuorumDriver details that the 3-node harness cannot pin down."""

from raftlog.metadata.raft.log_store import MetadataLogStore
from raftlog.metadata.raft.messages import Entry
from raftlog.metadata.raft.types import Snapshot

NOW_MS = 1_700_000_000_000


def _entries(start: int, end: int, epoch: int = 1) -> list[Entry]:
    return [Entry(offset, epoch, f"e{offset}".encode()) for offset in range(start, end)]


def test_late_local_snapshot_never_deletes_a_newer_installed_one(tmp_path):
    # A follower starts persisting a local snapshot (end 5); before that write finishes it
    # installs the leader's snapshot (end 20), which empties its log up to 20. The local
    # write then completes: it must not delete the installed snapshot, or the next start
    # finds snapshot 5 and a log starting at 20.
    store = MetadataLogStore(tmp_path, now_ms=NOW_MS)
    store.append(_entries(0, 8), NOW_MS)
    store.install_snapshot(Snapshot(20, 2, b"leader's"))
    store.save_snapshot(Snapshot(5, 1, b"local"))
    store.close()

    reopened = MetadataLogStore(tmp_path, now_ms=NOW_MS)
    snapshot = reopened.load_snapshot()
    assert snapshot == Snapshot(20, 2, b"leader's")
    assert reopened.log.log_start_offset == 20
    # A newer snapshot replaces all but the one before it (the fallback at the next start).
    reopened.save_snapshot(Snapshot(30, 2, b"newer"))
    assert [p.name.split("-")[0] for p in reopened._snapshot_paths()] == [
        f"{20:020d}",
        f"{30:020d}",
    ]
    reopened.close()


def _driver(tmp_path, **callbacks):
    from raftlog.metadata.raft.driver import QuorumDriver
    from raftlog.net.rpc import PeerSet
    from raftlog.storage.flusher import Flusher
    from tests.metadata.test_node_quorum import make_configs

    config = make_configs(tmp_path, n=1)[0]
    store = MetadataLogStore(config.data_path, now_ms=NOW_MS)
    noop = lambda *_: None  # noqa: E731
    return QuorumDriver(
        config,
        store,
        Flusher(),
        PeerSet(config.node_id),
        on_commit=callbacks.get("on_commit", noop),
        on_snapshot=callbacks.get("on_snapshot", noop),
        on_role_change=callbacks.get("on_role_change", noop),
    )


async def test_snapshot_install_changes_the_log_on_the_event_loop_only(tmp_path):
    import threading

    from raftlog.metadata.raft.types import Ready

    installed = []
    driver = _driver(tmp_path, on_snapshot=installed.append)
    driver.store.append(_entries(0, 4), NOW_MS)
    log = driver.store.log
    threads = []
    truncate = log.truncate_fully_and_start_at

    def recording_truncate(offset):
        threads.append(threading.current_thread() is threading.main_thread())
        truncate(offset)

    log.truncate_fully_and_start_at = recording_truncate
    snapshot = Snapshot(10, 2, b"image")
    driver.core.take_ready = lambda: Ready(snapshot=snapshot, high_watermark=10)
    await driver._process_ready()
    assert threads == [True], "the log was emptied from a worker thread"
    assert installed == [snapshot]
    assert (log.log_start_offset, log.log_end_offset) == (10, 10)
    assert driver.store.load_snapshot() == snapshot
    driver.close()


async def test_observer_table_is_bounded_and_bad_reply_addresses_are_dropped(tmp_path, monkeypatch):
    from raftlog.metadata.raft import driver as quorum
    from raftlog.metadata.raft.messages import Fetch

    monkeypatch.setattr(quorum, "MAX_OBSERVER_COUNT", 3)
    driver = _driver(tmp_path)

    def fetch_from(sender: int) -> list:
        return Fetch(sender, 0, 0, 0, 0).to_wire()

    # A reply port that is not a number is malformed input: dropped, never raised.
    driver.receive(50, [fetch_from(50), "127.0.0.1", "not-a-port"])
    assert driver._observers == {}
    for sender in range(100, 110):
        driver.receive(sender, [fetch_from(sender), "127.0.0.1", 9000 + sender])
    assert sorted(driver._observers) == [100, 101, 102]
    # A known observer may still move (a restart on another port).
    driver.receive(101, [fetch_from(101), "127.0.0.1", 1234])
    assert driver._observers[101] == ("127.0.0.1", 1234)
    driver.close()


async def test_truncating_a_divergent_tail_keeps_every_entry_below_the_cut(tmp_path):
    # A follower appended entries 0..5 of epoch 1 in one go (one fetch response); the new
    # leader's log has only 0..2 of epoch 1, so the core truncates to 3 and fetches 3..4 of
    # epoch 2. Storage truncates whole batches: the store must still hold 0..2 afterwards.
    from raftlog.metadata.raft.types import Ready

    driver = _driver(tmp_path)
    driver.store.append(_entries(0, 6), NOW_MS)
    new_tail = _entries(3, 5, epoch=2)
    driver.core.take_ready = lambda: Ready(truncate_to=3, entries=new_tail)
    await driver._process_ready()
    assert driver.store.log.log_end_offset == 5
    assert driver.store.load_entries() == _entries(0, 3) + new_tail
    driver.close()
