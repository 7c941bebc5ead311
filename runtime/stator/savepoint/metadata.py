"""Savepoint metadata: ``_savepoint.json``, written last (a savepoint without it does not
exist). Self-contained: it references only files inside the savepoint's own directory."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import CheckpointNotFoundError

FORMAT = "stator-savepoint"
FORMAT_VERSION = 1
METADATA_NAME = "_savepoint.json"


@dataclass(frozen=True)
class OperatorSavepoint:
    uid: str
    parallelism: int  # when taken (restore may use another)
    # name -> {"kind", "serializer", "version"[, "key_serializer"]}
    states: dict[str, dict[str, Any]]
    # key-group -> {"file", "bytes", "entries"}; empty key-groups have no file
    key_groups: dict[int, dict[str, Any]]
    watermark: int

    @property
    def state_bytes(self) -> int:
        return sum(int(k["bytes"]) for k in self.key_groups.values())


@dataclass(frozen=True)
class SavepointMetadata:
    job: str
    epoch: int
    created_ms: int
    max_parallelism: int
    operators: dict[str, OperatorSavepoint]
    sources: dict[str, dict[str, dict[str, Any]]]
    watermark: int
    compression: str
    duration_ms: int = 0
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    # A job of several failover regions: each region's epoch when it took its part
    # (``epoch`` is the highest); a region resumes from its own (``driver/regions.py``).
    region_epochs: dict[str, int] = field(default_factory=dict)
    # ... and the operator and source uids of each region's part.
    region_uids: dict[str, list[str]] = field(default_factory=dict)

    @property
    def state_bytes(self) -> int:
        return sum(op.state_bytes for op in self.operators.values())

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, indent=1).encode()

    @staticmethod
    def from_json(data: bytes, where: str = "") -> SavepointMetadata:
        try:
            raw = json.loads(data)
            if raw.get("format") != FORMAT:
                raise ValueError("not a Stator savepoint")
            if int(raw.get("format_version", 0)) > FORMAT_VERSION:
                raise ValueError(
                    f"format version {raw['format_version']} is newer than this "
                    f"Stator ({FORMAT_VERSION}); upgrade Stator to restore it"
                )
            operators = {
                uid: OperatorSavepoint(
                    op["uid"],
                    op["parallelism"],
                    op["states"],
                    {int(k): v for k, v in op["key_groups"].items()},
                    op["watermark"],
                )
                for uid, op in raw["operators"].items()
            }
            return SavepointMetadata(
                raw["job"],
                raw["epoch"],
                raw["created_ms"],
                raw["max_parallelism"],
                operators,
                raw["sources"],
                raw["watermark"],
                raw["compression"],
                raw.get("duration_ms", 0),
                raw["format"],
                raw["format_version"],
                {str(k): int(v) for k, v in raw.get("region_epochs", {}).items()},
                {str(k): [str(u) for u in v] for k, v in raw.get("region_uids", {}).items()},
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointNotFoundError(f"savepoint metadata {where} is unusable: {exc}") from exc
