"""Which partitions a Kafka source reads: its topics (a list, or every topic matching a
pattern), as ``"<topic>:<partition>"`` splits sorted by (topic, partition), so that every
discovery of the same partitions gives the same order whatever the broker's listing order."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...errors import StatorError


def split_id(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def parse_split(split: str) -> tuple[str, int]:
    topic, _, partition = split.rpartition(":")
    return topic, int(partition)


def split_order(split: str) -> tuple[str, int]:
    """The sort key of splits: by topic, then partition number (``t:10`` after ``t:9``)."""
    return parse_split(split)


@dataclass(frozen=True)
class TopicSelection:
    """Fixed topics or a pattern (``re.fullmatch`` on the topic name, as Flink's
    ``setTopicPattern``; internal topics starting with ``__`` never match)."""

    topics: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None

    @staticmethod
    def of(
        topic: str | None, topics: Sequence[str] | None, topic_pattern: str | re.Pattern[str] | None
    ) -> TopicSelection:
        given = [
            n
            for n, v in (("topic", topic), ("topics", topics), ("topic_pattern", topic_pattern))
            if v
        ]
        if len(given) != 1:
            raise ValueError(
                f"KafkaSource takes exactly one of topic=, topics=[...] or topic_pattern=, "
                f"got {given or 'none'}"
            )
        if topic_pattern is not None:
            try:
                return TopicSelection(pattern=re.compile(topic_pattern))
            except re.error as exc:
                raise ValueError(f"KafkaSource topic_pattern {topic_pattern!r}: {exc}") from exc
        names = [topic] if topic else list(topics or [])
        if isinstance(topics, str):
            raise ValueError("KafkaSource topics= takes a list of names; for one use topic=")
        bad = [n for n in names if not isinstance(n, str) or not n]
        if bad:
            raise ValueError(f"KafkaSource topics must be non-empty strings, got {bad!r}")
        return TopicSelection(topics=tuple(sorted(set(names))))

    def describe(self) -> str:
        return f"pattern {self.pattern.pattern!r}" if self.pattern else ", ".join(self.topics)

    def splits(self, listed: Mapping[str, Sequence[int] | None]) -> list[str]:
        """``listed``: topic -> its partitions (None: the topic is missing or in error).
        Fixed topics must all be readable; a pattern may match nothing yet."""
        if self.pattern is not None:
            pattern = self.pattern
            names = [
                t
                for t, parts in listed.items()
                if parts and not t.startswith("__") and pattern.fullmatch(t)
            ]
        else:
            missing = [t for t in self.topics if not listed.get(t)]
            if missing:
                raise StatorError(
                    f"Kafka topic(s) {', '.join(missing)} not readable (missing or no "
                    f"partitions); create them first"
                )
            names = list(self.topics)
        out = [split_id(t, p) for t in names for p in listed[t] or ()]
        return sorted(out, key=split_order)
