"""AlterUserScramCredentials on the controller (KIP-554, Kafka's ScramControlManager), sans-IO.

The client sends a salt, an iteration count and the salted password (Hi() of RFC 5802); the
controller derives the stored and server keys and writes only those (UserScramCredential),
so the metadata log never holds anything a client could log in with.
"""

from __future__ import annotations

from raftlog.errors import ErrorCode
from raftlog.metadata import records as r
from raftlog.metadata.controller.elections import Batch
from raftlog.metadata.controller.messages import (
    AlterUserScramCredentials,
    AlterUserScramCredentialsReply,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
    ScramUserResult,
)
from raftlog.metadata.image import MetadataImage
from raftlog.security.acl import ScramMechanism
from raftlog.security.scram import credential_from_salted_password

__all__ = ["MAX_SCRAM_CREDENTIALS", "alter_user_scram_credentials", "check_user_name"]

# The most credentials the cluster holds (every node keeps them all in memory).
MAX_SCRAM_CREDENTIALS = 100_000

Refusal = tuple[ErrorCode, str]


def check_user_name(name: str) -> Refusal | None:
    if not name:
        return ErrorCode.unacceptable_credential, "the user name is empty"
    if len(name) > r.MAX_SCRAM_USER_NAME_CHARS:
        return (
            ErrorCode.unacceptable_credential,
            f"the user name is {len(name)} characters, over {r.MAX_SCRAM_USER_NAME_CHARS}",
        )
    return None


def _mechanism(code: int) -> ScramMechanism | None:
    try:
        mechanism = ScramMechanism(code)
    except ValueError:
        return None
    return None if mechanism is ScramMechanism.UNKNOWN else mechanism


def _check_deletion(image: MetadataImage, deletion: ScramCredentialDeletion) -> Refusal | None:
    mechanism = _mechanism(deletion.mechanism)
    if mechanism is None:
        return ErrorCode.unsupported_sasl_mechanism, f"unknown SCRAM mechanism {deletion.mechanism}"
    if (deletion.name, mechanism) not in image.scram_credentials:
        return (
            ErrorCode.resource_not_found,
            f"user {deletion.name!r} has no {mechanism.sasl_name} credential to delete",
        )
    return None


def _check_upsertion(upsertion: ScramCredentialUpsertion) -> Refusal | None:
    mechanism = _mechanism(upsertion.mechanism)
    if mechanism is None:
        return (
            ErrorCode.unsupported_sasl_mechanism,
            f"unknown SCRAM mechanism {upsertion.mechanism}",
        )
    bad = ErrorCode.unacceptable_credential
    if upsertion.iterations < r.MIN_SCRAM_ITERATIONS:
        return bad, f"too few iterations ({upsertion.iterations} < {r.MIN_SCRAM_ITERATIONS})"
    if upsertion.iterations > r.MAX_SCRAM_ITERATIONS:
        return bad, f"too many iterations ({upsertion.iterations} > {r.MAX_SCRAM_ITERATIONS})"
    if not r.MIN_SCRAM_SALT_BYTES <= len(upsertion.salt) <= r.MAX_SCRAM_SALT_BYTES:
        return bad, (
            f"a salt of {len(upsertion.salt)} bytes; it must be {r.MIN_SCRAM_SALT_BYTES} to "
            f"{r.MAX_SCRAM_SALT_BYTES}"
        )
    want = r.SCRAM_KEY_BYTES[mechanism]
    if len(upsertion.salted_password) != want:
        return bad, (
            f"a salted password of {len(upsertion.salted_password)} bytes; "
            f"{mechanism.sasl_name} gives {want}"
        )
    return None


def alter_user_scram_credentials(
    batch: Batch, req: AlterUserScramCredentials
) -> AlterUserScramCredentialsReply:
    """One result per user, in the order users first appear (deletions, then upsertions).

    A user's changes are all made or none: the first refusal among them is its result. A
    (user, mechanism) named twice in the request, as deletions or upsertions, is refused with
    DUPLICATE_RESOURCE; one user's two mechanisms may change together (KIP-554)."""
    named: dict[tuple[str, int], int] = {}
    for key in [(d.name, d.mechanism) for d in req.deletions] + [
        (u.name, u.mechanism) for u in req.upsertions
    ]:
        named[key] = named.get(key, 0) + 1
    twice = {name for (name, _), times in named.items() if times > 1}
    image = batch.image
    refusals: dict[str, Refusal] = {}
    changes: dict[str, list[r.Record]] = {name: [] for name, _ in named}
    for deletion in req.deletions:
        refusal = _refuse_user(deletion.name, twice) or _check_deletion(image, deletion)
        if refusal is not None:
            refusals.setdefault(deletion.name, refusal)
            continue
        changes[deletion.name].append(
            r.RemoveUserScramCredential(deletion.name, deletion.mechanism)
        )
    for upsertion in req.upsertions:
        refusal = _refuse_user(upsertion.name, twice) or _check_upsertion(upsertion)
        mechanism = _mechanism(upsertion.mechanism)
        if refusal is not None or mechanism is None:  # (None only with a refusal)
            refusals.setdefault(
                upsertion.name, refusal or (ErrorCode.unsupported_sasl_mechanism, "")
            )
            continue
        try:
            credential = credential_from_salted_password(
                mechanism,
                salt=upsertion.salt,
                salted_password=upsertion.salted_password,
                iterations=upsertion.iterations,
            )
        except ValueError as exc:  # checked above; its own checks are the last word
            refusals.setdefault(upsertion.name, (ErrorCode.unacceptable_credential, str(exc)))
            continue
        changes[upsertion.name].append(r.UserScramCredential.of(upsertion.name, credential))
    records: list[r.Record] = []
    count = len(image.scram_credentials)
    for name, user_records in changes.items():
        if name in refusals:
            continue
        added = sum(
            isinstance(rec, r.UserScramCredential)
            and (name, ScramMechanism(rec.mechanism)) not in image.scram_credentials
            for rec in user_records
        )
        removed = sum(isinstance(rec, r.RemoveUserScramCredential) for rec in user_records)
        if added and count + added - removed > MAX_SCRAM_CREDENTIALS:
            refusals[name] = (
                ErrorCode.unacceptable_credential,
                f"the cluster holds the most SCRAM credentials allowed ({MAX_SCRAM_CREDENTIALS})",
            )
            continue
        count += added - removed
        records.extend(user_records)
    batch.add(*records)
    results = []
    for user in changes:
        code, message = refusals.get(user, (ErrorCode.none, ""))
        results.append(ScramUserResult(user, code, message or None))
    return AlterUserScramCredentialsReply(tuple(results))


def _refuse_user(name: str, twice: set[str]) -> Refusal | None:
    if name in twice:
        return (
            ErrorCode.duplicate_resource,
            "a user's credential for one mechanism may be altered only once in a request",
        )
    return check_user_name(name)
