"""The one topic-config table: what the controller accepts, the image parses and storage reads."""

import dataclasses

import pytest

from raftlog.config import NodeConfig
from raftlog.config_keys import (
    BROKER_CONFIGS,
    LOG_CONFIG_KEYS,
    TOPIC_CONFIGS,
    ConfigValueError,
    log_overrides,
    parse_topic_config,
    validate_configs,
)
from raftlog.errors import ConfigError, ErrorCode, RemoteError
from raftlog.metadata.controller import messages as m
from raftlog.storage.config import LogConfig
from tests.metadata.test_controller import cluster


def test_every_log_field_is_a_log_config_field():
    fields = {f.name for f in dataclasses.fields(LogConfig)}
    for key in LOG_CONFIG_KEYS:
        assert TOPIC_CONFIGS[key].log_field in fields | {""}, key


def test_every_default_renders_from_the_node_config():
    for node in (NodeConfig(), NodeConfig(flush_policy="interval")):
        for key, spec in [*TOPIC_CONFIGS.items(), *BROKER_CONFIGS.items()]:
            # Every key DescribeConfigs lists has a value (a client reading the configs back
            # and sending them again, as librdkafka's 0092 does, gets no null), and it is one
            # the controller itself accepts.
            assert spec.default is not None, key
            spec.parse(spec.default(node))
            assert key == key.strip() and " " not in key


def test_flush_policy_reaches_storage_through_controller_and_image():
    c = cluster(3)
    configs = {"flush.policy": "interval", "flush.ms": "20", "min.insync.replicas": "2"}
    result = c.handle(m.CreateTopics((m.NewTopic("t", 1, 1, configs=configs),)), 0)
    assert result.reply.results[0].error_code == ErrorCode.none
    assert c.image.topic_config("t", "flush.policy") == "interval"
    overrides = log_overrides(c.image.configs[("topic", "t")])
    assert overrides == {"flush.policy": "interval", "flush.ms": "20"}
    config = LogConfig.from_node_config(NodeConfig(), overrides)
    assert (config.flush_policy, config.flush_interval_ms) == ("interval", 20)


def test_a_bad_flush_policy_is_refused_at_the_controller():
    c = cluster(3)
    topic = m.NewTopic("t", 1, 1, configs={"flush.policy": "never"})
    res = c.handle(m.CreateTopics((topic,)), 0).reply.results[0]
    assert res.error_code == ErrorCode.invalid_config and "flush.policy" in res.error_message
    with pytest.raises(ConfigError, match=r"flush\.policy"):
        LogConfig.from_node_config(NodeConfig(), {"flush.policy": "never"})


def test_a_key_storage_does_not_read_is_refused_by_storage():
    with pytest.raises(ConfigError, match="unknown topic config"):
        LogConfig.from_node_config(NodeConfig(), {"min.insync.replicas": "2"})


def test_parse_errors_are_remote_value_errors():
    with pytest.raises(ConfigValueError) as info:
        parse_topic_config("retention.ms", "soon")
    assert isinstance(info.value, RemoteError) and isinstance(info.value, ValueError)
    assert parse_topic_config("x.custom", "raw") == "raw"


EDGE_VALUES = ("-2", "-1", "0", "1", "13", "14", "60", "61", str(2**31 - 1), str(2**31), "x", "")


@pytest.mark.parametrize("key", sorted(LOG_CONFIG_KEYS))
def test_storage_accepts_exactly_the_values_the_controller_accepts(key):
    # A value the controller commits must never be refused by a broker creating the log.
    candidates = [*EDGE_VALUES, "delete", "compact", "compact,delete", "always", "interval"]
    for text in candidates:
        accepted = validate_configs(TOPIC_CONFIGS, {key: text}) is None
        try:
            LogConfig.from_node_config(NodeConfig(), {key: text})
            stored = True
        except ConfigError:
            stored = False
        assert accepted == stored, (key, text, accepted, stored)


def test_compact_and_delete_together_keep_both_policies():
    config = LogConfig.from_node_config(NodeConfig(), {"cleanup.policy": "delete, compact"})
    assert config.cleanup_policy == "compact,delete"
    assert config.compact and config.delete
    assert LogConfig(cleanup_policy="compact").delete is False
    assert LogConfig().compact is False


def test_message_format_version_is_accepted_as_kafka_3_accepts_it():
    """Deprecated and ignored (every batch is RecordBatch v2), but tools for Kafka 3 set it
    (librdkafka's 0092): Kafka version strings only."""
    assert validate_configs(TOPIC_CONFIGS, {"message.format.version": "0.10.0.0"}) is None
    assert validate_configs(TOPIC_CONFIGS, {"message.format.version": "3.0-IV1"}) is None
    for bad in ("latest", "3", "1.2.3.4.5", "3.0-IV1; x", "9" * 40):
        assert validate_configs(TOPIC_CONFIGS, {"message.format.version": bad}), bad


@pytest.mark.parametrize(
    "key", ["leader.replication.throttled.replicas", "follower.replication.throttled.replicas"]
)
def test_throttled_replica_lists_are_checked_as_kafka_checks_them(key):
    spec = TOPIC_CONFIGS[key]
    for good in ("", "*", "0:1", "0:1, 1:2,2:3", " * "):
        spec.parse(good)
    # What a hostile or careless client may send: refused with a clear error, never stored.
    for bad in ("all", "0:", ":1", "0:1:2", "-1:2", "0:1,x", "*,0:1", "99999999999:1", "0;1"):
        with pytest.raises(ConfigValueError):
            spec.parse(bad)


def test_a_throttled_replica_list_is_bounded() -> None:
    """Each broker parses these lists on its event loop whenever any config changes."""
    from raftlog.config_keys import MAX_THROTTLED_REPLICAS

    spec = TOPIC_CONFIGS["leader.replication.throttled.replicas"]
    just = ",".join(f"{p}:1" for p in range(MAX_THROTTLED_REPLICAS))
    spec.parse(just)
    with pytest.raises(ConfigValueError, match="throttled replicas"):
        spec.parse(just + f",{MAX_THROTTLED_REPLICAS}:1")
