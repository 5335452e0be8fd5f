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
