"""Stator: Flink-grade state management for PySpark pipelines."""

__version__ = "0.1.0"
