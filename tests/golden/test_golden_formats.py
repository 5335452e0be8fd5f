"""The internal wire formats and the metadata files on disk, byte for byte.

Old nodes talk to new ones during a rolling upgrade, and a new node starts from the metadata
log and snapshots an old one wrote: every sample must encode to the pinned bytes and the
pinned bytes must decode to the sample.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from raftlog.metadata.raft.log_store import MetadataLogStore
from raftlog.metadata.records import decode_entry
from raftlog.metadata.snapshot import decode_snapshot
from tests.golden import samples

FAMILIES = {family.name: family for family in samples.families()}
CASES = [(family, name) for family in FAMILIES.values() for name in family.samples]


@pytest.mark.parametrize(("family", "name"), CASES, ids=[f"{f.name}-{n}" for f, n in CASES])
def test_sample_encodes_to_the_pinned_bytes_and_back(family: samples.Family, name: str) -> None:
    pinned = samples.read_hex(samples.hex_path(family))
    value = family.samples[name]
    assert family.encode(value).hex() == pinned[name].hex()
    assert family.decode(pinned[name]) == value


def test_every_pinned_sample_is_still_a_sample() -> None:
    for family in FAMILIES.values():
        assert set(samples.read_hex(samples.hex_path(family))) == set(family.samples)


def _files(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


def test_metadata_dir_is_written_byte_for_byte(tmp_path: Path) -> None:
    samples.write_metadata_dir(tmp_path)
    assert _files(tmp_path) == _files(samples.METADATA_DIR)


def test_pinned_metadata_log_and_snapshot_still_load(tmp_path: Path) -> None:
    shutil.copytree(samples.METADATA_DIR, tmp_path, dirs_exist_ok=True)
    store = MetadataLogStore(tmp_path, now_ms=samples.METADATA_NOW_MS)
    try:
        entries = store.load_entries()
        snapshot = store.load_snapshot()
    finally:
        store.close()
    assert [(e.offset, e.epoch) for e in entries] == [
        (offset, epoch) for offset, (epoch, _) in enumerate(samples.METADATA_ENTRIES)
    ]
    assert [decode_entry(e.data) for e in entries] == [
        records for _, records in samples.METADATA_ENTRIES
    ]
    assert snapshot is not None
    assert snapshot.end_offset == samples.METADATA_SNAPSHOT_END_OFFSET
    image = decode_snapshot(snapshot.data)
    assert image == samples.metadata_image_at(samples.METADATA_SNAPSHOT_END_OFFSET)
    assert image.last_applied_offset == samples.METADATA_SNAPSHOT_END_OFFSET - 1
