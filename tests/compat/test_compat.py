"""The librdkafka suite runner's parts that need no build: reading the test table and the
runner's output, verdicts, the expected-failures list, the table, and the checks on what is
fetched."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from compat import report, source
from compat.runner import Verdict, judge
from compat.suite import Outcome, broker_facing, parse_summary, read_tests

TEST_C = """
static int show_summary = 1;
struct test tests[] = {
    _TEST(0000_unittests,
          TEST_F_LOCAL,
          _THRES(.ucpu = 100.0, .scpu = 10.0)),
    _TEST(0001_multiobj, 0),
    _TEST(0028_long_topicnames,
          TEST_F_KNOWN_ISSUE,
          TEST_BRKVER(0, 9, 0, 0),
          .extra = "https://github.com/confluentinc/librdkafka/issues/529"),
    _TEST(0045_subscribe_update, 0, TEST_BRKVER(0, 9, 0, 0)),
    _TEST(0045_subscribe_update_topic_remove,
          0,
          TEST_BRKVER(0, 9, 0, 0),
          .scenario = "noautocreate"),
    _TEST(0055_producer_latency, TEST_F_KNOWN_ISSUE_WIN32),
    _TEST(0103_transactions, 0, TEST_BRKVER(0, 11, 0, 0), .scenario = "default,ak23"),
    _TEST(0104_only_old, 0, .scenario = "ak23"),
    _TEST(8001_fetch_from_follower_mock_manual, TEST_F_MANUAL),
    {NULL}};
"""

# Colours as the runner prints them; a failing test aborts the runner before its summary.
FAILED_OUTPUT = """\x1b[36m[0030_offset_commit          /  1.581s] TEST FAILURE
\x1b[0m\x1b[31m### Test "0030_offset_commit (do_nonexist_commit:497)" failed at \
0030-offset_commit.c:479:nonexist_offset_commit_cb() at Thu Nov 26 02:30:39 2026: ###
Test assertion failed: "err == UNKNOWN_TOPIC_OR_PART": expected unknown topic, not Success
\x1b[0m\x1b[31m### Test "<MAIN>" failed at test.c:1950:test_wait_exit() at Thu Nov 26 2026: ###
"""
SUMMARY_OUTPUT = """TEST 20261126023034 (bare, scenario default) SUMMARY
#==================================================================#
|\x1b[32m <MAIN>                                   |     PASSED |   2.000s \x1b[0m|
|\x1b[32m 0045_subscribe_update                    |     PASSED |   1.131s \x1b[0m|
|\x1b[33m 0045_subscribe_update_mock               |    SKIPPED |   0.000s \x1b[0m|
|\x1b[31m 0045_resubscribe_with_regex              |     FAILED |   9.500s \x1b[0m| \
test_kafka_topics: KAFKA_PATH and ZK_ADDRESS must be set
#==================================================================#
"""


def test_the_table_is_read_with_flags_and_scenarios(tmp_path: Path) -> None:
    (tmp_path / "test.c").write_text(TEST_C)
    cases = {c.name: c for c in read_tests(tmp_path)}
    assert len(cases) == 9
    assert cases["0000_unittests"].local
    assert cases["0028_long_topicnames"].known_issue
    assert not cases["0055_producer_latency"].known_issue  # a Windows-only issue
    assert cases["0045_subscribe_update_topic_remove"].scenarios == ("noautocreate",)
    assert cases["0103_transactions"].scenarios == ("default", "ak23")
    assert cases["8001_fetch_from_follower_mock_manual"].manual
    facing = [c.name for c in broker_facing(list(cases.values()))]
    assert facing == [
        "0001_multiobj",
        "0028_long_topicnames",
        "0045_subscribe_update",
        "0045_subscribe_update_topic_remove",
        "0055_producer_latency",
        "0103_transactions",
    ]


def test_a_file_without_a_table_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "test.c").write_text("int main(void) { return 0; }\n")
    with pytest.raises(ValueError, match="no tests"):
        read_tests(tmp_path)


def test_summary_rows_and_failure_reports_are_read() -> None:
    summary = parse_summary(SUMMARY_OUTPUT)
    assert summary["0045_subscribe_update"] == Outcome("0045_subscribe_update", "PASSED", 1.131, "")
    assert summary["0045_subscribe_update_mock"].state == "SKIPPED"
    assert "KAFKA_PATH" in summary["0045_resubscribe_with_regex"].detail
    failed = parse_summary(FAILED_OUTPUT)
    assert list(failed) == ["0030_offset_commit"]  # <MAIN> is the runner, not a test
    outcome = failed["0030_offset_commit"]
    assert outcome.state == "FAILED"
    assert "expected unknown topic, not Success" in outcome.detail
    assert "0030-offset_commit.c:479:nonexist_offset_commit_cb" in outcome.detail


def _cases(tmp_path: Path) -> list:
    (tmp_path / "test.c").write_text(
        "struct test tests[] = {\n"
        "    _TEST(0045_subscribe_update, 0),\n"
        "    _TEST(0045_resubscribe_with_regex, 0),\n"
        "    _TEST(0045_subscribe_many_updates, 0),\n"
        "    {NULL}};\n"
    )
    return read_tests(tmp_path)


def test_verdicts(tmp_path: Path) -> None:
    cases = _cases(tmp_path)
    outcomes = parse_summary(SUMMARY_OUTPUT)
    states = {
        v.name: v.state for v in judge(cases, "default", outcomes, False, None, 30.0, "x.log")
    }
    assert states == {
        "0045_subscribe_update": "passed",
        "0045_resubscribe_with_regex": "needs-kafka-cli",
        "0045_subscribe_many_updates": "failed",  # never reported: the runner crashed
    }
    timed_out = judge(cases, "default", {}, True, None, 600.0, "x.log")
    assert {v.state for v in timed_out} == {"timeout"}
    assert "600 s deadline" in timed_out[0].detail
    exited = judge(cases, "default", outcomes, False, "node(s) [2] exited", 30.0, "x.log")
    assert [v.state for v in exited] == ["passed", "node-exited", "node-exited"]


def _verdict(name: str, state: str) -> Verdict:
    return Verdict(name, "default", state, 1.0, f"detail of {name}", "x.log")


def test_summary_counts_only_what_a_broker_decides(tmp_path: Path) -> None:
    expected = {"0030_offset_commit": report.Expected("unknown topic commit succeeds", 17)}
    verdicts = [
        _verdict("0001_multiobj", "passed"),
        _verdict("0030_offset_commit", "failed"),
        _verdict("0011_produce_batch", "timeout"),
        _verdict("0045_resubscribe_with_regex", "needs-kafka-cli"),
        _verdict("0028_long_topicnames", "skipped"),
    ]
    summary = report.summarize(verdicts, expected)
    assert (summary["passed"], summary["counted"], summary["pass_rate"]) == (1, 3, 0.3333)
    assert summary["unexpected_failures"] == ["0011_produce_batch"]
    assert summary["unexpected_passes"] == []
    fixed = report.summarize([_verdict("0030_offset_commit", "passed")], expected)
    assert fixed["unexpected_passes"] == ["0030_offset_commit"]
    markdown = report.table(verdicts, expected, "header")
    assert "expected: unknown topic commit succeeds (#17)" in markdown
    assert "| `0011_produce_batch` | default | **timeout** |" in markdown
    doc = tmp_path / "compat.md"
    doc.write_text("# Compatibility\n\nprose\n")
    report.write_doc(doc, markdown)
    report.write_doc(doc, "second")
    text = doc.read_text()
    assert text.count(report.DOC_BEGIN) == 1 and "second" in text and "header" not in text
    assert text.startswith("# Compatibility\n\nprose\n")


def test_the_expected_failures_list_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "expected.toml"
    path.write_text('[tests."0030_offset_commit"]\nissue = 17\n')
    with pytest.raises(ValueError, match="needs a reason"):
        report.load_expected(path)
    path.write_text('[tests."0030_offset_commit"]\nreason = "r"\nissue = "seventeen"\n')
    with pytest.raises(ValueError, match="issue number"):
        report.load_expected(path)
    # The list in the repository is well formed.
    for entry in report.load_expected().values():
        assert entry.reason


def test_a_tarball_that_is_not_the_pinned_one_is_refused_and_removed(tmp_path: Path) -> None:
    tarball = tmp_path / f"confluentinc-kafka-javascript-{source.NPM_VERSION}.tgz"
    tarball.write_bytes(b"not the package")
    with pytest.raises(source.CompatSetupError, match="is not the pinned"):
        source.fetch(tmp_path)
    assert not tarball.exists()


def test_extraction_refuses_paths_out_of_the_tree(tmp_path: Path) -> None:
    tarball = tmp_path / "evil.tgz"
    with tarfile.open(tarball, "w:gz") as archive:
        data = b"owned"
        info = tarfile.TarInfo("../escaped.txt")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    with pytest.raises(tarfile.OutsideDestinationError):
        source.extract(tarball, tmp_path / "work")
    assert not (tmp_path / "escaped.txt").exists()


def _built_tree(root: Path, rapidjson: str) -> None:
    """A tree as a finished build leaves it: the runner, configure's record, the stamp."""
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test-runner").write_bytes(b"")
    (root / "Makefile.config").write_text(
        f"WITH_SSL=\ty\nWITH_RAPIDJSON=\t{rapidjson}\nWITH_SNAPPY=\ty\n"
    )
    (root / source.BUILD_STAMP).write_text(
        json.dumps({"configure_args": list(source.CONFIGURE_ARGS)})
    )


def test_a_build_without_an_optional_feature_is_redone_once_its_header_is_installed(
    tmp_path: Path,
) -> None:
    def installed(header: str) -> bool:
        return header == "rapidjson/schema.h"

    def missing(header: str) -> bool:
        return False

    without = tmp_path / "without"
    _built_tree(without, "n")
    assert source.rebuild_reason(without, missing) is None  # still missing: keep the build
    reason = source.rebuild_reason(without, installed)
    assert reason is not None and "WITH_RAPIDJSON" in reason
    with_it = tmp_path / "with"
    _built_tree(with_it, "y")
    assert source.rebuild_reason(with_it, installed) is None


def test_a_build_with_no_stamp_or_other_arguments_is_redone(tmp_path: Path) -> None:
    def missing(header: str) -> bool:
        return False

    assert source.rebuild_reason(tmp_path / "empty", missing) == "not built yet"
    root = tmp_path / "tree"
    _built_tree(root, "y")
    (root / source.BUILD_STAMP).unlink()  # a build stopped before its end, or an old one
    assert source.rebuild_reason(root, missing) == "no record of a complete build"
    (root / source.BUILD_STAMP).write_text('{"configure_args": ["--enable-gssapi"]}')
    assert source.rebuild_reason(root, missing) == "built with other configure arguments"
    (root / source.BUILD_STAMP).write_text("not json")
    assert source.rebuild_reason(root, missing) == "no record of a complete build"


def test_the_header_check_uses_the_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert not source.header_available("cstdio")
    monkeypatch.delenv("CXX")
    if source.shutil.which("c++") or source.shutil.which("g++"):
        assert source.header_available("cstdio")
        assert not source.header_available("no/such/header_for_raftlog.h")


def test_each_node_gets_its_own_rack_as_librdkafkas_test_clusters_do(tmp_path: Path) -> None:
    from compat.runner import give_racks
    from raftlog.config import NodeConfig
    from raftlog.testing.cluster import ProcessCluster

    cluster = ProcessCluster(tmp_path, 3)  # configured, not started
    give_racks(cluster)
    for node_id, node in cluster.nodes.items():
        assert node.config.broker_rack == f"RACK{node_id}"
        assert NodeConfig.load(node.config_path).broker_rack == f"RACK{node_id}"


def test_clusters_get_the_scenario_settings_and_kafkas_initial_rebalance_delay() -> None:
    from compat.runner import cluster_overrides

    default = cluster_overrides("default")
    assert default["num_partitions"] == 4 and default["default_replication_factor"] == 3
    assert default["auto_create_topics_enable"] is True
    assert cluster_overrides("noautocreate")["auto_create_topics_enable"] is False
    # trivup's brokers keep Kafka's 3 s default; the group tests count callbacks on it.
    assert default["group_initial_rebalance_delay_ms"] == 3_000


JAVA_OUTPUT = (
    "\x1b[33m[0098_consumer_txn           /  1.028s] WARN: "
    "test_run_java(TransactionProducerCli): KAFKA_PATH must be set\n"
    '\x1b[0m\x1b[31m### Test "0098_consumer_txn" failed at '
    "0098-consumer-txn.cpp:509:do_test() at Thu Nov 26: ###\n"
    'Test assertion failed: "msgs.size() == 5": Expected 5, got: 0\n'
)


def test_a_test_whose_java_helper_could_not_start_needs_kafka(tmp_path: Path) -> None:
    outcome = parse_summary(JAVA_OUTPUT)["0098_consumer_txn"]
    assert outcome.detail.startswith("test_run_java(TransactionProducerCli): KAFKA_PATH")
    assert "Expected 5, got: 0" in outcome.detail
    (tmp_path / "test.c").write_text(
        "struct test tests[] = {\n    _TEST(0098_consumer_txn, 0),\n    {NULL}};\n"
    )
    outcomes = {outcome.name: outcome}
    verdicts = judge(read_tests(tmp_path), "default", outcomes, False, None, 3.0, "x.log")
    assert [v.state for v in verdicts] == ["needs-kafka-cli"]


def test_the_group_protocol_reaches_the_runner_only_when_not_classic(tmp_path: Path) -> None:
    from compat.runner import runner_env

    suite = source.Suite(tmp_path)
    classic = runner_env(suite, "0113", "default", tmp_path / "test.conf")
    assert "TEST_CONSUMER_GROUP_PROTOCOL" not in classic
    assert classic["TESTS"] == "0113" and classic["TEST_KAFKA_VERSION"] == "3.9.0"
    consumer = runner_env(suite, "0113", "default", tmp_path / "test.conf", "consumer")
    assert consumer["TEST_CONSUMER_GROUP_PROTOCOL"] == "consumer"


def test_a_known_long_test_gets_a_longer_deadline() -> None:
    from compat.runner import deadline_for

    assert deadline_for("0113", 600.0) == 1_200.0
    assert deadline_for("0113", 3_000.0) == 3_000.0
    assert deadline_for("0001", 600.0) == 600.0
