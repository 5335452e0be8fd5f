"""A Spark driver process for the sink's kill tests: a checkpointed raftlog -> raftlog stream.

    python -m tests.spark.stream_driver BOOTSTRAP SOURCE SINK CHECKPOINT

It runs until killed; the test kills it (SIGKILL) mid-stream and starts it again on the same
checkpoint.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    bootstrap, source, sink, checkpoint = sys.argv[1:5]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from raftlog.spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("raftlog-sink-kill-test")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    query = (
        spark.readStream.format("raftlog")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "500")
        .load()
        .selectExpr("key", "value")
        .writeStream.format("raftlog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    print("query started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
