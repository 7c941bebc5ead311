from .base import Source, SplitRange
from .files import FileSource
from .generator import ChurnEvents, FromList, GeneratorSource, KeyedEvents, list_source
from .kafka import KafkaRecord, KafkaSource

__all__ = [
    "ChurnEvents",
    "FileSource",
    "FromList",
    "GeneratorSource",
    "KafkaRecord",
    "KafkaSource",
    "KeyedEvents",
    "Source",
    "SplitRange",
    "list_source",
]
