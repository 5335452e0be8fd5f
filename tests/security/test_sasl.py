"""SASL PLAIN and SCRAM: RFC 7677's vector, client against server, and a hostile client."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from raftlog.security import sasl, scram
from raftlog.security.acl import ScramCredential, ScramMechanism
from raftlog.security.sasl import (
    PlainClient,
    PlainServer,
    SaslAuthenticationFailed,
    ScramClient,
    ScramServer,
    UnsupportedSaslMechanism,
)

SHA256 = ScramMechanism.SCRAM_SHA_256
SHA512 = ScramMechanism.SCRAM_SHA_512

# RFC 7677 section 3.
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


class Users:
    """A credential store: username -> {mechanism: credential}, counting lookups."""

    def __init__(self) -> None:
        self.credentials: dict[str, dict[ScramMechanism, ScramCredential]] = {}
        self.lookups: list[tuple[str, ScramMechanism]] = []

    def add(self, name: str, password: str, *mechanisms: ScramMechanism) -> None:
        for mechanism in mechanisms or (SHA256, SHA512):
            self.credentials.setdefault(name, {})[mechanism] = scram.make_credential(
                mechanism, password
            )

    def __call__(self, name: str, mechanism: ScramMechanism) -> ScramCredential | None:
        self.lookups.append((name, mechanism))
        return self.credentials.get(name, {}).get(mechanism)


@pytest.fixture
def users() -> Users:
    store = Users()
    store.add("alice", "alice-secret")
    store.add("bob", "bob-secret", SHA256)
    store.add("odd,name=x", "pw")
    return store


def rfc_users() -> Users:
    store = Users()
    store.credentials["user"] = {
        SHA256: scram.make_credential(SHA256, "pencil", salt=RFC_SALT, iterations=4096)
    }
    return store


# --- RFC 7677 vector: each side checked on its own against the published bytes -----------


def test_rfc7677_server() -> None:
    server = ScramServer(SHA256, rfc_users(), server_nonce=RFC_SERVER_NONCE)
    assert server.mechanism == "SCRAM-SHA-256"
    assert server.step(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert not server.complete and server.principal is None
    assert server.step(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.complete
    assert server.principal == "User:user"


def test_rfc7677_client() -> None:
    client = ScramClient(SHA256, "user", "pencil", client_nonce=RFC_CLIENT_NONCE)
    assert client.first_message() == RFC_CLIENT_FIRST
    assert client.step(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    assert client.step(RFC_SERVER_FINAL) is None
    assert client.complete


def test_rfc7677_keys_by_hand() -> None:
    # An independent derivation of the proof with hashlib/hmac only.
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", RFC_SALT, 4096)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    auth = RFC_CLIENT_FIRST[3:] + b"," + RFC_SERVER_FIRST + b"," + RFC_CLIENT_FINAL.split(b",p=")[0]
    signature = hmac.digest(stored_key, auth, "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    assert RFC_CLIENT_FINAL.endswith(base64.b64encode(proof))
    credential = scram.make_credential(SHA256, "pencil", salt=RFC_SALT)
    assert credential.stored_key == stored_key


def test_rfc7677_server_refuses_wrong_password() -> None:
    store = Users()
    store.credentials["user"] = {SHA256: scram.make_credential(SHA256, "pencil2", salt=RFC_SALT)}
    server = ScramServer(SHA256, store, server_nonce=RFC_SERVER_NONCE)
    server.step(RFC_CLIENT_FIRST)
    with pytest.raises(SaslAuthenticationFailed) as info:
        server.step(RFC_CLIENT_FINAL)
    assert str(info.value) == sasl.GENERIC_FAILURE
    assert "wrong proof" in info.value.log_detail
    assert not server.complete and server.principal is None


# --- client against server ------------------------------------------------------------------


def run_scram(server: sasl.SaslServer, client: ScramClient) -> None:
    server_first = server.step(client.first_message())
    client_final = client.step(server_first)
    assert client_final is not None
    server_final = server.step(client_final)
    assert client.step(server_final) is None


@pytest.mark.parametrize("mechanism", [SHA256, SHA512])
def test_scram_round_trip(users: Users, mechanism: ScramMechanism) -> None:
    server = sasl.new_server(mechanism.sasl_name, users, sasl.SUPPORTED_MECHANISMS)
    client = ScramClient(mechanism, "alice", "alice-secret")
    run_scram(server, client)
    assert server.complete and client.complete
    assert server.principal == "User:alice"


def test_scram_escaped_username(users: Users) -> None:
    server = ScramServer(SHA256, users)
    client = ScramClient(SHA256, "odd,name=x", "pw")
    assert b"n=odd=2Cname=3Dx," in client.first_message()
    run_scram(server, client)
    assert server.principal == "User:odd,name=x"


@pytest.mark.parametrize(
    ("username", "password"), [("alice", "wrong"), ("nobody", "alice-secret"), ("bob", "")]
)
def test_scram_bad_credentials_fail_at_final_step(
    users: Users, username: str, password: str
) -> None:
    mechanism = SHA512 if username == "bob" else SHA256  # bob has no SHA-512 credential
    server = ScramServer(mechanism, users)
    client = ScramClient(mechanism, username, password)
    client_final = client.step(server.step(client.first_message()))
    assert client_final is not None
    with pytest.raises(SaslAuthenticationFailed) as info:
        server.step(client_final)
    assert str(info.value) == sasl.GENERIC_FAILURE
    assert info.value.log_detail
    assert not server.complete and server.principal is None
    with pytest.raises(SaslAuthenticationFailed):  # the exchange is over
        server.step(client_final)


def test_unknown_user_indistinguishable_in_server_first(users: Users) -> None:
    """An unknown user gets a server-first of the same shape, with a salt that is stable
    across attempts (a fresh salt each time would reveal that the user is fake)."""

    def server_first(name: str) -> dict[str, str]:
        server = ScramServer(SHA256, users)
        reply = server.step(f"n,,n={name},r=abcdef".encode()).decode()
        return dict(part.split("=", 1) for part in reply.split(","))  # type: ignore[misc]

    known, unknown1, unknown2 = server_first("alice"), server_first("ghost"), server_first("ghost")
    assert known.keys() == unknown1.keys() == {"r", "s", "i"}
    assert unknown1["s"] == unknown2["s"]
    assert len(base64.b64decode(unknown1["s"])) == len(base64.b64decode(known["s"]))
    assert unknown1["i"] == known["i"] == "4096"
    assert unknown1["r"] != unknown2["r"]  # nonces stay random
    assert server_first("ghost2")["s"] != unknown1["s"]


def test_fake_credential_depends_on_the_server_secret(users: Users) -> None:
    a = ScramServer(SHA256, users, fake_secret=b"one").step(b"n,,n=ghost,r=x")
    b = ScramServer(SHA256, users, fake_secret=b"two").step(b"n,,n=ghost,r=x")
    salt = lambda reply: reply.split(b",")[1]  # noqa: E731
    assert salt(a) != salt(b)


def test_client_refuses_forged_server_signature(users: Users) -> None:
    server = ScramServer(SHA256, users)
    client = ScramClient(SHA256, "alice", "alice-secret")
    client_final = client.step(server.step(client.first_message()))
    assert client_final is not None
    server.step(client_final)
    forged = b"v=" + base64.b64encode(bytes(32))
    with pytest.raises(SaslAuthenticationFailed) as info:
        client.step(forged)
    assert "signature" in info.value.log_detail
    assert not client.complete


def test_client_refuses_impostor_server() -> None:
    """A server that does not hold the credential cannot produce a valid v=, even if it
    relays the client's messages: the client sees the mismatch."""
    impostor_users = Users()
    impostor_users.add("alice", "something-else")
    impostor = ScramServer(SHA256, impostor_users)
    client = ScramClient(SHA256, "alice", "alice-secret")
    client_final = client.step(impostor.step(client.first_message()))
    assert client_final is not None
    with pytest.raises(SaslAuthenticationFailed):
        impostor.step(client_final)


@pytest.mark.parametrize(
    "server_first",
    [
        b"r=zzzz,s=c2FsdA==,i=4096",  # nonce does not extend the client's
        b"r=abc,s=c2FsdA==,i=4096",  # nonce not extended at all
        b"r=abcdef,s=c2FsdA==,i=1",  # too few iterations
        b"r=abcdef,s=c2FsdA==,i=99999999",  # too many: a CPU bomb
        b"r=abcdef,s=c2FsdA==,i=-1",
        b"r=abcdef,s=!!!,i=4096",
        b"r=abcdef,s=,i=4096",
        b"e=other-error",
        b"r=abcdef,i=4096,s=c2FsdA==",
        b"garbage",
        b"\xff",
    ],
)
def test_client_refuses_bad_server_first(server_first: bytes) -> None:
    client = ScramClient(SHA256, "alice", "pw", client_nonce="abc")
    with pytest.raises(SaslAuthenticationFailed):
        client.step(server_first)


def test_client_refuses_server_error() -> None:
    server = ScramServer(SHA256, Users())
    client = ScramClient(SHA256, "alice", "pw")
    client.step(server.step(client.first_message()))
    with pytest.raises(SaslAuthenticationFailed, match="could not be verified"):
        client.step(b"e=invalid-proof")


# --- hostile client-first -------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        b"y,,n=alice,r=abc",  # client supports channel binding
        b"p=tls-unique,,n=alice,r=abc",  # channel binding asked for
        b"n,a=bob,n=alice,r=abc",  # authzid
        b"n,,m=ext,n=alice,r=abc",  # mandatory extension
        b"n,,n=alice,r=abc,tokenauth=true",  # Kafka delegation tokens: not supported
        b"n,,n=alice,r=abc,x=1",
        b"n,,r=abc,n=alice",
        b"n,,n=alice",
        b"n,,n=,r=abc",
        b"n,,n=alice,r=",
        b"n,,n=al=2Xice,r=abc",  # bad escape
        b"n,,n=alice=,r=abc",
        b"n,,n=al,ice,r=abc",  # unescaped comma
        b"n,,n=alice,r=ab\x7fc",  # nonce not printable
        b"n,,n=alice,r=ab c",
        b"n,,n=al\x00ice,r=abc",
        b"n,,n=\xff\xfe,r=abc",  # not UTF-8
        b"n,,n=" + b"a" * 256 + b",r=abc",  # user too long
        b"n,,n=alice,r=" + b"a" * 257,  # nonce too long
        b"n,,n=alice,r=abc" + b"," * 5000,  # oversized
        b"",
        b"n,,",
        b"n,,,",
        b"n,,==,r=abc",
    ],
)
def test_server_refuses_bad_client_first(users: Users, message: bytes) -> None:
    server = ScramServer(SHA256, users)
    with pytest.raises(SaslAuthenticationFailed) as info:
        server.step(message)
    assert str(info.value) == sasl.GENERIC_FAILURE
    assert not server.complete
    with pytest.raises(SaslAuthenticationFailed):  # over: no retry on the same exchange
        server.step(b"n,,n=alice,r=abc")


def good_final_for(server: ScramServer, client: ScramClient) -> bytes:
    final = client.step(server.step(client.first_message()))
    assert final is not None
    return final


def _flip_proof_bit(final: bytes, index: int) -> bytes:
    head, proof = final.split(b",p=")
    raw = bytearray(base64.b64decode(proof))
    raw[index] ^= 0x01
    return head + b",p=" + base64.b64encode(bytes(raw))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda f: f.replace(b"c=biws", b"c=eSws"),  # claims channel binding
        lambda f: f.replace(b"c=biws", b"c=bixx"),
        lambda f: f.replace(b",r=", b",r=X"),  # nonce changed
        lambda f: f.split(b",p=")[0] + b",p=AAAA",  # proof of the wrong length
        lambda f: f.split(b",p=")[0] + b",p=!!!!",  # not base64
        lambda f: f.split(b",p=")[0],  # no proof
        lambda f: f.replace(b",p=", b",x=1,p="),  # extension
        lambda f: b"r=" + f,
        lambda f: f + b",p=AAAA",  # two proofs
        lambda f: _flip_proof_bit(f, 0),
        lambda f: _flip_proof_bit(f, 31),
        lambda f: f[:-2] + bytes([f[-2] ^ 1]) + b"=",  # non-canonical base64 (same bytes)
        lambda f: f + b"\x00",
        lambda f: f + b"x" * 5000,
    ],
)
def test_server_refuses_bad_client_final(users: Users, mutate: object) -> None:
    server = ScramServer(SHA256, users)
    client = ScramClient(SHA256, "alice", "alice-secret")
    final = good_final_for(server, client)
    assert callable(mutate)
    with pytest.raises(SaslAuthenticationFailed) as info:
        server.step(mutate(final))
    assert str(info.value) == sasl.GENERIC_FAILURE
    assert not server.complete and server.principal is None


def test_server_refuses_replayed_final(users: Users) -> None:
    """A recorded client-final does not work against a new server nonce."""
    first = ScramServer(SHA256, users)
    client = ScramClient(SHA256, "alice", "alice-secret", client_nonce="fixed")
    recorded = good_final_for(first, client)
    second = ScramServer(SHA256, users)
    second.step(client.first_message())
    with pytest.raises(SaslAuthenticationFailed, match="invalid credentials"):
        second.step(recorded)


def test_server_ignores_malformed_stored_credential() -> None:
    store = Users()
    good = scram.make_credential(SHA256, "pw")
    store.credentials["eve"] = {
        SHA256: ScramCredential(SHA256, good.salt, good.stored_key, good.server_key, 10**9)
    }
    server = ScramServer(SHA256, store)
    client = ScramClient(SHA256, "eve", "pw")
    reply = server.step(client.first_message())
    assert b"i=4096" in reply  # treated as unknown, not a billion iterations
    final = client.step(reply)
    assert final is not None
    with pytest.raises(SaslAuthenticationFailed) as info:
        server.step(final)
    assert "unknown user" in info.value.log_detail


def test_server_ignores_credential_of_other_mechanism() -> None:
    store = Users()
    store.credentials["eve"] = {SHA256: scram.make_credential(SHA512, "pw")}
    server = ScramServer(SHA256, store)
    client = ScramClient(SHA256, "eve", "pw")
    final = good_final_for(server, client)
    with pytest.raises(SaslAuthenticationFailed, match="invalid credentials") as info:
        server.step(final)
    assert "unknown user" in info.value.log_detail


# --- PLAIN ----------------------------------------------------------------------------------


def test_plain_round_trip(users: Users) -> None:
    server = sasl.new_server("PLAIN", users, ["PLAIN"])
    client = PlainClient("alice", "alice-secret")
    assert client.first_message() == b"\x00alice\x00alice-secret"
    assert server.step(client.first_message()) == b""
    assert client.step(b"") is None
    assert server.complete and client.complete
    assert server.principal == "User:alice"
    # SHA-512 is tried first.
    assert users.lookups[0] == ("alice", SHA512)


def test_plain_falls_back_to_sha256(users: Users) -> None:
    server = PlainServer(users)
    server.step(b"\x00bob\x00bob-secret")
    assert server.principal == "User:bob"


def test_plain_authzid_equal_to_user(users: Users) -> None:
    server = PlainServer(users)
    server.step(b"alice\x00alice\x00alice-secret")
    assert server.principal == "User:alice"


@pytest.mark.parametrize(
    "message",
    [
        b"\x00alice\x00wrong",
        b"\x00nobody\x00alice-secret",
        b"bob\x00alice\x00alice-secret",  # act as someone else
        b"\x00alice\x00alice-secret\x00",
        b"\x00alice",
        b"alice\x00alice-secret",
        b"\x00\x00alice-secret",
        b"\x00alice\x00",
        b"\x00alice\x00alice-secret\xff",
        b"\x00" + b"a" * 256 + b"\x00pw",
        b"\x00alice\x00" + b"p" * 1025,
        b"\x00alice\x00" + b"p" * 5000,
        b"",
    ],
)
def test_plain_refuses(users: Users, message: bytes) -> None:
    server = PlainServer(users)
    with pytest.raises(SaslAuthenticationFailed) as info:
        server.step(message)
    assert str(info.value) == sasl.GENERIC_FAILURE
    assert not server.complete and server.principal is None


def test_plain_exchange_is_single_use(users: Users) -> None:
    server = PlainServer(users)
    server.step(b"\x00alice\x00alice-secret")
    with pytest.raises(SaslAuthenticationFailed):
        server.step(b"\x00alice\x00alice-secret")
    failed = PlainServer(users)
    with pytest.raises(SaslAuthenticationFailed):
        failed.step(b"\x00alice\x00wrong")
    with pytest.raises(SaslAuthenticationFailed):  # no second guess on the same exchange
        failed.step(b"\x00alice\x00alice-secret")
    assert not failed.complete


def test_plain_unknown_and_wrong_password_say_the_same(users: Users) -> None:
    messages = []
    for message in (b"\x00nobody\x00x", b"\x00alice\x00x"):
        with pytest.raises(SaslAuthenticationFailed) as info:
            PlainServer(users).step(message)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def test_plain_client_validates() -> None:
    with pytest.raises(ValueError):
        PlainClient("a\x00b", "pw")
    with pytest.raises(ValueError):
        PlainClient("a", "p" * 1025)
    client = PlainClient("a", "b")
    with pytest.raises(SaslAuthenticationFailed):
        client.step(b"unexpected")


# --- choosing a mechanism -------------------------------------------------------------------


def test_new_server_refuses_unsupported_or_disabled(users: Users) -> None:
    for name in ("GSSAPI", "OAUTHBEARER", "plain", "SCRAM-SHA-1", ""):
        with pytest.raises(UnsupportedSaslMechanism):
            sasl.new_server(name, users, [*sasl.SUPPORTED_MECHANISMS, name])
    with pytest.raises(UnsupportedSaslMechanism):
        sasl.new_server("PLAIN", users, ["SCRAM-SHA-256"])
    assert isinstance(sasl.new_server("SCRAM-SHA-512", users, ["SCRAM-SHA-512"]), ScramServer)


def test_scram_client_validates() -> None:
    with pytest.raises(ValueError):
        ScramClient(ScramMechanism.UNKNOWN, "a", "b")
    with pytest.raises(ValueError):
        ScramClient(SHA256, "", "b")
    with pytest.raises(ValueError):
        ScramClient(SHA256, "a", "b", client_nonce="a,b")
    with pytest.raises(ValueError):
        ScramServer(SHA256, Users(), server_nonce="x y")


# --- an independent client: kafka-python's SCRAM ---------------------------------------------


@pytest.mark.parametrize("mechanism", [SHA256, SHA512])
def test_kafka_python_scram_client_against_our_server(
    users: Users, mechanism: ScramMechanism
) -> None:
    kafka_scram = pytest.importorskip("kafka.net.sasl.scram")
    client = kafka_scram.ScramClient("alice", "alice-secret", mechanism.sasl_name)
    server = ScramServer(mechanism, users)
    client.process_server_first_message(server.step(client.first_message()))
    client.process_server_final_message(server.step(client.final_message()))
    assert server.principal == "User:alice"

    wrong = kafka_scram.ScramClient("alice", "not-it", mechanism.sasl_name)
    server = ScramServer(mechanism, users)
    wrong.process_server_first_message(server.step(wrong.first_message()))
    with pytest.raises(SaslAuthenticationFailed):
        server.step(wrong.final_message())


def _librdkafka_2_0_final(nonce_sent: str, combined: str) -> bytes:
    """The client-final librdkafka 2.0 sends: its own nonce again before the combined one,
    with a proof computed over the message as sent (RFC 7677's user and password)."""
    salted = scram.salted_password(SHA256, "pencil", RFC_SALT, 4096)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_first = f"r={combined},s={base64.b64encode(RFC_SALT).decode()},i=4096"
    without_proof = f"c=biws,r={nonce_sent}"
    auth = f"n=user,r={RFC_CLIENT_NONCE},{server_first},{without_proof}".encode()
    signature = hmac.digest(stored_key, auth, "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def test_a_final_nonce_ending_with_the_combined_one_is_accepted_as_kafka_does() -> None:
    store = Users()
    store.credentials["user"] = {SHA256: scram.make_credential(SHA256, "pencil", salt=RFC_SALT)}
    combined = RFC_CLIENT_NONCE + RFC_SERVER_NONCE
    server = ScramServer(SHA256, store, server_nonce=RFC_SERVER_NONCE)
    server.step(RFC_CLIENT_FIRST)
    server.step(_librdkafka_2_0_final(RFC_CLIENT_NONCE + combined, combined))
    assert server.complete and server.principal == "User:user"
    for sent in (combined[:-1] + "x", "x" * 3 * len(combined)):
        server = ScramServer(SHA256, store, server_nonce=RFC_SERVER_NONCE)
        server.step(RFC_CLIENT_FIRST)
        with pytest.raises(SaslAuthenticationFailed) as info:
            server.step(_librdkafka_2_0_final(sent, combined))
        assert "nonce does not match" in info.value.log_detail
