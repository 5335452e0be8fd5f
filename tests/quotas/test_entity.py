"""Quota entities, Kafka's precedence table, the config store and validation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlog.errors import ErrorCode
from raftlog.quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    QUOTA_KEYS,
    REQUEST_PERCENTAGE,
    QuotaConfig,
    QuotaEntity,
    QuotaValidationError,
    precedence,
    sensor_tags,
    validate_alteration,
    validate_entity,
    validate_quota_value,
)

# Kafka's table, most specific first, as config paths.
KAFKA_TABLE = [
    "/config/users/alice/clients/app",
    "/config/users/alice/clients/<default>",
    "/config/users/alice",
    "/config/users/<default>/clients/app",
    "/config/users/<default>/clients/<default>",
    "/config/users/<default>",
    "/config/clients/app",
    "/config/clients/<default>",
]


def test_precedence_order_matches_kafka_table() -> None:
    assert [entity.path for entity in precedence("alice", "app")] == KAFKA_TABLE


@pytest.mark.parametrize("level", range(len(KAFKA_TABLE)))
def test_every_level_wins_over_all_less_specific_levels(level: int) -> None:
    # Configure this level and every level below it, each with a distinct value: the
    # resolution must pick this level. Unrelated entities must never match.
    entities = precedence("alice", "app")
    table = {entity: {PRODUCER_BYTE_RATE: 1000 + index} for index, entity in enumerate(entities)}
    for index in range(level):
        del table[entities[index]]
    table[QuotaEntity.user_client("bob", "app")] = {PRODUCER_BYTE_RATE: 1}
    table[QuotaEntity.user_client("alice", "other")] = {PRODUCER_BYTE_RATE: 2}
    table[QuotaEntity.client("other")] = {PRODUCER_BYTE_RATE: 3}
    config = QuotaConfig(table)
    value, matched = config.quota_for("alice", "app", PRODUCER_BYTE_RATE)
    assert value == 1000 + level
    assert matched == entities[level]
    assert matched is not None and matched.path == KAFKA_TABLE[level]


def test_keys_resolve_independently() -> None:
    config = QuotaConfig(
        {
            QuotaEntity.user("alice"): {PRODUCER_BYTE_RATE: 10},
            QuotaEntity.client(None): {CONSUMER_BYTE_RATE: 20, PRODUCER_BYTE_RATE: 30},
        }
    )
    assert config.quota_for("alice", "x", PRODUCER_BYTE_RATE) == (10, QuotaEntity.user("alice"))
    assert config.quota_for("alice", "x", CONSUMER_BYTE_RATE) == (20, QuotaEntity.client(None))
    assert config.quota_for("bob", "x", PRODUCER_BYTE_RATE) == (30, QuotaEntity.client(None))
    assert config.quota_for("alice", "x", REQUEST_PERCENTAGE) == (None, None)


def test_no_quotas_resolves_to_none() -> None:
    assert QuotaConfig().quota_for("u", "c", PRODUCER_BYTE_RATE) == (None, None)


def test_sensor_tags_share_only_what_the_entity_names() -> None:
    assert sensor_tags(QuotaEntity.user_client("a", "c"), "a", "c") == ("a", "c")
    # A default is a per-entity template: each client gets its own bucket.
    assert sensor_tags(QuotaEntity.user_client(None, None), "a", "c") == ("a", "c")
    assert sensor_tags(QuotaEntity.user("a"), "a", "c") == ("a", "")
    assert sensor_tags(QuotaEntity.user(None), "a", "c") == ("a", "")
    assert sensor_tags(QuotaEntity.client(None), "a", "c") == ("", "c")


def test_apply_delta_updates_and_removes() -> None:
    alice = QuotaEntity.user("alice")
    config = QuotaConfig({alice: {PRODUCER_BYTE_RATE: 10}})
    version = config.version
    config.apply_delta({alice: {CONSUMER_BYTE_RATE: 5, PRODUCER_BYTE_RATE: None}})
    assert config.get(alice) == {CONSUMER_BYTE_RATE: 5}
    assert config.version > version
    config.apply_delta({alice: {CONSUMER_BYTE_RATE: None}})
    assert len(config) == 0 and config.entities() == {}


def test_bad_delta_changes_nothing() -> None:
    alice = QuotaEntity.user("alice")
    config = QuotaConfig({alice: {PRODUCER_BYTE_RATE: 10}})
    with pytest.raises(QuotaValidationError):
        config.apply_delta({QuotaEntity.user("bob"): {PRODUCER_BYTE_RATE: 1}, alice: {"bogus": 1}})
    assert config.entities() == {alice: {PRODUCER_BYTE_RATE: 10}}


def test_replace_swaps_the_table() -> None:
    config = QuotaConfig({QuotaEntity.user("a"): {PRODUCER_BYTE_RATE: 1}})
    config.replace({QuotaEntity.client("c"): {CONSUMER_BYTE_RATE: 2}})
    assert config.entities() == {QuotaEntity.client("c"): {CONSUMER_BYTE_RATE: 2}}


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("producer_byte_rate", -1, "must not be negative"),
        ("consumer_byte_rate", "-5", "must not be negative"),
        ("request_percentage", "abc", "must be a number"),
        ("request_percentage", None, "must be a number"),
        ("request_percentage", True, "must be a number"),
        ("controller_mutation_rate", float("nan"), "finite"),
        ("producer_byte_rate", 0, "must be positive"),
        ("producer_byte_rate", 1.5, "whole number"),
        ("producer_bytes_rate", 10, "unknown quota key 'producer_bytes_rate'"),
    ],
)
def test_validation_messages(key: str, value: object, message: str) -> None:
    with pytest.raises(QuotaValidationError, match=message) as info:
        validate_quota_value(key, value)
    assert info.value.code == ErrorCode.invalid_request


def test_validation_accepts_numbers_and_numeric_strings() -> None:
    assert validate_quota_value(PRODUCER_BYTE_RATE, "1048576") == 1048576.0
    assert validate_quota_value(REQUEST_PERCENTAGE, 12.5) == 12.5


@pytest.mark.parametrize(
    ("components", "message"),
    [
        ([], "empty"),
        ([("ip", "1.2.3.4")], "unknown quota entity type 'ip'"),
        ([("user", "a"), ("user", "b")], "twice"),
        ([("user", 5)], "must be a string"),
    ],
)
def test_entity_validation(components: list, message: str) -> None:
    with pytest.raises(QuotaValidationError, match=message):
        validate_entity(components)


def test_validate_alteration_builds_a_delta() -> None:
    entity, delta = validate_alteration(
        [("client-id", None), ("user", "alice")],
        [(PRODUCER_BYTE_RATE, "100", False), (REQUEST_PERCENTAGE, None, True)],
    )
    assert entity == QuotaEntity.user_client("alice", None)
    assert entity.path == "/config/users/alice/clients/<default>"
    assert delta == {PRODUCER_BYTE_RATE: 100.0, REQUEST_PERCENTAGE: None}
    with pytest.raises(QuotaValidationError, match="twice"):
        validate_alteration([("user", "a")], [(PRODUCER_BYTE_RATE, 1, False)] * 2)


names = st.one_of(st.none(), st.sampled_from(["alice", "bob", "app", "other"]))


@given(
    table=st.dictionaries(
        st.one_of(
            st.builds(QuotaEntity.user, names),
            st.builds(QuotaEntity.client, names),
            st.builds(QuotaEntity.user_client, names, names),
        ),
        st.dictionaries(st.sampled_from(QUOTA_KEYS), st.integers(1, 10**9), min_size=1),
        max_size=12,
    ),
    user=st.sampled_from(["alice", "bob"]),
    client_id=st.sampled_from(["app", "other"]),
    key=st.sampled_from(QUOTA_KEYS),
)
def test_resolution_is_the_first_configured_level(
    table: dict, user: str, client_id: str, key: str
) -> None:
    config = QuotaConfig(table)
    expected = next(
        ((table[e][key], e) for e in precedence(user, client_id) if key in table.get(e, {})),
        (None, None),
    )
    assert config.quota_for(user, client_id, key) == expected
