"""Whatever bytes or text arrive, the security cores answer with their own refusal, never a
crash: SASL servers raise only SaslAuthenticationFailed, the rules parser only ValueError."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlog.security import scram
from raftlog.security.acl import ScramCredential, ScramMechanism
from raftlog.security.principal import PrincipalMappingRules, distinguished_name
from raftlog.security.sasl import (
    PlainServer,
    SaslAuthenticationFailed,
    ScramClient,
    ScramServer,
)

SHA256 = ScramMechanism.SCRAM_SHA_256
CREDENTIAL = scram.make_credential(SHA256, "pw", salt=b"fixed-salt")


def lookup(name: str, mechanism: ScramMechanism) -> ScramCredential | None:
    return CREDENTIAL if name == "alice" and mechanism == SHA256 else None


def _gs2(bare: str) -> bytes:
    return ("n,," + bare).encode("utf-8", "replace")


# Bytes that look like SCRAM messages half the time, so the parser gets past its first check.
scramish = st.one_of(
    st.binary(max_size=300),
    st.lists(
        st.tuples(
            st.sampled_from(["n", "r", "c", "p", "m", "a", "y", "e", "v", "s", "i", "", "=="]),
            st.text(max_size=20),
        ),
        max_size=6,
    ).map(lambda parts: _gs2(",".join(f"{k}={v}" for k, v in parts))),
)
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(scramish)
def test_scram_client_first_never_crashes(message: bytes) -> None:
    server = ScramServer(SHA256, lookup)
    try:
        reply = server.step(message)
    except SaslAuthenticationFailed:
        assert not server.complete
        return
    assert reply.startswith(b"r=")
    assert not server.complete


@FAST
@given(scramish)
def test_scram_client_final_never_crashes(message: bytes) -> None:
    server = ScramServer(SHA256, lookup)
    server.step(ScramClient(SHA256, "alice", "pw").first_message())
    with pytest.raises(SaslAuthenticationFailed):
        server.step(message)
    assert not server.complete and server.principal is None


@FAST
@given(st.binary(max_size=300))
def test_scram_client_never_crashes_on_server_bytes(message: bytes) -> None:
    client = ScramClient(SHA256, "alice", "pw", client_nonce="abc")
    try:
        client.step(message)
    except SaslAuthenticationFailed:
        pass


@settings(max_examples=100, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=200),
        st.tuples(st.text(max_size=5), st.text(max_size=10), st.text(max_size=10)).map(
            lambda t: "\x00".join(t).encode("utf-8", "replace")
        ),
    )
)
def test_plain_never_crashes(message: bytes) -> None:
    server = PlainServer(lookup)
    try:
        server.step(message)
    except SaslAuthenticationFailed:
        assert not server.complete
        return
    assert message.endswith(b"alice\x00pw")  # only the real password gets in
    assert server.principal == "User:alice"


rule_text = st.one_of(
    st.text(max_size=60),
    st.lists(
        st.one_of(
            st.just("DEFAULT"),
            st.builds(
                lambda p, r, c: f"RULE:{p}/{r}/{c}",
                st.text(alphabet="^$()[]*.?+\\/,=CN$1{}<>a", max_size=12),
                st.text(alphabet="$1{}\\a/,", max_size=8),
                st.sampled_from(["", "L", "U", "X"]),
            ),
        ),
        max_size=4,
    ).map(", ".join),
)


@settings(max_examples=400, deadline=None)
@given(rule_text, st.text(max_size=30))
def test_rules_parse_and_apply_never_crash(text: str, dn: str) -> None:
    try:
        rules = PrincipalMappingRules.parse(text)
    except ValueError:
        return
    try:
        result = rules.apply(dn)
    except ValueError:  # NoMatchingRule
        return
    assert isinstance(result, str)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(
                st.sampled_from(["commonName", "emailAddress", "serialNumber", "1.2.3", "odd"]),
                st.text(max_size=20),
            ),
            min_size=1,
            max_size=2,
        ).map(tuple),
        max_size=4,
    ).map(tuple)
)
def test_distinguished_name_never_crashes(subject: tuple[tuple[tuple[str, str], ...], ...]) -> None:
    assert isinstance(distinguished_name(subject), str)
