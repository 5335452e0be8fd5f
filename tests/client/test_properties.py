"""Client properties files: the keys kcat, confluent-kafka and Kafka's tools share, and what
a hostile or careless file gets (a one-line error naming the key, never a traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlog.client.properties import (
    MAX_PROPERTIES_FILE_BYTES,
    MAX_VALUE_CHARS,
    PLAINTEXT,
    ClientPropertiesError,
    ClientSecurity,
    SecurityProtocol,
    load_client_properties,
    parse_client_properties,
    read_properties_text,
)


def parse(text: str) -> ClientSecurity:
    return parse_client_properties(read_properties_text(text, source="t"), source="t").security


def test_librdkafka_style_file(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked until TLS is set up\n")
    path = tmp_path / "client.properties"
    path.write_text(
        "# written by raftlog cluster up --secure\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.username=admin\n"
        "sasl.password=s3cr=t with spaces\n"
        f"ssl.ca.location={ca}\n"
        "bootstrap.servers=127.0.0.1:9092\n"
        "client.id=etl\n"
        "linger.ms=5\n"
        "! a Java-style comment\n"
    )
    loaded = load_client_properties(path)
    assert loaded.security == ClientSecurity(
        protocol=SecurityProtocol.SASL_SSL,
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="admin",
        sasl_password="s3cr=t with spaces",
        ssl_ca_location=str(ca),
    )
    assert (loaded.bootstrap_servers, loaded.client_id) == ("127.0.0.1:9092", "etl")
    assert loaded.ignored_keys == ("linger.ms",)
    assert "s3cr" not in repr(loaded.security)


def test_java_jaas_config_and_pem_truststore() -> None:
    security = parse(
        "security.protocol = SASL_SSL\n"
        "sasl.mechanism: SCRAM-SHA-256\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        '    username="alice" password="p\\"w;d";\n'
        "ssl.truststore.type=PEM\n"
        "ssl.truststore.location=/etc/ca.pem\n"
        "ssl.endpoint.identification.algorithm=\n"
    )
    assert security.sasl_mechanism == "SCRAM-SHA-256"
    assert (security.sasl_username, security.sasl_password) == ("alice", 'p"w;d')
    assert security.ssl_ca_location == "/etc/ca.pem"
    assert security.ssl_check_hostname is False


def test_plain_login_module_implies_plain() -> None:
    security = parse(
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="bob" password="x";\n'
    )
    assert (security.sasl_mechanism, security.sasl_username) == ("PLAIN", "bob")


def test_librdkafka_plural_mechanisms_and_keystore() -> None:
    security = parse(
        "security.protocol=ssl\n"
        "ssl.keystore.type=PEM\n"
        "ssl.keystore.location=/k/client.pem\n"
        "ssl.key.password=kp\n"
    )
    assert security.protocol is SecurityProtocol.SSL
    assert security.ssl_certificate_location == security.ssl_key_location == "/k/client.pem"
    assert security.ssl_key_password == "kp"
    plural = parse("security.protocol=SASL_SSL\nsasl.mechanisms=PLAIN\nsasl.username=u\n"
                   "sasl.password=p\n")  # fmt: skip
    assert plural.sasl_mechanism == "PLAIN"


def test_empty_file_is_plaintext() -> None:
    assert parse("") == PLAINTEXT
    assert parse("# nothing\n\n") == PLAINTEXT


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("security.protocol=TLS\n", "t: security.protocol must be one of PLAINTEXT, SSL, "),
        ("security.protocol=SASL_SSL\n", "needs sasl.mechanism"),
        ("security.protocol=SASL_SSL\nsasl.mechanism=GSSAPI\n", "GSSAPI is not supported"),
        ("security.protocol=SASL_SSL\nsasl.mechanism=MD5\n", "sasl.mechanism must be one of"),
        ("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n", "needs sasl.username"),
        (
            "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=u\n",
            "needs sasl.password",
        ),
        ("sasl.mechanism=PLAIN\nsasl.mechanisms=SCRAM-SHA-256\n", "disagree"),
        ("ssl.truststore.location=/x.jks\n", "ssl.truststore.type must be PEM"),
        ("ssl.endpoint.identification.algorithm=ldap\n", "must be https or none"),
        ("enable.ssl.certificate.verification=maybe\n", "must be true or false"),
        ("ssl.certificate.location=/c.pem\n", "go together"),
        ("sasl.jaas.config=com.example.Custom required;\n", "raftlog reads PlainLoginModule"),
        (
            "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule "
            'required username="u"\n',
            "ends without ';'",
        ),
        (
            "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule sometimes;\n",
            "has flag 'sometimes'",
        ),
        (
            "sasl.mechanism=PLAIN\nsasl.jaas.config=org.apache.kafka.common.security.scram."
            'ScramLoginModule required username="u" password="p";\n',
            "uses ScramLoginModule but sasl.mechanism=PLAIN",
        ),
        ("just words\n", "t:1: expected key=value"),
        ("=value\n", "expected key=value"),
        ("a=b\x00c\n", "t:1: a NUL character"),
    ],
)
def test_bad_values_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ClientPropertiesError) as caught:
        parse(text)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_absurd_sizes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ClientPropertiesError, match="longer than"):
        parse("sasl.password=" + "p" * (MAX_VALUE_CHARS + 1) + "\n")
    with pytest.raises(ClientPropertiesError, match=r"sasl\.username is longer than 1024"):
        parse("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.password=p\n"
              "sasl.username=" + "u" * 2000 + "\n")  # fmt: skip
    with pytest.raises(ClientPropertiesError, match="more than 10000 lines"):
        parse("#\n" * 10_001)
    big = tmp_path / "big.properties"
    big.write_bytes(b"#" * (MAX_PROPERTIES_FILE_BYTES + 1))
    with pytest.raises(ClientPropertiesError, match="larger than 1048576 bytes"):
        load_client_properties(big)
    binary = tmp_path / "binary.properties"
    binary.write_bytes(b"security.protocol=\xff\xfe\n")
    with pytest.raises(ClientPropertiesError, match="is not UTF-8 text"):
        load_client_properties(binary)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ClientPropertiesError, match=r"nope.properties does not exist"):
        load_client_properties(tmp_path / "nope.properties")
    with pytest.raises(ClientPropertiesError, match="is a directory"):
        load_client_properties(tmp_path)
    path = tmp_path / "c.properties"
    path.write_text(f"security.protocol=SSL\nssl.ca.location={tmp_path / 'gone.pem'}\n")
    with pytest.raises(ClientPropertiesError, match=r"ssl.ca.location .*gone.pem is not a"):
        load_client_properties(path)


def test_last_occurrence_wins_and_continuations_join() -> None:
    values = read_properties_text("a=1\na=2\nb=x\\\n  y\nc=ends\\\\\n", source="t")
    assert values == {"a": "2", "b": "xy", "c": "ends\\\\"}
