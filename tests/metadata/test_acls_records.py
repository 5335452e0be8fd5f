"""ACL and SCRAM records: bounds refused at decode, applied to the image, kept by snapshots."""

import uuid

import msgpack
import pytest

from raftlog.metadata import records as r
from raftlog.metadata.image import MetadataApplyError, MetadataImage
from raftlog.metadata.records import RecordDecodeError, decode_record, encode_record
from raftlog.metadata.snapshot import decode_snapshot, encode_snapshot
from raftlog.security.acl import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    ScramCredential,
    ScramMechanism,
)

ID1 = uuid.UUID(int=1)
ID2 = uuid.UUID(int=2)
READ_T = AclBinding(
    ResourceType.TOPIC,
    "orders",
    PatternType.LITERAL,
    "User:alice",
    "*",
    AclOperation.READ,
    AclPermissionType.ALLOW,
)
DENY_G = AclBinding(
    ResourceType.GROUP,
    "app-",
    PatternType.PREFIXED,
    "User:bob",
    "10.0.0.1",
    AclOperation.ALL,
    AclPermissionType.DENY,
)
SHA256 = ScramCredential(ScramMechanism.SCRAM_SHA_256, b"s" * 16, b"a" * 32, b"b" * 32, 4096)
SHA512 = ScramCredential(ScramMechanism.SCRAM_SHA_512, b"t" * 64, b"c" * 64, b"d" * 64, 16384)


def ace_wire(**changes):
    fields = {
        "id": msgpack.ExtType(1, ID1.bytes),
        "resource_type": 2,
        "resource_name": "orders",
        "pattern_type": 3,
        "principal": "User:alice",
        "host": "*",
        "operation": 3,
        "permission": 3,
    }
    fields.update(changes)
    return msgpack.packb([r.AccessControlEntry.TYPE_ID, 0, *fields.values()])


def scram_wire(**changes):
    fields = {
        "name": "alice",
        "mechanism": 1,
        "salt": b"s" * 16,
        "stored_key": b"a" * 32,
        "server_key": b"b" * 32,
        "iterations": 4096,
    }
    fields.update(changes)
    return msgpack.packb([r.UserScramCredential.TYPE_ID, 0, *fields.values()])


def test_records_round_trip_and_name_their_binding_and_credential():
    ace = r.AccessControlEntry.of(ID1, READ_T)
    assert decode_record(ace_wire()) == ace
    assert decode_record(encode_record(ace)).binding == READ_T
    cred = r.UserScramCredential.of("alice", SHA256)
    assert decode_record(scram_wire()) == cred
    assert decode_record(encode_record(cred)).credential == SHA256
    for rec in (r.RemoveAccessControlEntry(ID2), r.RemoveUserScramCredential("alice", 2)):
        assert decode_record(encode_record(rec)) == rec


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"resource_type": 1}, r"resource_type has an invalid value: 1 is outside \[2, 5\]"),  # ANY
        ({"resource_type": 0}, "resource_type"),  # UNKNOWN
        ({"resource_type": 7}, "resource_type"),  # USER: not stored
        ({"pattern_type": 2}, "pattern_type"),  # MATCH
        ({"pattern_type": 5}, "pattern_type"),
        ({"operation": 1}, "operation"),  # ANY
        ({"operation": 15}, "operation"),
        ({"permission": 1}, "permission"),  # ANY
        ({"permission": 4}, "permission"),
        ({"resource_name": "x" * 1025}, "resource_name"),
        ({"principal": "User:" + "x" * 508}, "principal"),
        ({"host": "h" * 256}, "host"),
        ({"operation": "3"}, "operation"),
        ({"id": b"x" * 16}, "id"),
    ],
)
def test_access_control_entry_out_of_range_is_refused(changes, message):
    with pytest.raises(RecordDecodeError, match=message):
        decode_record(ace_wire(**changes))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "u" * 256}, "name"),
        ({"mechanism": 0}, "mechanism"),
        ({"mechanism": 3}, "mechanism"),
        ({"iterations": 4095}, "iterations"),
        ({"iterations": 16385}, "iterations"),
        ({"salt": b""}, "salt of 0 bytes"),
        ({"salt": b"s" * 15}, "salt of 15 bytes"),
        ({"salt": b"s" * 257}, "salt"),
        ({"stored_key": b"a" * 31}, "keys of 31 and 32 bytes"),
        ({"server_key": b"b" * 64}, "keys of 32 and 64 bytes"),
        ({"mechanism": 2}, "SCRAM-SHA-512 keys are 64 bytes"),  # 32-byte keys for SHA-512
        ({"stored_key": b"a" * 65, "server_key": b"b" * 65, "mechanism": 2}, "stored_key"),
    ],
)
def test_user_scram_credential_out_of_range_is_refused(changes, message):
    with pytest.raises(RecordDecodeError, match=message):
        decode_record(scram_wire(**changes))


def test_remove_user_scram_credential_bounds():
    for name, mechanism in (("u" * 256, 1), ("alice", 0), ("alice", 3)):
        data = msgpack.packb([r.RemoveUserScramCredential.TYPE_ID, 0, name, mechanism])
        with pytest.raises(RecordDecodeError):
            decode_record(data)


def build_image():
    image = MetadataImage.empty("cid")
    image, delta = image.apply(
        [
            r.AccessControlEntry.of(ID1, READ_T),
            r.AccessControlEntry.of(ID2, DENY_G),
            r.UserScramCredential.of("alice", SHA256),
            r.UserScramCredential.of("alice", SHA512),
            r.UserScramCredential.of("bob", SHA256),
        ],
        offset=4,
        epoch=1,
    )
    assert delta.acls_changed and not delta.empty
    assert delta.changed_scram_credentials == {
        ("alice", ScramMechanism.SCRAM_SHA_256),
        ("alice", ScramMechanism.SCRAM_SHA_512),
        ("bob", ScramMechanism.SCRAM_SHA_256),
    }
    return image


def test_image_applies_acls_and_credentials_copy_on_write():
    empty = MetadataImage.empty("cid")
    image = build_image()
    assert dict(image.acls) == {ID1: READ_T, ID2: DENY_G}
    assert image.scram_credentials[("alice", ScramMechanism.SCRAM_SHA_512)] == SHA512
    assert not empty.acls and not empty.scram_credentials  # the old image is untouched
    with pytest.raises(TypeError):
        image.acls[ID1] = DENY_G  # type: ignore[index]

    newer, delta = image.apply(
        [r.RemoveAccessControlEntry(ID1), r.RemoveUserScramCredential("alice", 1)], 5, 1
    )
    assert dict(newer.acls) == {ID2: DENY_G}
    assert ("alice", ScramMechanism.SCRAM_SHA_256) not in newer.scram_credentials
    assert delta.acls_changed
    assert delta.changed_scram_credentials == {("alice", ScramMechanism.SCRAM_SHA_256)}
    assert ID1 in image.acls  # still there in the image before
    # A record that touches neither keeps the same maps (nothing copied).
    same, delta = newer.apply([r.FeatureLevel("metadata.version", 1)], 6, 1)
    assert same.acls is newer.acls and same.scram_credentials is newer.scram_credentials
    assert not delta.acls_changed and not delta.changed_scram_credentials


def test_image_refuses_records_that_do_not_fit():
    image = build_image()
    with pytest.raises(MetadataApplyError, match="already exists"):
        image.apply([r.AccessControlEntry.of(ID1, DENY_G)], 5)
    with pytest.raises(MetadataApplyError, match="unknown ACL id"):
        image.apply([r.RemoveAccessControlEntry(uuid.UUID(int=9))], 5)
    with pytest.raises(MetadataApplyError, match="has none"):
        image.apply([r.RemoveUserScramCredential("carol", 1)], 5)


def test_snapshot_round_trip_keeps_acls_and_credentials():
    image = build_image()
    loaded = decode_snapshot(encode_snapshot(image))
    assert loaded == image
    assert dict(loaded.acls) == {ID1: READ_T, ID2: DENY_G}
    assert dict(loaded.scram_credentials) == dict(image.scram_credentials)
