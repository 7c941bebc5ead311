from .base import Sink, SinkWriter
from .collect import CollectSink
from .files import FileSink, read_committed
from .kafka import KafkaSink

__all__ = ["CollectSink", "FileSink", "KafkaSink", "Sink", "SinkWriter", "read_committed"]
