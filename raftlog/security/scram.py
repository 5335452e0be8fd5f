"""SCRAM credentials (RFC 5802, RFC 7677): derive, import and check them.

Why this module: the server must never hold a password, only what RFC 5802 calls the salted,
iterated keys (StoredKey, ServerKey), and those must be derived exactly as Kafka and every
Kafka client derive them, or a user created with `kafka-configs --alter --add-config
SCRAM-SHA-256=[...]` could not log in. Like Kafka, the password's UTF-8 bytes are used as is
(no SASLprep). Iteration counts are held to Kafka's bounds: fewer is weak, more lets whoever
sets a credential burn the broker's CPU. Only stdlib hashlib/hmac/secrets are used.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from raftlog.security.acl import ScramCredential, ScramMechanism

# Kafka's bounds for SCRAM-SHA-256/512 (ScramMechanism.minIterations/maxIterations).
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
# A salt we make: 32 random bytes. Salts handed in (KIP-554) may be shorter, never empty.
DEFAULT_SALT_BYTES = 32
MIN_SALT_BYTES = 1
MAX_SALT_BYTES = 1024
# Passwords are hashed by whoever sets them, so bound them to keep PBKDF2 input sane.
MAX_PASSWORD_BYTES = 1024

MECHANISMS = (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)


def digest_size(mechanism: ScramMechanism) -> int:
    """Bytes of the mechanism's hash (32 for SHA-256, 64 for SHA-512)."""
    _check_mechanism(mechanism)
    return hashlib.new(mechanism.hash_name).digest_size


def hmac_digest(mechanism: ScramMechanism, key: bytes, message: bytes) -> bytes:
    """RFC 5802's HMAC(key, str) with the mechanism's hash."""
    return hmac.digest(key, message, mechanism.hash_name)


def hash_digest(mechanism: ScramMechanism, data: bytes) -> bytes:
    """RFC 5802's H(str) with the mechanism's hash."""
    return hashlib.new(mechanism.hash_name, data).digest()


def salted_password(
    mechanism: ScramMechanism, password: str, salt: bytes, iterations: int
) -> bytes:
    """RFC 5802's SaltedPassword = Hi(password, salt, i), which is PBKDF2-HMAC."""
    _check_mechanism(mechanism)
    _check_iterations(iterations)
    _check_salt(salt)
    password_bytes = _password_bytes(password)
    return hashlib.pbkdf2_hmac(mechanism.hash_name, password_bytes, salt, iterations)


def client_key(mechanism: ScramMechanism, salted: bytes) -> bytes:
    return hmac_digest(mechanism, salted, b"Client Key")


def server_key(mechanism: ScramMechanism, salted: bytes) -> bytes:
    return hmac_digest(mechanism, salted, b"Server Key")


def make_credential(
    mechanism: ScramMechanism,
    password: str,
    *,
    iterations: int = MIN_ITERATIONS,
    salt: bytes | None = None,
) -> ScramCredential:
    """A new credential for `password`, with a fresh random salt unless one is given."""
    if salt is None:
        salt = secrets.token_bytes(DEFAULT_SALT_BYTES)
    salted = salted_password(mechanism, password, salt, iterations)
    return credential_from_salted_password(
        mechanism, salt=salt, salted_password=salted, iterations=iterations
    )


def credential_from_salted_password(
    mechanism: ScramMechanism, *, salt: bytes, salted_password: bytes, iterations: int
) -> ScramCredential:
    """The credential for an already salted password, as KIP-554's
    AlterUserScramCredentials carries it (the client salts; the password never travels).
    Raises ValueError saying which field is out of range."""
    _check_mechanism(mechanism)
    _check_iterations(iterations)
    _check_salt(salt)
    if not isinstance(salted_password, bytes):
        raise ValueError("salted password must be bytes")
    size = digest_size(mechanism)
    if len(salted_password) != size:
        raise ValueError(
            f"salted password for {mechanism.sasl_name} must be {size} bytes, "
            f"got {len(salted_password)}"
        )
    return ScramCredential(
        mechanism=mechanism,
        salt=bytes(salt),
        stored_key=hash_digest(mechanism, client_key(mechanism, salted_password)),
        server_key=server_key(mechanism, salted_password),
        iterations=iterations,
    )


def validate_credential(credential: ScramCredential) -> ScramCredential:
    """Return `credential` if every field is in range, else raise ValueError. A credential
    read back from metadata is checked before a login relies on it."""
    _check_mechanism(credential.mechanism)
    _check_iterations(credential.iterations)
    _check_salt(credential.salt)
    size = digest_size(credential.mechanism)
    for name, key in (("stored key", credential.stored_key), ("server key", credential.server_key)):
        if not isinstance(key, bytes) or len(key) != size:
            raise ValueError(f"{name} for {credential.mechanism.sasl_name} must be {size} bytes")
    return credential


def verify_password(credential: ScramCredential, password: str) -> bool:
    """True if `password` is the one `credential` was made from. Costs one PBKDF2 run;
    the final comparison is constant time. A malformed credential or password is False."""
    try:
        validate_credential(credential)
        salted = salted_password(
            credential.mechanism, password, credential.salt, credential.iterations
        )
    except ValueError:
        return False
    candidate = hash_digest(credential.mechanism, client_key(credential.mechanism, salted))
    return hmac.compare_digest(candidate, credential.stored_key)


def _check_mechanism(mechanism: ScramMechanism) -> None:
    if mechanism not in MECHANISMS:
        raise ValueError(f"unsupported SCRAM mechanism {mechanism!r}")


def _check_iterations(iterations: int) -> None:
    if isinstance(iterations, bool) or not isinstance(iterations, int):
        raise ValueError(f"iterations must be an integer, got {type(iterations).__name__}")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(
            f"iterations must be in [{MIN_ITERATIONS}, {MAX_ITERATIONS}], got {iterations}"
        )


def _check_salt(salt: bytes) -> None:
    if not isinstance(salt, bytes):
        raise ValueError("salt must be bytes")
    if not MIN_SALT_BYTES <= len(salt) <= MAX_SALT_BYTES:
        raise ValueError(f"salt must be {MIN_SALT_BYTES}..{MAX_SALT_BYTES} bytes, got {len(salt)}")


def _password_bytes(password: str) -> bytes:
    if not isinstance(password, str):
        raise ValueError("password must be a str")
    try:
        encoded = password.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates
        raise ValueError("password is not valid Unicode") from exc
    if len(encoded) > MAX_PASSWORD_BYTES:
        raise ValueError(f"password is longer than {MAX_PASSWORD_BYTES} bytes")
    return encoded


def bootstrap_entry(mechanism: ScramMechanism, user: str, password: str, *, iterations: int) -> str:
    """One `bootstrap_scram_credentials` entry in kafka-storage format --add-scram's salted
    syntax, `SCRAM-SHA-512=[name=admin,iterations=8192,salt="...",saltedpassword="..."]`,
    with a fresh salt: what a node config may hold instead of the password."""
    salt = secrets.token_bytes(DEFAULT_SALT_BYTES)
    salted = salted_password(mechanism, password, salt, iterations)
    return (
        f"{mechanism.sasl_name}=[name={user},iterations={iterations},"
        f'salt="{base64.b64encode(salt).decode()}",'
        f'saltedpassword="{base64.b64encode(salted).decode()}"]'
    )
