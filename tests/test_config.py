import pytest

from raftlog.config import NodeConfig, config_docs, parse_voters
from raftlog.errors import ConfigError


def test_defaults_validate():
    config = NodeConfig.from_dict({})
    assert config.is_controller and config.is_broker
    assert config.voters == {1: ("127.0.0.1", 19092)}


def test_round_trip_through_toml(tmp_path):
    config = NodeConfig.from_dict(
        {
            "node_id": 2,
            "controller_quorum_voters": "1@127.0.0.1:1,2@127.0.0.1:2",
            "flush_policy": "interval",
        }
    )
    path = tmp_path / "node.toml"
    path.write_text(config.to_toml())
    assert NodeConfig.load(path) == config


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"nod_id": 1}, "unknown key 'nod_id' (did you mean 'node_id'?)"),
        ({"node_id": "one"}, "node_id must be an integer"),
        ({"node_id": True}, "node_id must be an integer"),
        ({"segment_bytes": 1}, "segment_bytes = 1 is below the minimum 14"),
        ({"flush_policy": "never"}, "flush_policy must be one of ['always', 'interval']"),
        ({"roles": ["janitor"]}, "roles must be a non-empty subset"),
        ({"client_listener": "nohost"}, "client_listener: expected HOST:PORT"),
        ({"node_id": 5}, "node 5 has the controller role but is not in"),
        ({"broker_rack": "rack\n1"}, "broker_rack must be at most 255 printable"),
        ({"broker_rack": "r" * 256}, "broker_rack must be at most 255 printable"),
        ({"group_consumer_assignors": ["sticky"]}, "group_consumer_assignors must name some"),
        ({"group_consumer_assignors": []}, "group_consumer_assignors must name some"),
        (
            {"group_consumer_heartbeat_interval_ms": 45_000},
            "group_consumer_heartbeat_interval_ms must be below",
        ),
    ],
)
def test_bad_values_are_refused_clearly(values, message):
    with pytest.raises(ConfigError, match=None) as info:
        NodeConfig.from_dict(values)
    assert message in str(info.value)


def test_voters_parse_and_reject_duplicates():
    assert parse_voters("1@a:1, 2@[::1]:2") == {1: ("a", 1), 2: ("::1", 2)}
    with pytest.raises(ConfigError, match="listed twice"):
        parse_voters("1@a:1,1@b:2")


def test_voters_are_parsed_once_per_config_and_follow_a_replaced_one():
    import dataclasses

    config = NodeConfig(controller_quorum_voters="1@a:1,2@b:2")
    assert config.voters is config.voters
    moved = dataclasses.replace(config, controller_quorum_voters="1@a:1,2@c:3")
    assert moved.voters == {1: ("a", 1), 2: ("c", 3)}
    assert config.voters == {1: ("a", 1), 2: ("b", 2)}
    assert moved == dataclasses.replace(moved)  # the cached value is no field


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        NodeConfig.load(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("node_id = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        NodeConfig.load(bad)


def test_every_key_is_documented():
    for key, _default, doc in config_docs():
        assert doc.strip(), key


def test_advertised_internal_listener_defaults_to_the_bound_one():
    config = NodeConfig.from_dict({"internal_listener": "0.0.0.0:19092"})
    assert config.advertised_internal_address == ("0.0.0.0", 19092)
    config = NodeConfig.from_dict(
        {"internal_listener": "0.0.0.0:19092", "advertised_internal_listener": "10.0.0.5:19092"}
    )
    assert config.advertised_internal_address == ("10.0.0.5", 19092)
    with pytest.raises(ConfigError, match="advertised_internal_listener: expected HOST:PORT"):
        NodeConfig.from_dict({"advertised_internal_listener": "nope"})


def test_queued_max_request_bytes_must_hold_the_largest_frame():
    with pytest.raises(ConfigError, match=r"queued_max_request_bytes \(104857600\) must hold"):
        NodeConfig.from_dict({"queued_max_request_bytes": 100 * 1024 * 1024})
    with pytest.raises(ConfigError, match="at least 268435460"):
        NodeConfig.from_dict({"internal_frame_max_bytes": 256 * 1024 * 1024})
    config = NodeConfig.from_dict(
        {"socket_request_max_bytes": 1024 * 1024, "queued_max_request_bytes": 65 * 1024 * 1024}
    )
    assert config.queued_max_request_bytes == 65 * 1024 * 1024


# ---------------------------------------------------------------- listeners and security
def _pem_files(tmp_path):
    paths = {}
    for key in ("ssl_certificate_location", "ssl_key_location", "ssl_ca_location"):
        path = tmp_path / f"{key}.pem"
        path.write_text("placeholder: validate checks presence, tls.py checks content\n")
        paths[key] = str(path)
    return paths


def test_no_listeners_means_one_plaintext_listener_at_client_listener():
    config = NodeConfig.from_dict(
        {"client_listener": "127.0.0.1:9500", "advertised_client_listener": "kafka1:9500"}
    )
    (bound,) = config.client_listeners
    assert (bound.name, bound.host, bound.port, bound.security_protocol) == (
        "PLAINTEXT",
        "127.0.0.1",
        9500,
        "PLAINTEXT",
    )
    (advertised,) = config.advertised_client_listeners
    assert (advertised.host, advertised.port) == ("kafka1", 9500)
    assert not config.internal_tls and not config.authorizer_enabled


def test_named_listeners_take_protocols_from_the_map(tmp_path):
    config = NodeConfig.from_dict(
        {
            "listeners": "PLAINTEXT://127.0.0.1:9092,secure://127.0.0.1:9093,"
            "SASL_SSL://0.0.0.0:9094",
            "advertised_listeners": "SASL_SSL://kafka1.example:9094",
            "listener_security_protocol_map": "PLAINTEXT:PLAINTEXT,SECURE:SSL,SASL_SSL:SASL_SSL",
            **_pem_files(tmp_path),
        }
    )
    assert [(b.name, b.port, b.security_protocol) for b in config.client_listeners] == [
        ("PLAINTEXT", 9092, "PLAINTEXT"),
        ("SECURE", 9093, "SSL"),
        ("SASL_SSL", 9094, "SASL_SSL"),
    ]
    assert [(b.host, b.port) for b in config.advertised_client_listeners] == [
        ("127.0.0.1", 9092),
        ("127.0.0.1", 9093),
        ("kafka1.example", 9094),
    ]
    assert config.sasl_mechanisms == ("SCRAM-SHA-256", "SCRAM-SHA-512")


def test_authorizer_keys():
    for name in ("StandardAuthorizer", "org.apache.kafka.metadata.authorizer.StandardAuthorizer"):
        config = NodeConfig.from_dict(
            {"authorizer_class_name": name, "super_users": "User:admin; User:ops"}
        )
        assert config.authorizer_enabled
        assert config.super_user_principals == {"User:admin", "User:ops"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"listeners": "PLAINTEXT:9092"}, "listeners: expected NAME://HOST:PORT"),
        ({"listeners": "EXTERNAL://127.0.0.1:9092"}, "EXTERNAL has no entry in"),
        (
            {"listeners": "PLAINTEXT://127.0.0.1:9092,PLAINTEXT://127.0.0.1:9093"},
            "listener name PLAINTEXT is used twice",
        ),
        (
            {"listeners": "PLAINTEXT://127.0.0.1:9092,SASL_PLAINTEXT://127.0.0.1:9092"},
            "both use port 9092",
        ),
        (
            {"listeners": "PLAINTEXT://127.0.0.1:19092"},
            "listener PLAINTEXT and internal_listener both use port 19092",
        ),
        (
            {"listener_security_protocol_map": "PLAINTEXT:KERBEROS"},
            "unknown security protocol 'KERBEROS'",
        ),
        (
            {"listeners": "PLAINTEXT://0.0.0.0:9092"},
            "name the address clients should use in advertised_listeners",
        ),
        (
            {"listeners": "PLAINTEXT://127.0.0.1:9092", "advertised_listeners": "SSL://a:1"},
            "advertised_listeners: SSL is not one of the listeners",
        ),
        ({"advertised_listeners": "SSL://a:1"}, "but listeners is empty"),
        ({"listeners": "SSL://127.0.0.1:9093"}, "SSL) needs ssl_certificate_location"),
        ({"internal_security_protocol": "SSL"}, "needs ssl_certificate_location"),
        ({"internal_security_protocol": "SASL_SSL"}, "internal_security_protocol must be one"),
        (
            {"listeners": "SASL_PLAINTEXT://127.0.0.1:9093", "sasl_enabled_mechanisms": ""},
            "SASL_PLAINTEXT but sasl_enabled_mechanisms is empty",
        ),
        ({"sasl_enabled_mechanisms": "GSSAPI"}, "'GSSAPI' is not supported"),
        ({"ssl_client_auth": "maybe"}, "ssl_client_auth must be one of"),
        ({"ssl_principal_mapping_rules": " "}, "ssl_principal_mapping_rules is empty"),
        ({"authorizer_class_name": "AclAuthorizer"}, "'AclAuthorizer' is unknown"),
        ({"super_users": "admin"}, "super_users: expected TYPE:NAME"),
        ({"connections_max_reauth_ms": -1}, "below the minimum 0"),
    ],
)
def test_bad_security_values_are_refused_clearly(values, message):
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_dict(values)
    assert message in str(info.value)


def test_tls_files_must_exist_and_mutual_tls_needs_a_ca(tmp_path):
    files = _pem_files(tmp_path)
    with pytest.raises(ConfigError, match=r"ssl_key_location: .* is not a readable file"):
        NodeConfig.from_dict(
            {
                "listeners": "SSL://127.0.0.1:9093",
                **files,
                "ssl_key_location": str(tmp_path / "absent.pem"),
            }
        )
    without_ca = {k: v for k, v in files.items() if k != "ssl_ca_location"}
    with pytest.raises(ConfigError, match=r"mutual TLS between nodes.*needs ssl_ca_location"):
        NodeConfig.from_dict({"internal_security_protocol": "SSL", **without_ca})
    with pytest.raises(ConfigError, match="ssl_client_auth = required needs ssl_ca_location"):
        NodeConfig.from_dict(
            {"listeners": "SSL://127.0.0.1:9093", "ssl_client_auth": "required", **without_ca}
        )
    # A server-only SSL listener needs no CA.
    NodeConfig.from_dict({"listeners": "SSL://127.0.0.1:9093", **without_ca})
    assert NodeConfig.from_dict({"internal_security_protocol": "SSL", **files}).internal_tls


def test_bootstrap_scram_credentials_take_kafka_storage_syntax_salted_only():
    from raftlog.config_listeners import parse_bootstrap_scram

    entry = 'SCRAM-SHA-512=[name=admin,iterations=8192,salt="c2FsdA==",saltedpassword="AAECAw=="]'
    (credential,) = parse_bootstrap_scram(f"{entry}; ")
    assert (credential.mechanism, credential.user, credential.iterations) == (
        "SCRAM-SHA-512",
        "admin",
        8192,
    )
    assert (credential.salt, credential.salted_password) == (b"salt", b"\x00\x01\x02\x03")
    NodeConfig.from_dict({"bootstrap_scram_credentials": entry})
    for bad in (
        "SCRAM-SHA-512=[name=admin,password=secret]",
        'SCRAM-SHA-1=[name=a,iterations=1,salt="c2FsdA==",saltedpassword="AAECAw=="]',
        'SCRAM-SHA-256=[name=a,iterations=1,salt="c2Fsd",saltedpassword="AAECAw=="]',
    ):
        with pytest.raises(ConfigError, match="bootstrap_scram_credentials"):
            NodeConfig.from_dict({"bootstrap_scram_credentials": bad})
