"""Stator: Flink-grade state management for PySpark pipelines.

The public API::

    from stator import Pipeline, KeyedProcessFunction, ValueStateDescriptor
    from stator.sources import GeneratorSource, KafkaSource, FileSource
    from stator.sinks import FileSink, CollectSink, KafkaSink
"""

from .api.functions import (
    Context,
    KeyedProcessFunction,
    ListState,
    MapState,
    ReducingState,
    RuntimeContext,
    ValueState,
)
from .api.pipeline import KeyedStream, Pipeline, Stream
from .api.serializers import BYTES, FLOAT64, INT64, JSON, PICKLE, UTF8, Serializer
from .api.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from .api.time import BoundedOutOfOrderness
from .config import JobConfig, load_config

__version__ = "0.1.0"

__all__ = [
    "BYTES",
    "FLOAT64",
    "INT64",
    "JSON",
    "PICKLE",
    "UTF8",
    "BoundedOutOfOrderness",
    "Context",
    "JobConfig",
    "KeyedProcessFunction",
    "KeyedStream",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "Pipeline",
    "ReducingState",
    "ReducingStateDescriptor",
    "RuntimeContext",
    "Serializer",
    "Stream",
    "ValueState",
    "ValueStateDescriptor",
    "load_config",
]
