"""A streaming query in a process of its own, for the kill-and-restart test.

``python streamapp.py URL SUBSCRIPTION SINK CHECKPOINT`` streams the subscription into a
Parquet sink until it is killed.
"""

from __future__ import annotations

import os
import sys
import time

from pyspark.sql import SparkSession

from sqlbroker.spark import register


def main() -> None:
    url, subscription, sink, checkpoint = sys.argv[1:5]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sqlbroker-streamapp")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    stream = (
        spark.readStream.format("sqlbroker")
        .option("url", url)
        .option("subscription", subscription)
        .option("max_batch", "40")
        .load()
    )
    query = (
        stream.writeStream.format("parquet")
        .option("path", sink)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="1 second")
        .start()
    )
    print("started", flush=True)
    while query.isActive:
        time.sleep(0.2)


if __name__ == "__main__":
    main()
