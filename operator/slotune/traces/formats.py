"""The two trace formats slotune replays, read into plain rows.

- Azure LLM inference trace (Patel et al., Splitwise, ISCA'24): CSV `TIMESTAMP,ContextTokens,GeneratedTokens`, the
  timestamp a wall-clock date with up to seven fractional digits.
- Mooncake FAST'25 traces (Qin et al., Mooncake, FAST'25): JSONL with `timestamp` (milliseconds), `input_length`,
  `output_length` and `hash_ids`, one id per 512-token prompt block, equal ids meaning equal block content (a prefix
  hash, so equal ids also mean an equal prompt up to that block).

The format is detected from the file's first non-empty line (a CSV header or a JSON object) or named by the caller.
Rows keep the file's units: arrival seconds as recorded (not yet shifted or scaled), token counts as recorded.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")


class TraceFormat(StrEnum):
    AZURE = "azure"
    MOONCAKE = "mooncake"


@dataclass(frozen=True)
class TraceRow:
    """One recorded request."""

    arrival_s: float  # as recorded, seconds on the trace's own clock
    prompt_tokens: int
    output_tokens: int
    block_ids: tuple[int, ...] = ()  # Mooncake hash_ids; empty for Azure (no prefix information)


def detect_format(path: Path) -> TraceFormat:
    with path.open(encoding="utf-8") as handle:
        first = next((line.strip() for line in handle if line.strip()), "")
    if first.startswith("{"):
        try:
            keys = set(json.loads(first))
        except ValueError:
            keys = set()
        if set(MOONCAKE_FIELDS) <= keys:
            return TraceFormat.MOONCAKE
    if [c.strip() for c in first.split(",")][: len(AZURE_COLUMNS)] == list(AZURE_COLUMNS):
        return TraceFormat.AZURE
    raise ValueError(f"{path}: neither a Mooncake JSONL trace (JSON lines with {', '.join(MOONCAKE_FIELDS)}) nor an "
                     f"Azure CSV trace (header {','.join(AZURE_COLUMNS)}); first line: {first[:80]!r}")


def recorded_format(path: Path) -> TraceFormat | None:
    """The file's format when it is an Azure or Mooncake trace, else None (e.g. slotune's own JSONL)."""
    try:
        return detect_format(path)
    except ValueError:
        return None


def read_rows(path: Path, trace_format: TraceFormat | None = None) -> list[TraceRow]:
    """Every request of the trace, sorted by arrival (stable: equal timestamps keep file order)."""
    chosen = trace_format or detect_format(path)
    rows = _read_azure(path) if chosen is TraceFormat.AZURE else _read_mooncake(path)
    if not rows:
        raise ValueError(f"{path}: no requests")
    return sorted(rows, key=lambda r: r.arrival_s)


def _read_azure(path: Path) -> list[TraceRow]:
    rows = []
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = set(AZURE_COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: an Azure trace needs columns {', '.join(AZURE_COLUMNS)}; missing "
                             f"{', '.join(sorted(missing))}")
        for number, record in enumerate(reader, start=2):
            try:
                rows.append(TraceRow(_azure_seconds(record["TIMESTAMP"]), _positive(record["ContextTokens"]),
                                     _positive(record["GeneratedTokens"])))
            except ValueError as error:
                raise ValueError(f"{path}:{number}: {error}") from error
    return rows


def _azure_seconds(stamp: str) -> float:
    """Seconds since the epoch of `2023-11-16 18:15:46.6805900` (fractions beyond microseconds are cut)."""
    whole, _, fraction = stamp.strip().partition(".")
    moment = datetime.fromisoformat(whole)
    return moment.timestamp() + (float(f"0.{fraction}") if fraction else 0.0)


def _read_mooncake(path: Path) -> list[TraceRow]:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                missing = [f for f in MOONCAKE_FIELDS if f not in record]
                if missing:
                    raise ValueError(f"missing {', '.join(missing)}")
                rows.append(TraceRow(float(record["timestamp"]) / 1000.0, _positive(record["input_length"]),
                                     _positive(record["output_length"]),
                                     tuple(int(b) for b in record.get("hash_ids", ()))))
            except (ValueError, TypeError) as error:
                raise ValueError(f"{path}:{number}: {error}") from error
    return rows


def _positive(value: object) -> int:
    number = int(str(value).strip())
    if number < 1:
        raise ValueError(f"token counts must be positive, got {number}")
    return number
