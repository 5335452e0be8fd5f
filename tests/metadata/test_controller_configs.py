"""Controller: AlterConfigs, IncrementalAlterConfigs, AlterClientQuotas."""

import math

import pytest

from raftlog.errors import ErrorCode
from raftlog.metadata import records as r
from raftlog.metadata.controller import messages as m
from tests.metadata.test_controller import cluster, create


def alter(c, resource_type, name, configs, validate_only=False):
    req = m.AlterConfigs((m.AlterConfigsResource(resource_type, name, configs),), validate_only)
    return c.handle(req, 0)


def incremental(c, resource_type, name, *ops, validate_only=False):
    resource = m.IncrementalAlterConfigsResource(
        resource_type, name, tuple(m.ConfigOp(*op) for op in ops)
    )
    return c.handle(m.IncrementalAlterConfigs((resource,), validate_only), 0)


def code(result):
    (res,) = result.reply.results
    return res.error_code


def test_alter_configs_replaces_the_whole_set():
    c = cluster(1)
    create(c, "t", 1, 1, configs={"retention.ms": "100", "segment.bytes": "1024"})
    result = alter(c, "topic", "t", {"retention.ms": "200", "cleanup.policy": "compact"})
    assert code(result) == ErrorCode.none
    assert set(result.records) == {
        r.Config("topic", "t", "segment.bytes", None),
        r.Config("topic", "t", "retention.ms", "200"),
        r.Config("topic", "t", "cleanup.policy", "compact"),
    }
    assert c.image.configs[("topic", "t")] == {"retention.ms": "200", "cleanup.policy": "compact"}


def test_broker_and_cluster_resources():
    c = cluster(1)
    assert code(alter(c, "broker", "1", {"log.retention.ms": "5"})) == ErrorCode.none
    assert c.image.configs[("broker", "1")] == {"log.retention.ms": "5"}
    # Kafka's BROKER resource with an empty name is the cluster-wide default.
    assert code(alter(c, "broker", "", {"min.insync.replicas": "2"})) == ErrorCode.none
    assert c.image.cluster_config("min.insync.replicas") == "2"
    assert code(alter(c, "broker", "one", {})) == ErrorCode.invalid_request
    assert code(alter(c, "cluster", "x", {})) == ErrorCode.invalid_request
    assert code(alter(c, "group", "g", {})) == ErrorCode.invalid_request


@pytest.mark.parametrize(
    ("resource_type", "name", "configs", "expected", "message"),
    [
        ("topic", "nope", {}, ErrorCode.unknown_topic_or_partition, "does not exist"),
        ("topic", "t", {"retention.ms": "-2"}, ErrorCode.invalid_config, "outside -1.."),
        ("topic", "t", {"bogus": "1"}, ErrorCode.invalid_config, "unknown config key"),
        ("topic", "t", {"log.retention.ms": "1"}, ErrorCode.invalid_config, "unknown config"),
        ("broker", "1", {"retention.ms": "1"}, ErrorCode.invalid_config, "unknown config"),
        ("topic", "t", {"min.cleanable.dirty.ratio": "1.5"}, ErrorCode.invalid_config, "outside"),
        ("topic", "t", {"compression.type": "brotli"}, ErrorCode.invalid_config, "not one of"),
    ],
)
def test_alter_config_errors(resource_type, name, configs, expected, message):
    c = cluster(1)
    create(c, "t", 1, 1)
    result = alter(c, resource_type, name, configs)
    (res,) = result.reply.results
    assert res.error_code == expected and message in res.error_message, res
    assert result.records == ()


def test_validate_only_and_per_resource_results():
    c = cluster(1)
    create(c, "t", 1, 1)
    dry = alter(c, "topic", "t", {"retention.ms": "9"}, validate_only=True)
    assert code(dry) == ErrorCode.none and dry.records == ()
    assert ("topic", "t") not in c.image.configs
    req = m.AlterConfigs(
        (
            m.AlterConfigsResource("topic", "t", {"retention.ms": "9"}),
            m.AlterConfigsResource("topic", "missing", {}),
            m.AlterConfigsResource("topic", "t", {}),
        )
    )
    results = c.handle(req, 0).reply.results
    assert [x.error_code for x in results] == [
        ErrorCode.none,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.invalid_request,  # the same resource twice
    ]
    assert c.image.topic_config("t", "retention.ms") == 9


def test_incremental_set_delete_append_subtract():
    c = cluster(1)
    create(c, "t", 1, 1, configs={"retention.ms": "1", "segment.ms": "5"})
    result = incremental(
        c,
        "topic",
        "t",
        ("retention.ms", "set", "2"),
        ("segment.ms", "delete"),
        ("cleanup.policy", "append", "compact"),
    )
    assert code(result) == ErrorCode.none
    assert c.image.configs[("topic", "t")] == {"retention.ms": "2", "cleanup.policy": "compact"}
    incremental(c, "topic", "t", ("cleanup.policy", "append", "delete,compact"))
    assert c.image.topic_config("t", "cleanup.policy") == ["compact", "delete"]
    incremental(c, "topic", "t", ("cleanup.policy", "subtract", "compact"))
    assert c.image.topic_config("t", "cleanup.policy") == ["delete"]
    incremental(c, "topic", "t", ("cleanup.policy", "subtract", "delete"))
    assert c.image.topic_config("t", "cleanup.policy") is None
    unchanged = incremental(c, "topic", "t", ("retention.ms", "set", "2"))
    assert unchanged.records == () and code(unchanged) == ErrorCode.none


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        ((("retention.ms", "append", "1"),), ErrorCode.invalid_config),
        ((("retention.ms", "set", "x"),), ErrorCode.invalid_config),
        ((("nope", "set", "1"),), ErrorCode.invalid_config),
        ((("retention.ms", "set", None),), ErrorCode.invalid_request),
        ((("retention.ms", "merge", "1"),), ErrorCode.invalid_request),
        ((("retention.ms", "set", "1"), ("retention.ms", "delete")), ErrorCode.invalid_request),
    ],
)
def test_incremental_errors(ops, expected):
    c = cluster(1)
    create(c, "t", 1, 1)
    result = incremental(c, "topic", "t", *ops)
    assert code(result) == expected and result.records == ()


# ------------------------------------------------------------------ client quotas
USER = (("user", "alice"),)
CLIENT = (("client-id", "app"),)
BOTH = (("user", "alice"), ("client-id", "app"))
DEFAULT_USER = (("user", None),)


def quotas(c, *entries, validate_only=False):
    req = m.AlterClientQuotas(
        tuple(m.QuotaEntry(entity, tuple(ops)) for entity, ops in entries), validate_only
    )
    return c.handle(req, 0)


def test_set_and_remove_quotas_for_every_entity_shape():
    c = cluster(1)
    result = quotas(
        c,
        (USER, [("producer_byte_rate", 1024)]),
        (CLIENT, [("consumer_byte_rate", 2048.0)]),
        (BOTH, [("request_percentage", 12.5)]),
        (DEFAULT_USER, [("controller_mutation_rate", 3.0)]),
    )
    assert [x.error_code for x in result.reply.results] == [ErrorCode.none] * 4
    stored = c.image.client_quotas
    assert stored[USER] == {"producer_byte_rate": 1024.0}
    assert stored[CLIENT] == {"consumer_byte_rate": 2048.0}
    # (user, client-id) is stored under one canonical (sorted) entity.
    assert stored[(("client-id", "app"), ("user", "alice"))] == {"request_percentage": 12.5}
    assert stored[DEFAULT_USER] == {"controller_mutation_rate": 3.0}
    removed = quotas(c, (USER, [("producer_byte_rate", None)]))
    assert removed.records == (r.ClientQuota(USER, "producer_byte_rate", None),)
    assert USER not in c.image.client_quotas
    unchanged = quotas(c, (CLIENT, [("consumer_byte_rate", 2048)]))
    assert unchanged.records == ()


@pytest.mark.parametrize(
    ("entity", "ops", "message"),
    [
        (USER, [("producer_byte_rate", -1)], "must be a finite number > 0"),
        (USER, [("producer_byte_rate", 0)], "must be a finite number > 0"),
        (USER, [("producer_byte_rate", math.inf)], "must be a finite number > 0"),
        (USER, [("producer_byte_rate", 1.5)], "whole number"),
        (USER, [("request_percentage", "10")], "must be a number"),
        (USER, [("bandwidth", 1.0)], "unknown quota key 'bandwidth'"),
        (USER, [("request_percentage", 1.0), ("request_percentage", 2.0)], "named twice"),
        ((), [("request_percentage", 1.0)], "the entity is empty"),
        ((("ip", "1.2.3.4"),), [("request_percentage", 1.0)], "unsupported entity types"),
        ((("user", "a"), ("user", "b")), [("request_percentage", 1.0)], "named twice"),
    ],
)
def test_bad_quotas_are_refused_with_invalid_request_and_a_message(entity, ops, message):
    c = cluster(1)
    result = quotas(c, (entity, ops))
    (res,) = result.reply.results
    assert res.error_code == ErrorCode.invalid_request and message in res.error_message, res
    assert result.records == ()


def test_quota_validate_only_and_mixed_results():
    c = cluster(1)
    dry = quotas(c, (USER, [("producer_byte_rate", 10)]), validate_only=True)
    assert dry.records == () and not c.image.client_quotas
    mixed = quotas(c, (USER, [("producer_byte_rate", 10)]), (CLIENT, [("nope", 1.0)]))
    assert [x.error_code for x in mixed.reply.results] == [
        ErrorCode.none,
        ErrorCode.invalid_request,
    ]
    assert c.image.client_quotas == {USER: {"producer_byte_rate": 10.0}}
