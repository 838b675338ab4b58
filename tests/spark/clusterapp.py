"""Jobs that the cluster tests submit with ``spark-submit --master spark://…``.

    clusterapp.py write URL COUNT TOPIC          publish COUNT rows as messages
    clusterapp.py stream URL SUBSCRIPTION SINK [CHECKPOINT [MAX_BATCH]]
                                                 stream the subscription into Parquet until
                                                 it is drained, then stop

Prints ``done`` on success, else ``error: …`` (exit status 1).
"""

from __future__ import annotations

import sys
import tempfile

from pyspark.sql import SparkSession

from sqlbroker.spark import register


def write(spark: SparkSession, url: str, count: int, topic: str) -> None:
    frame = spark.range(0, count, 1, 4).selectExpr("id AS n")
    frame.write.format("sqlbroker").option("url", url).option("topic", topic).mode("append").save()


def stream(
    spark: SparkSession,
    url: str,
    subscription: str,
    sink: str,
    checkpoint: str | None = None,
    max_batch: str = "2000",
) -> None:
    query = (
        spark.readStream.format("sqlbroker")
        .option("url", url)
        .option("subscription", subscription)
        .option("max_batch", max_batch)
        .load()
        .writeStream.format("parquet")
        .option("path", sink)
        .option("checkpointLocation", checkpoint or tempfile.mkdtemp(prefix="checkpoint-"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def main() -> int:
    command, url, *rest = sys.argv[1:]
    spark = SparkSession.builder.appName(f"sqlbroker-cluster-{command}").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        if command == "write":
            write(spark, url, int(rest[0]), rest[1])
        else:
            stream(spark, url, *rest)
    except Exception as error:
        print(f"error: {type(error).__name__}: {error}")
        return 1
    finally:
        spark.stop()
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
