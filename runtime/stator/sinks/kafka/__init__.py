"""The Kafka sink: exactly-once through fenced transactions, or at-least-once."""

from .sink import DELIVERIES, KafkaSink

__all__ = ["DELIVERIES", "KafkaSink"]
