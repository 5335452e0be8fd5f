"""Controller: CreateAcls and DeleteAcls (sans-IO)."""

import dataclasses
import itertools
import uuid

import pytest

from raftlog.config import NodeConfig
from raftlog.errors import ErrorCode
from raftlog.metadata import records as r
from raftlog.metadata.controller import messages as m
from raftlog.metadata.controller.controller import Controller
from raftlog.metadata.image import MetadataImage
from raftlog.metadata.snapshot import decode_snapshot, encode_snapshot
from raftlog.security.acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

READ = AclBinding(
    ResourceType.TOPIC,
    "orders",
    PatternType.LITERAL,
    "User:alice",
    "*",
    AclOperation.READ,
    AclPermissionType.ALLOW,
)
WRITE = dataclasses.replace(READ, operation=AclOperation.WRITE)
GROUP = AclBinding(
    ResourceType.GROUP,
    "app-",
    PatternType.PREFIXED,
    "User:bob",
    "*",
    AclOperation.READ,
    AclPermissionType.ALLOW,
)


def controller():
    ids = (uuid.UUID(int=n) for n in itertools.count(1))
    return Controller(
        MetadataImage.empty("cid"), NodeConfig(), now_ms=0, acl_id_source=lambda: next(ids)
    )


def create(c, *bindings):
    result = c.handle(m.CreateAcls(bindings), 0)
    return result, [x.error_code for x in result.reply.results]


def test_create_writes_one_record_per_new_binding():
    c = controller()
    result, codes = create(c, READ, WRITE)
    assert codes == [ErrorCode.none, ErrorCode.none]
    assert result.records == (
        r.AccessControlEntry.of(uuid.UUID(int=1), READ),
        r.AccessControlEntry.of(uuid.UUID(int=2), WRITE),
    )
    assert set(c.image.acls.values()) == {READ, WRITE}


def test_creating_an_existing_binding_is_a_no_op():
    c = controller()
    create(c, READ)
    result, codes = create(c, READ, READ, GROUP)
    assert codes == [ErrorCode.none] * 3
    assert result.records == (r.AccessControlEntry.of(uuid.UUID(int=2), GROUP),)
    assert len(c.image.acls) == 2


@pytest.mark.parametrize(
    ("binding", "message"),
    [
        (dataclasses.replace(READ, resource_type=ResourceType.ANY), "resource type ANY"),
        (dataclasses.replace(READ, resource_type=ResourceType.UNKNOWN), "UNKNOWN"),
        (dataclasses.replace(READ, pattern_type=PatternType.MATCH), "pattern type MATCH"),
        (dataclasses.replace(READ, operation=AclOperation.ANY), "operation ANY"),
        (dataclasses.replace(READ, permission=AclPermissionType.ANY), "permission ANY"),
        (dataclasses.replace(READ, principal="alice"), "TYPE:NAME"),
        (dataclasses.replace(READ, host=""), "host is empty"),
        (dataclasses.replace(READ, resource_name=""), "resource name is empty"),
        (dataclasses.replace(READ, resource_type=ResourceType.CLUSTER), "CLUSTER ACL"),
        (dataclasses.replace(READ, resource_name="x" * 1025), "over 1024"),
        (dataclasses.replace(READ, principal="User:" + "x" * 600), "principal"),
        (dataclasses.replace(READ, host="h" * 300), "host"),
    ],
)
def test_invalid_bindings_are_refused_alone(binding, message):
    c = controller()
    result, codes = create(c, binding, READ)
    assert codes == [ErrorCode.invalid_request, ErrorCode.none]
    assert message in result.reply.results[0].error_message
    assert list(c.image.acls.values()) == [READ]


def test_delete_reports_what_each_filter_matched_and_removes_it_once():
    c = controller()
    create(c, READ, WRITE, GROUP)
    alice = AclBindingFilter(principal="User:alice")
    reads = AclBindingFilter(operation=AclOperation.READ)
    nothing = AclBindingFilter(resource_name="nope")
    bad = AclBindingFilter(pattern_type=PatternType.UNKNOWN)
    result = c.handle(m.DeleteAcls((alice, reads, nothing, bad)), 0)
    first, second, third, fourth = result.reply.results
    assert set(first.matching) == {READ, WRITE}
    assert set(second.matching) == {READ, GROUP}  # READ is in both, removed once
    assert third.matching == () and third.error_code == ErrorCode.none
    assert fourth.error_code == ErrorCode.invalid_request
    assert sorted(rec.id.int for rec in result.records) == [1, 2, 3]
    assert not c.image.acls


def test_delete_with_a_match_filter_takes_every_binding_that_applies():
    c = controller()
    wildcard = dataclasses.replace(READ, resource_name="*")
    prefixed = dataclasses.replace(READ, resource_name="ord", pattern_type=PatternType.PREFIXED)
    other = dataclasses.replace(READ, resource_name="payments")
    create(c, READ, wildcard, prefixed, other)
    match = AclBindingFilter(
        resource_type=ResourceType.TOPIC, resource_name="orders", pattern_type=PatternType.MATCH
    )
    (result,) = c.handle(m.DeleteAcls((match,)), 0).reply.results
    assert set(result.matching) == {READ, wildcard, prefixed}
    assert list(c.image.acls.values()) == [other]


def test_acls_survive_a_new_controller_and_a_snapshot():
    c = controller()
    result, _ = create(c, READ, GROUP)
    committed, _ = MetadataImage.empty("cid").apply(result.records, 0, 1)
    restored = decode_snapshot(encode_snapshot(committed))
    successor = Controller.from_image(restored, NodeConfig(), now_ms=0)
    # The new controller sees them: creating again writes nothing, deleting finds them.
    again, codes = create(successor, READ)
    assert codes == [ErrorCode.none] and again.records == ()
    deleted = successor.handle(m.DeleteAcls((AclBindingFilter(),)), 0)
    assert set(deleted.reply.results[0].matching) == {READ, GROUP}


def test_requests_and_replies_cross_the_internal_wire():
    requests = [
        m.CreateAcls((READ, GROUP)),
        m.DeleteAcls((AclBindingFilter(), AclBindingFilter(principal="User:a"))),
        m.CreateAclsReply((m.AclCreationResult(ErrorCode.invalid_request, "no"),)),
        m.DeleteAclsReply((m.DeleteAclsFilterResult(matching=(READ,)),)),
    ]
    union = m.ControllerRequest | m.ControllerReply
    for message in requests:
        assert m.CODEC.decode(union, m.CODEC.encode(message, union)) == message
