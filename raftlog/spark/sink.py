"""The `raftlog` sink: `df.write.format("raftlog")` and `df.writeStream.format("raftlog")`.

The columns are those of Spark's Kafka sink: `value` (required, binary or string), `key`
(binary or string), `topic` (string; the `topic` option overrides it), `partition` (int) and
`headers` (array<struct<key:string,value:binary>>); other columns are ignored, as Spark's
Kafka sink ignores them. Schema and options are checked when the writer is made, on the
driver, so a bad write fails before any task runs.

Every task writes one transaction and leaves it open; the driver commits them all in
commit() or aborts them in abort() (raftlog.spark.writer says how, docs/spark.md what that
guarantees). Streaming tasks also record their micro-batch id in their transaction so that
a replayed micro-batch writes nothing twice.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
)

from raftlog.client.transactional import TransactionHandle
from raftlog.spark.options import OptionError
from raftlog.spark.write_options import WriteOptions, parse_write_options
from raftlog.spark.writer import (
    StreamMarker,
    TaskResult,
    end_transactions,
    fence_open_transactions,
    write_task,
)

log = logging.getLogger("raftlog.spark")

# Spark sets these local properties on every task of a micro-batch (StreamExecution's
# QUERY_ID_KEY, the id kept in the checkpoint, and MicroBatchExecution's BATCH_ID_KEY).
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


class SchemaError(OptionError):
    """The DataFrame's columns do not fit the sink (Spark's Kafka sink columns)."""


def _is_headers_type(data_type: DataType) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    fields = {f.name: f.dataType for f in data_type.elementType.fields}
    return (
        set(fields) == {"key", "value"}
        and isinstance(fields["key"], StringType)
        and isinstance(fields["value"], BinaryType)
    )


def check_schema(schema: StructType, options: WriteOptions) -> None:
    """SchemaError naming the first column the sink cannot write."""
    types = {f.name.lower(): f.dataType for f in schema.fields}
    wants = {
        "value": ("binary or string", lambda t: isinstance(t, (BinaryType, StringType))),
        "key": ("binary or string", lambda t: isinstance(t, (BinaryType, StringType))),
        "topic": ("string", lambda t: isinstance(t, StringType)),
        "partition": ("int", lambda t: isinstance(t, IntegerType)),
        "headers": ("array<struct<key:string,value:binary>>", _is_headers_type),
    }
    if "value" not in types:
        raise SchemaError(
            "the raftlog sink needs a column named value (binary or string); the DataFrame "
            f"has {', '.join(f.name for f in schema.fields) or 'no columns'}"
        )
    for name, (wanted, fits) in wants.items():
        if name in types and not fits(types[name]):
            raise SchemaError(
                f"column {name} must be {wanted} for the raftlog sink, "
                f"got {types[name].simpleString()}"
            )
    if options.topic is None and "topic" not in types:
        raise SchemaError("the raftlog sink needs a topic column (string) or the topic option")
    for f in schema.fields:
        if f.name.lower() in wants and f.name != f.name.lower():
            raise SchemaError(f"column {f.name} must be spelled {f.name.lower()}")


class RaftlogCommitMessage(WriterCommitMessage):
    """One task's outcome, shipped to the driver (plain data)."""

    def __init__(self, result: TaskResult) -> None:
        self.result = result


def _handles(messages: list[WriterCommitMessage | None]) -> list[TransactionHandle]:
    return [
        m.result.handle
        for m in messages
        if isinstance(m, RaftlogCommitMessage) and m.result.handle is not None
    ]


def _rows(messages: list[WriterCommitMessage | None]) -> int:
    return sum(m.result.rows for m in messages if isinstance(m, RaftlogCommitMessage))


def _keep_columns(batches: Iterator[Any]) -> Iterator[Any]:
    """The sink's columns only, lower-cased, so the task writer knows them by name."""
    wanted = ("value", "key", "topic", "partition", "headers")
    for batch in batches:
        names = [n.lower() for n in batch.schema.names]
        keep = [i for i, n in enumerate(names) if n in wanted]
        yield batch.select(keep).rename_columns([names[i] for i in keep])


class RaftlogBatchWriter(DataSourceArrowWriter):
    """A batch write: one transaction per task, all committed by the driver."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        # One id per job: task retries share theirs (fencing the failed attempt).
        self.job_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        context = TaskContext.get()
        task_partition = context.partitionId() if context is not None else 0
        transactional_id = f"{self.options.transactional_id_prefix}-{self.job_id}-{task_partition}"
        result = write_task(self.options, _keep_columns(iterator), transactional_id, task_partition)
        return RaftlogCommitMessage(result)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        end_transactions(self.options, _handles(messages), commit=True)
        log.info("raftlog sink: committed %d rows of job %s", _rows(messages), self.job_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        # Tasks Spark cancelled when the job failed never reported: their transactions are
        # found by id and aborted here rather than left to kafka.transaction.timeout.ms
        # (which still covers an executor that cannot be reached).
        try:
            end_transactions(self.options, _handles(messages), commit=False)
            fenced = fence_open_transactions(
                self.options, f"{self.options.transactional_id_prefix}-{self.job_id}-"
            )
        except Exception as exc:  # best effort: the job's own error is what the user needs
            log.warning(
                "raftlog sink: aborting job %s failed (%s); its open transactions end at "
                "kafka.transaction.timeout.ms",
                self.job_id,
                exc,
            )
            return
        if fenced:
            log.info("raftlog sink: aborted unreported task transactions %s", fenced)


class RaftlogStreamWriter(DataSourceStreamArrowWriter):
    """A micro-batch write: per task a transaction with a stable transactional id (query id
    and partition), its batch id recorded inside it; committed by the driver."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        context = TaskContext.get()
        if context is None:
            raise RuntimeError("the raftlog stream writer runs only inside a Spark task")
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
        if not query_id or batch_id is None:
            raise RuntimeError(
                f"Spark did not set {QUERY_ID_PROPERTY}/{BATCH_ID_PROPERTY} on this task; "
                "exactly-once writes need a micro-batch query"
            )
        task_partition = context.partitionId()
        transactional_id = f"{self.options.transactional_id_prefix}-{query_id}-{task_partition}"
        assert self.options.commit_topic is not None  # parse_write_options(streaming=True)
        marker = StreamMarker(transactional_id, self.options.commit_topic, int(batch_id))
        result = write_task(
            self.options, _keep_columns(iterator), transactional_id, task_partition, marker
        )
        return RaftlogCommitMessage(result)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        end_transactions(self.options, _handles(messages), commit=True)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        try:
            end_transactions(self.options, _handles(messages), commit=False)
        except Exception as exc:  # best effort: a restarted query fences them anyway
            log.warning("raftlog sink: aborting micro-batch %d failed: %s", batchId, exc)


def batch_writer(
    options: dict[str, str], schema: StructType, overwrite: bool
) -> RaftlogBatchWriter:
    if overwrite:
        raise OptionError(
            'the raftlog sink cannot overwrite: a log is append-only; use .mode("append")'
        )
    parsed = parse_write_options(options)
    check_schema(schema, parsed)
    return RaftlogBatchWriter(parsed)


def stream_writer(
    options: dict[str, str], schema: StructType, overwrite: bool
) -> RaftlogStreamWriter:
    if overwrite:
        raise OptionError(
            "the raftlog sink cannot overwrite (complete output mode): a log is append-only; "
            "use outputMode append or update"
        )
    parsed = parse_write_options(options, streaming=True)
    check_schema(schema, parsed)
    return RaftlogStreamWriter(parsed)
