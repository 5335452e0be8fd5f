"""Spark's Kafka-source security options (kafka.security.protocol, kafka.sasl.*,
kafka.ssl.*) map onto the client's ClientSecurity; no Spark session needed."""

from __future__ import annotations

import pickle

import pytest

from raftlog.client.properties import PLAINTEXT, ClientSecurity, SecurityProtocol
from raftlog.spark.options import OptionError, parse_options

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "events"}
SCRAM_JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    'username="etl" password="s3cret";'
)


def test_no_security_options_is_plaintext() -> None:
    assert parse_options(BASE).security == PLAINTEXT


def test_java_style_scram_over_tls() -> None:
    options = parse_options(
        {
            **BASE,
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.jaas.config": SCRAM_JAAS,
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.truststore.location": "/etc/raftlog/ca.pem",
            # A PEM truststore has no password; Spark jobs written for JKS often set one.
            "kafka.ssl.truststore.password": "changeit",
        }
    )
    assert options.security == ClientSecurity(
        protocol=SecurityProtocol.SASL_SSL,
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="etl",
        sasl_password="s3cret",
        ssl_ca_location="/etc/raftlog/ca.pem",
    )
    # ReadOptions travel to executors pickled; the password goes along, but not in repr.
    assert pickle.loads(pickle.dumps(options)) == options
    assert "s3cret" not in repr(options)


def test_plain_login_module_and_pem_locations() -> None:
    security = parse_options(
        {
            **BASE,
            "Kafka.Security.Protocol": "SASL_SSL",  # Spark's options are case-insensitive
            "kafka.sasl.jaas.config": (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                'username="u" password="p";'
            ),
            "kafka.ssl.ca.location": "/ca.pem",
            "kafka.ssl.certificate.location": "/client.pem",
            "kafka.ssl.key.location": "/client.key",
            "kafka.ssl.endpoint.identification.algorithm": "",
        }
    ).security
    assert (security.sasl_mechanism, security.sasl_username) == ("PLAIN", "u")
    assert security.ssl_certificate_location == "/client.pem"
    assert security.ssl_check_hostname is False


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"kafka.security.protocol": "SASL_SSL"},
         "security.protocol=SASL_SSL needs kafka.sasl.mechanism"),
        ({"kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "GSSAPI"},
         "options: kafka.sasl.mechanism GSSAPI is not supported"),
        ({"kafka.security.protocol": "SSL", "kafka.ssl.truststore.location": "/t.jks"},
         "kafka.ssl.truststore.type must be PEM"),
        ({"kafka.sasl.jaas.config": "com.example.Kerberos required;"},
         "kafka.sasl.jaas.config uses 'com.example.Kerberos'"),
        ({"kafka.ssl.cipher.suites": "X"},
         "option kafka.ssl.cipher.suites is not supported by the raftlog source"),
        ({"kafka.security.protocol": "TLS"}, "kafka.security.protocol must be one of"),
    ],
)  # fmt: skip
def test_bad_security_options_name_the_option(extra: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError) as caught:
        parse_options({**BASE, **extra})
    assert message in str(caught.value)
