from .base import Source, SplitRange
from .generator import ChurnEvents, GeneratorSource, KeyedEvents

__all__ = ["ChurnEvents", "GeneratorSource", "KeyedEvents", "Source", "SplitRange"]
