"""Kafka -> per-user running count and sum -> exactly-once file sink (``EO_OUT``) or
transactional Kafka sink (``EO_OUT_TOPIC``). Configured by environment variables, so failure
tests can run it as a real ``stator run`` process."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from stator import INT64, Context, KeyedProcessFunction, Pipeline, RuntimeContext
from stator import ValueStateDescriptor as Value
from stator.sinks import FileSink, KafkaSink
from stator.sinks.base import Sink
from stator.sources import KafkaRecord, KafkaSource
from stator.storage import S3Options


def decode(record: KafkaRecord) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(record.value or b"{}")
    event["offset"] = f"{record.partition}:{record.offset}"
    return event


class RunningSum(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(Value("count", INT64))
        self.total = ctx.get_state(Value("sum", INT64))

    def process_element(self, value: Any, ctx: Context) -> Iterable[Any]:
        count = self.count.value(0) + 1
        total = self.total.value(0) + int(value["amount"])
        self.count.update(count)
        self.total.update(total)
        yield {"user": value["user"], "count": count, "sum": total, "from": value["offset"]}


def build() -> Pipeline:
    s3 = S3Options(
        endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3"),
        max_attempts=2,
        connect_timeout_s=2,
        read_timeout_s=10,
    )
    sink: Sink
    if "EO_OUT_TOPIC" in os.environ:
        sink = KafkaSink(
            os.environ["EO_BOOTSTRAP"],
            os.environ["EO_OUT_TOPIC"],
            key=lambda r: r["user"],
            delivery=os.environ.get("EO_DELIVERY", "exactly-once"),
        )
    else:
        sink = FileSink(os.environ["EO_OUT"], s3=s3)
    p = Pipeline("eo-running-sum", max_parallelism=64)
    (
        p.source(
            KafkaSource(
                os.environ["EO_BOOTSTRAP"], os.environ["EO_TOPIC"], bounded=True, decode=decode
            ),
            uid="events",
        )
        .key_by(lambda e: e["user"])
        .process(RunningSum(), uid="running-sum")
        .sink(sink, uid="out")
    )
    return p
