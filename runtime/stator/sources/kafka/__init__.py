"""Kafka source: topics or a pattern, start modes, partition discovery, dead letters, lag."""

from .reader import KafkaRecord
from .source import KafkaSource
from .start import StartFrom

__all__ = ["KafkaRecord", "KafkaSource", "StartFrom"]
