"""Controller: AlterUserScramCredentials (KIP-554), and what brokers describe from the image."""

import hashlib

import pytest

from raftlog.broker import scram_descriptions
from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.metadata import records as r
from raftlog.metadata.controller import messages as m
from raftlog.metadata.controller.controller import Controller
from raftlog.metadata.image import MetadataImage
from raftlog.metadata.snapshot import decode_snapshot, encode_snapshot
from raftlog.security.acl import ScramMechanism
from raftlog.security.scram import salted_password, verify_password

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
SALT = bytes(range(32))


def upsert(name, mechanism=SHA256, password="secret", iterations=4096, salt=SALT, **kw):
    salted = kw.pop("salted", None)
    if salted is None:  # what a client sends: Hi(password, salt, iterations), in or out of range
        salted = hashlib.pbkdf2_hmac(mechanism.hash_name, password.encode(), salt, iterations)
    return m.ScramCredentialUpsertion(name, int(mechanism), iterations, salt, salted)


def delete(name, mechanism=SHA256):
    return m.ScramCredentialDeletion(name, int(mechanism))


def alter(c, deletions=(), upsertions=()):
    result = c.handle(m.AlterUserScramCredentials(tuple(deletions), tuple(upsertions)), 0)
    return result, {x.user: (x.error_code, x.error_message) for x in result.reply.results}


def controller():
    return Controller(MetadataImage.empty("cid"), NodeConfig(), now_ms=0)


def test_upsert_stores_keys_derived_from_the_salted_password_never_the_password():
    c = controller()
    result, codes = alter(c, upsertions=[upsert("alice"), upsert("bob", SHA512, "pw", 8192)])
    assert codes == {"alice": (ErrorCode.none, None), "bob": (ErrorCode.none, None)}
    assert [type(rec) for rec in result.records] == [r.UserScramCredential] * 2
    alice = c.image.scram_credentials[("alice", SHA256)]
    bob = c.image.scram_credentials[("bob", SHA512)]
    assert verify_password(alice, "secret") and not verify_password(alice, "Secret")
    assert verify_password(bob, "pw") and bob.iterations == 8192 and bob.salt == SALT
    salted = salted_password(SHA256, "secret", SALT, 4096)
    assert all(salted not in (rec.stored_key, rec.server_key) for rec in result.records)


def test_one_user_two_mechanisms_in_one_request():
    c = controller()
    _, codes = alter(c, upsertions=[upsert("alice"), upsert("alice", SHA512, "other")])
    assert codes == {"alice": (ErrorCode.none, None)}
    _, codes = alter(c, [delete("alice", SHA512)], [upsert("alice", password="new")])
    assert codes == {"alice": (ErrorCode.none, None)}
    assert list(c.image.scram_credentials) == [("alice", SHA256)]
    assert verify_password(c.image.scram_credentials[("alice", SHA256)], "new")


def test_upsert_replaces_and_delete_removes():
    c = controller()
    alter(c, upsertions=[upsert("alice"), upsert("alice2", SHA512)])
    alter(c, upsertions=[upsert("alice", password="new")])
    assert verify_password(c.image.scram_credentials[("alice", SHA256)], "new")
    result, codes = alter(c, deletions=[delete("alice"), delete("alice2", SHA512)])
    assert codes == {"alice": (ErrorCode.none, None), "alice2": (ErrorCode.none, None)}
    assert result.records == (
        r.RemoveUserScramCredential("alice", 1),
        r.RemoveUserScramCredential("alice2", 2),
    )
    assert not c.image.scram_credentials


@pytest.mark.parametrize(
    ("deletions", "upsertions", "code", "message"),
    [
        ([delete("carol")], [], ErrorCode.resource_not_found, "no SCRAM-SHA-256 credential"),
        ([m.ScramCredentialDeletion("alice", 0)], [], ErrorCode.unsupported_sasl_mechanism, ""),
        ([m.ScramCredentialDeletion("alice", 7)], [], ErrorCode.unsupported_sasl_mechanism, ""),
        (
            [],
            [m.ScramCredentialUpsertion("carol", 0, 4096, SALT, b"x" * 32)],
            ErrorCode.unsupported_sasl_mechanism,
            "",
        ),
        ([], [upsert("carol", iterations=4095)], ErrorCode.unacceptable_credential, "too few"),
        ([], [upsert("carol", iterations=16385)], ErrorCode.unacceptable_credential, "too many"),
        ([], [upsert("carol", salt=b"s" * 15)], ErrorCode.unacceptable_credential, "salt"),
        ([], [upsert("carol", salt=b"")], ErrorCode.unacceptable_credential, "salt"),
        ([], [upsert("carol", salt=b"s" * 257)], ErrorCode.unacceptable_credential, "salt"),
        ([], [upsert("carol", salted=b"x" * 64)], ErrorCode.unacceptable_credential, "salted"),
        ([], [upsert("")], ErrorCode.unacceptable_credential, "empty"),
        ([], [upsert("u" * 256)], ErrorCode.unacceptable_credential, "over 255"),
        # KIP-554: a (user, mechanism) named twice, deleted or upserted, is refused.
        ([delete("alice"), delete("alice")], [], ErrorCode.duplicate_resource, "once"),
        ([delete("alice")], [upsert("alice")], ErrorCode.duplicate_resource, "once"),
        ([], [upsert("alice", SHA512), upsert("alice", SHA512)], ErrorCode.duplicate_resource, ""),
        # A user's changes are made together or not at all (93: UNACCEPTABLE_CREDENTIAL).
        ([delete("alice", SHA512)], [upsert("alice")], ErrorCode.resource_not_found, ""),
        (
            [delete("alice")],
            [upsert("alice", SHA512, iterations=1)],
            ErrorCode.unacceptable_credential,
            "too few",
        ),
    ],
)
def test_refusals_fail_only_that_user(deletions, upsertions, code, message):
    c = controller()
    alter(c, upsertions=[upsert("alice")])
    before = dict(c.image.scram_credentials)
    result, codes = alter(c, deletions, [*upsertions, upsert("dave")])
    ((_user, (got_code, got_message)),) = [(u, v) for u, v in codes.items() if u != "dave"]
    assert got_code == code
    assert message in (got_message or "")
    assert codes["dave"] == (ErrorCode.none, None)
    assert {k: v for k, v in c.image.scram_credentials.items() if k[0] != "dave"} == before
    assert all(rec.name == "dave" for rec in result.records)


def test_credentials_survive_a_snapshot_and_a_new_controller():
    c = controller()
    result, _ = alter(c, upsertions=[upsert("alice"), upsert("bob", SHA512)])
    committed, _ = MetadataImage.empty("cid").apply(result.records, 0, 1)
    restored = decode_snapshot(encode_snapshot(committed))
    assert restored.scram_credentials == committed.scram_credentials
    successor = Controller.from_image(restored, NodeConfig(), now_ms=0)
    _, codes = alter(successor, deletions=[delete("bob", SHA512)])
    assert codes == {"bob": (ErrorCode.none, None)}


def test_describe_from_the_image():
    c = controller()
    alter(c, upsertions=[upsert("alice"), upsert("bob", SHA512, iterations=8192)])
    alter(c, upsertions=[upsert("alice", SHA512, iterations=5000)])
    everyone = scram_descriptions(c.image, None)
    assert [(d.user, d.error, tuple(d.credentials)) for d in everyone] == [
        ("alice", ErrorCode.none, ((SHA256, 4096), (SHA512, 5000))),
        ("bob", ErrorCode.none, ((SHA512, 8192),)),
    ]
    assert scram_descriptions(c.image, []) == everyone
    named = scram_descriptions(c.image, ["bob", "carol", "alice", "alice"])
    assert [(d.user, d.error) for d in named] == [
        ("bob", ErrorCode.none),
        ("carol", ErrorCode.resource_not_found),
        ("alice", ErrorCode.duplicate_resource),
    ]
    assert not named[1].credentials and not named[2].credentials


def test_requests_and_replies_cross_the_internal_wire():
    union = m.ControllerRequest | m.ControllerReply
    for message in (
        m.AlterUserScramCredentials((delete("a"),), (upsert("b"),)),
        m.AlterUserScramCredentialsReply((m.ScramUserResult("a", ErrorCode.resource_not_found),)),
    ):
        assert m.CODEC.decode(union, m.CODEC.encode(message, union)) == message
