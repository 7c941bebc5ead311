"""Stator: Flink-grade state management for PySpark pipelines.

The public API::

    from stator import Pipeline, KeyedProcessFunction, ValueStateDescriptor
    from stator.sources import GeneratorSource, KafkaSource, FileSource
    from stator.sinks import FileSink, CollectSink, KafkaSink

    status = pipeline.run(load_config(None, ["parallelism=2"]))  # in this process
    status.state  # JobState.FINISHED or STOPPED

A running job's surface (``stator.Job``: ``on_epoch`` / ``on_checkpoint`` listeners, which
get an ``EpochResult`` / the checkpoint's metadata, ``request_savepoint``, ``stop``,
``status``) is imported on first use: it brings the driver, Spark's side of the runtime.
"""

import importlib
from typing import TYPE_CHECKING, Any

from .api.functions import (
    BroadcastProcessFunction,
    Context,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    ListState,
    MapState,
    OutputTag,
    ProcessFunction,
    ReducingState,
    RuntimeContext,
    ValueState,
)
from .api.pipeline import Pipeline
from .api.streams import KeyedStream, Stream
from .api.time import BoundedOutOfOrderness
from .config import JobConfig, load_config
from .state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from .state.serializers import BYTES, FLOAT64, INT64, JSON, PICKLE, UTF8, Serializer

if TYPE_CHECKING:
    from .driver.job import Job
    from .driver.listeners import EpochResult
    from .driver.status import JobState, JobStatus

# Imported on first use (module ``__getattr__``): name -> its module.
_LAZY = {
    "Job": "stator.driver.job",
    "EpochResult": "stator.driver.listeners",
    "JobState": "stator.driver.status",
    "JobStatus": "stator.driver.status",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'stator' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "BYTES",
    "FLOAT64",
    "INT64",
    "JSON",
    "PICKLE",
    "UTF8",
    "BoundedOutOfOrderness",
    "BroadcastProcessFunction",
    "Context",
    "EpochResult",
    "Job",
    "JobConfig",
    "JobState",
    "JobStatus",
    "KeyedBroadcastProcessFunction",
    "KeyedCoProcessFunction",
    "KeyedProcessFunction",
    "KeyedStream",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "OutputTag",
    "Pipeline",
    "ProcessFunction",
    "ReducingState",
    "ReducingStateDescriptor",
    "RuntimeContext",
    "Serializer",
    "Stream",
    "ValueState",
    "ValueStateDescriptor",
    "load_config",
]
