"""SCRAM credentials: derivation matches RFC 7677, imports are range-checked, checks hold."""

from __future__ import annotations

import base64
import hashlib

import pytest

from raftlog.security import scram
from raftlog.security.acl import ScramCredential, ScramMechanism

SHA256 = ScramMechanism.SCRAM_SHA_256
SHA512 = ScramMechanism.SCRAM_SHA_512
RFC7677_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")


def test_salted_password_is_pbkdf2() -> None:
    got = scram.salted_password(SHA256, "pencil", RFC7677_SALT, 4096)
    assert got == hashlib.pbkdf2_hmac("sha256", b"pencil", RFC7677_SALT, 4096)
    assert len(got) == 32


@pytest.mark.parametrize("mechanism", [SHA256, SHA512])
def test_make_credential_round_trip(mechanism: ScramMechanism) -> None:
    credential = scram.make_credential(mechanism, "s3cret")
    assert credential.mechanism == mechanism
    assert credential.iterations == scram.MIN_ITERATIONS
    assert len(credential.salt) == scram.DEFAULT_SALT_BYTES
    assert len(credential.stored_key) == len(credential.server_key) == scram.digest_size(mechanism)
    assert scram.verify_password(credential, "s3cret")
    assert not scram.verify_password(credential, "s3cret ")
    assert not scram.verify_password(credential, "")
    assert scram.validate_credential(credential) is credential


def test_fresh_salt_each_time() -> None:
    a = scram.make_credential(SHA256, "pw")
    b = scram.make_credential(SHA256, "pw")
    assert a.salt != b.salt
    assert a.stored_key != b.stored_key


def test_credential_keeps_no_password() -> None:
    credential = scram.make_credential(SHA256, "hunter2-unique-password")
    assert b"hunter2-unique-password" not in repr(credential).encode()
    for field in (credential.salt, credential.stored_key, credential.server_key):
        assert b"hunter2" not in field


def test_from_salted_password_equals_make_credential() -> None:
    salt = b"0123456789abcdef"
    made = scram.make_credential(SHA512, "pw", iterations=8192, salt=salt)
    salted = scram.salted_password(SHA512, "pw", salt, 8192)
    imported = scram.credential_from_salted_password(
        SHA512, salt=salt, salted_password=salted, iterations=8192
    )
    assert made == imported
    assert scram.verify_password(imported, "pw")


def test_unicode_password_is_utf8_without_saslprep() -> None:
    # Kafka hashes the password's UTF-8 bytes as they are; so must we.
    credential = scram.make_credential(SHA256, "pässwörd", salt=b"salt")
    salted = hashlib.pbkdf2_hmac("sha256", "pässwörd".encode(), b"salt", 4096)
    assert credential == scram.credential_from_salted_password(
        SHA256, salt=b"salt", salted_password=salted, iterations=4096
    )


@pytest.mark.parametrize("iterations", [0, 1, 4095, 16385, 10**9, -4096])
def test_iterations_out_of_range(iterations: int) -> None:
    with pytest.raises(ValueError, match="iterations"):
        scram.make_credential(SHA256, "pw", iterations=iterations)
    with pytest.raises(ValueError, match="iterations"):
        scram.credential_from_salted_password(
            SHA256, salt=b"s", salted_password=bytes(32), iterations=iterations
        )


def test_iterations_bounds_inclusive() -> None:
    salted = bytes(32)
    for iterations in (scram.MIN_ITERATIONS, scram.MAX_ITERATIONS):
        scram.credential_from_salted_password(
            SHA256, salt=b"s", salted_password=salted, iterations=iterations
        )


def test_iterations_must_be_int() -> None:
    with pytest.raises(ValueError, match="integer"):
        scram.credential_from_salted_password(
            SHA256, salt=b"s", salted_password=bytes(32), iterations=True
        )


@pytest.mark.parametrize("salt", [b"", bytes(1025)])
def test_salt_length(salt: bytes) -> None:
    with pytest.raises(ValueError, match="salt"):
        scram.credential_from_salted_password(
            SHA256, salt=salt, salted_password=bytes(32), iterations=4096
        )


@pytest.mark.parametrize(
    ("mechanism", "length"), [(SHA256, 31), (SHA256, 33), (SHA256, 64), (SHA512, 32), (SHA512, 0)]
)
def test_salted_password_length(mechanism: ScramMechanism, length: int) -> None:
    with pytest.raises(ValueError, match="salted password"):
        scram.credential_from_salted_password(
            mechanism, salt=b"s", salted_password=bytes(length), iterations=4096
        )


def test_unknown_mechanism() -> None:
    with pytest.raises(ValueError, match="mechanism"):
        scram.make_credential(ScramMechanism.UNKNOWN, "pw")


def test_overlong_password_refused() -> None:
    with pytest.raises(ValueError, match="password"):
        scram.make_credential(SHA256, "x" * (scram.MAX_PASSWORD_BYTES + 1))


def test_verify_password_false_on_malformed_credential() -> None:
    good = scram.make_credential(SHA256, "pw")
    bad = ScramCredential(SHA256, good.salt, good.stored_key[:5], good.server_key, 4096)
    assert not scram.verify_password(bad, "pw")
    # An attacker-planted credential with a huge iteration count is not run.
    slow = ScramCredential(SHA256, good.salt, good.stored_key, good.server_key, 10**9)
    assert not scram.verify_password(slow, "pw")
    assert not scram.verify_password(good, "\udcff")  # lone surrogate
    with pytest.raises(ValueError):
        scram.validate_credential(bad)


def test_a_bootstrap_entry_is_what_the_node_config_reads_and_holds_no_password() -> None:
    from raftlog.config_listeners import parse_bootstrap_scram

    mechanism = ScramMechanism.SCRAM_SHA_512
    entry = scram.bootstrap_entry(mechanism, "admin", "s3cret", iterations=8192)
    assert "s3cret" not in entry
    (parsed,) = parse_bootstrap_scram(entry)
    assert (parsed.mechanism, parsed.user, parsed.iterations) == ("SCRAM-SHA-512", "admin", 8192)
    credential = scram.credential_from_salted_password(
        mechanism, salt=parsed.salt, salted_password=parsed.salted_password, iterations=8192
    )
    assert scram.verify_password(credential, "s3cret")
