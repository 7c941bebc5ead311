from .base import Source, SplitRange
from .files import FileSource
from .generator import FromList, GeneratorSource, KeyedEvents, SweepEvents, list_source
from .kafka import KafkaRecord, KafkaSource, StartFrom

__all__ = [
    "FileSource",
    "FromList",
    "GeneratorSource",
    "KafkaRecord",
    "KafkaSource",
    "KeyedEvents",
    "Source",
    "SplitRange",
    "StartFrom",
    "SweepEvents",
    "list_source",
]
