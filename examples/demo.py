"""``make demo``: the smallest real thing Stator has so far, on the local test bed.

Starts the control plane, MinIO and Kafka as local processes, runs a keyed count on local
Spark over records read from Kafka, stores the result in MinIO, and reads it back.
"""

from __future__ import annotations

import json
import os
import sys
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from tests.testbed.bed import running
from tests.testbed.spark import kafka_connector_jars, local_spark_env


def main() -> int:
    t0 = time.monotonic()
    with running() as bed:
        assert bed.kube and bed.kafka
        print(f"[{time.monotonic() - t0:5.1f}s] test bed up: {json.dumps(bed.describe())}")
        print(bed.kube.kubectl("version").stdout.strip())

        topic = "demo-events"
        admin = AdminClient({"bootstrap.servers": bed.kafka.bootstrap_servers})
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[
            topic
        ].result()
        producer = Producer({"bootstrap.servers": bed.kafka.bootstrap_servers})
        for i in range(10_000):
            producer.produce(topic, key=f"user-{i % 7}".encode(), value=b"1")
        producer.flush()

        os.environ.update(local_spark_env())
        from pyspark.sql import SparkSession

        spark = (
            SparkSession.builder.master("local[2]")
            .appName("stator-demo")
            .config("spark.jars", ",".join(map(str, kafka_connector_jars())))
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        counts = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", bed.kafka.bootstrap_servers)
            .option("subscribe", topic)
            .load()
            .selectExpr("CAST(key AS STRING) AS user")
            .groupBy("user")
            .count()
            .orderBy("user")
            .collect()
        )
        spark.stop()
        result = {r.user: r["count"] for r in counts}
        s3 = bed.s3.client()
        s3.create_bucket(Bucket="demo")
        s3.put_object(Bucket="demo", Key="counts.json", Body=json.dumps(result).encode())
        stored = json.loads(s3.get_object(Bucket="demo", Key="counts.json")["Body"].read())
        print(f"[{time.monotonic() - t0:5.1f}s] keyed count from Kafka, stored in MinIO: {stored}")
        ok = sum(stored.values()) == 10_000 and len(stored) == 7
    print("demo:", "OK" if ok else "WRONG RESULT")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
