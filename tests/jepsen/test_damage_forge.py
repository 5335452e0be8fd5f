"""The corrupt / truncate nemeses' file damage on real segment files, and the forge nemesis's
messages: each forgery is what it claims to be on the wire, and a node refuses it."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from jepsen import damage, forger
from raftlog.codec import DecodeError
from raftlog.metadata.raft import messages as rm
from raftlog.net import rpc
from raftlog.storage import PartitionLog
from raftlog.storage.scrubber import ScrubSchedule
from tests.storage.test_damage import SMALL, leader_log, scrub_all


def reopened(path: Path) -> PartitionLog:
    return PartitionLog.open(path, SMALL, now_ms=0)


@pytest.mark.parametrize("seed", range(8))
def test_a_flipped_byte_lands_in_an_old_batch_and_fails_its_crc(tmp_path: Path, seed: int) -> None:
    lg = leader_log(tmp_path / "t-0", batches=40)
    lg.close()
    done = damage.flip_byte(tmp_path / "t-0", random.Random(seed))
    assert done is not None and done.kind == "flip", f"seed={seed}"
    lg = reopened(tmp_path / "t-0")
    # Found by recovery (above the recovery point) or by the first read/scrub (below it):
    # either way, some batch of the log no longer verifies.
    results = scrub_all(lg, ScrubSchedule(bytes_per_s=10**9))
    assert any(r.damage for r in results) or lg.log_end_offset < 120, f"seed={seed}"


@pytest.mark.parametrize("seed", range(8))
def test_a_cut_mid_batch_is_a_torn_tail_recovery_removes(tmp_path: Path, seed: int) -> None:
    lg = leader_log(tmp_path / "t-0", batches=40)
    lg.close()
    done = damage.cut_mid_batch(tmp_path / "t-0", random.Random(seed))
    assert done is not None and done.kind == "cut", f"seed={seed}"
    lg = reopened(tmp_path / "t-0")
    assert lg.log_end_offset < 120, f"seed={seed}"
    # Cut below the recovery point a clean close wrote: recovery says data was lost.
    assert lg.lost_data, f"seed={seed}"


def test_nothing_to_damage_in_an_empty_log(tmp_path: Path) -> None:
    (tmp_path / "t-0").mkdir()
    assert damage.flip_byte(tmp_path / "t-0", random.Random(0)) is None
    assert damage.cut_mid_batch(tmp_path / "t-0", random.Random(0)) is None


def decode_frame(data: bytes) -> tuple[int, int, int, str, object]:
    (size,) = struct.unpack_from(">i", data)
    assert size == len(data) - 4
    return rpc._decode(data[4:])


TARGET = forger.Target([1, 2, 3], "jepsen", 6)


@pytest.mark.parametrize("name", sorted(forger.FORGERIES))
def test_every_forgery_claims_no_node_on_its_first_frame(name: str) -> None:
    rng = random.Random(name)
    for _ in range(20):
        frames = forger.FORGERIES[name](TARGET, rng)
        assert frames
        if name == "garbage":
            continue
        _, _, sender, _, _ = decode_frame(frames[0])
        assert sender not in TARGET.node_ids, name


def test_raft_forgeries_decode_as_raft_casts_except_the_out_of_range_epoch() -> None:
    rng = random.Random(1)
    for name in ("vote_from_outsider", "leader_announcement", "metadata_fetch_for_a_voter"):
        for frame in forger.FORGERIES[name](TARGET, rng):
            kind, _, _, method, body = decode_frame(frame)
            assert (kind, method) == (rpc.KIND_CAST, "raft")
            rm.CODEC.from_wire(rm.RaftCast, body)
    (frame,) = forger.vote_past_the_epoch_bound(TARGET, rng)
    _, _, _, _, body = decode_frame(frame)
    with pytest.raises(DecodeError):
        rm.CODEC.from_wire(rm.RaftCast, body)


def test_an_identity_switch_claims_a_node_on_its_second_frame() -> None:
    first, second = forger.identity_switch(TARGET, random.Random(2))
    assert decode_frame(first)[2] not in TARGET.node_ids
    assert decode_frame(second)[2] in TARGET.node_ids
