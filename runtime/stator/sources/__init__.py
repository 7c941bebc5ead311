from .base import Source, SplitRange
from .files import FileSource
from .generator import FromList, GeneratorSource, KeyedEvents, SweepEvents, list_source
from .kafka import KafkaRecord, KafkaSource

__all__ = [
    "FileSource",
    "FromList",
    "GeneratorSource",
    "KafkaRecord",
    "KafkaSource",
    "KeyedEvents",
    "Source",
    "SplitRange",
    "SweepEvents",
    "list_source",
]
