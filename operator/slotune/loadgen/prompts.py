"""Prompt text for planned requests, and replay of recorded traces.

The client does not know the server's tokenizer, so a prompt of N tokens is made of short common words (" the",
" of", ...), which large BPE vocabularies encode as about one token each; small vocabularies split them. The runner
measures the server's tokens per word on its warm-up requests (`usage.prompt_tokens`) and scales the word counts, so
planned lengths hold on any tokenizer.
Requests of one prefix group start with byte-identical text (seeded by the group) so a prefix cache can hit, and so
do a replayed trace's requests block for block where their prompt block ids agree (`block_text`); every request's
own suffix starts with a unique marker so prompts never share more than the planned prefix.
With `promptText: chat` the same lengths are written from real chat text instead (chat_prompts.json, shipped with
slotune): a group's prefix from its system prompt, a request's suffix from user messages picked by its seed, cut at
the planned word count (a message runs on into the next where it is short). The calibration then measures that
text's tokens per word, since it sends prompts of the same kind.
A trace is JSONL, one request per line: `timestamp` (seconds), `prompt` (text) or `prompt_tokens` (a length), and
`output_tokens`; or a recorded production trace, Azure CSV or Mooncake JSONL, read by `slotune.traces`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np

from slotune.traces import TraceReplay, plan_trace, recorded_format
from slotune.workload import PlannedRequest, PromptText

BLOCK_SEED = 7_919  # seeds a trace block's words apart from prefix groups' and suffixes'
WORDS = ("the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
         "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you")


@dataclass(frozen=True)
class PromptedRequest:
    planned: PlannedRequest
    prompt: str


def words(num_tokens: int, seed: int | tuple[int, ...]) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), num_tokens))


@dataclass(frozen=True)
class ChatText:
    """The shipped chat-style text: system prompts (shared prefixes) and user messages (each request's own part)."""

    system: tuple[tuple[str, ...], ...]  # each prompt as its words
    user: tuple[tuple[str, ...], ...]


@cache
def chat_text() -> ChatText:
    raw = json.loads(resources.files("slotune.loadgen").joinpath("chat_prompts.json").read_text(encoding="utf-8"))
    return ChatText(tuple(tuple(p.split()) for p in raw["system"]), tuple(tuple(p.split()) for p in raw["user"]))


def _run_on(texts: tuple[tuple[str, ...], ...], first: int, num_words: int) -> str:
    """num_words words from texts[first], running on into the next texts (cyclically) where it is shorter."""
    out: list[str] = []
    i = first
    while len(out) < num_words:
        out.extend(texts[i % len(texts)])
        i += 1
    return " ".join(out[:num_words])


def system_prefix(group: int, num_words: int) -> str:
    """A prefix group's shared text: its system prompt; groups beyond the shipped prompts are told apart by a
    leading line naming the group, so two groups never share their prefix."""
    system = chat_text().system
    lead = [] if group < len(system) else ["Deployment", f"{group // len(system) + 1}."]
    return " ".join([*lead, *_run_on(system, group, num_words).split()][:num_words])


def user_text(num_words: int, seed: int | tuple[int, ...]) -> str:
    """num_words words of user messages, starting at a message picked by the seed."""
    user = chat_text().user
    return _run_on(user, int(np.random.default_rng(seed).integers(0, len(user))), num_words)


def prompt_for(request: PlannedRequest, index: int, seed: int = 0, tokens_per_word: float = 1.0,
               text: PromptText = PromptText.WORDS) -> str:
    """About `request.prompt_tokens` tokens: the group's shared prefix, then a per-request suffix."""

    def num_words(tokens: int) -> int:
        return max(1, round(tokens / tokens_per_word))

    prefix = ""
    if request.prefix_block_ids:
        prefix = block_text(request.prefix_block_ids, request.shared_prefix_tokens, tokens_per_word) + " "
    elif request.prefix_group is not None and request.shared_prefix_tokens > 0:
        prefix_words = num_words(request.shared_prefix_tokens)
        prefix = (system_prefix(request.prefix_group, prefix_words) if text is PromptText.CHAT
                  else words(prefix_words, seed=1_000_003 * (request.prefix_group + 1))) + " "
    suffix_tokens = max(1, request.prompt_tokens - request.shared_prefix_tokens)
    # Warm-up requests have negative indices and numpy seeds must be non-negative: wrap into uint32.
    suffix_seed = (seed % 2**32, index % 2**32)
    own = user_text if text is PromptText.CHAT else words
    return prefix + f"#{index} " + own(num_words(suffix_tokens) - 1, seed=suffix_seed)


def block_text(block_ids: Sequence[int], num_tokens: int, tokens_per_word: float = 1.0) -> str:
    """A replayed trace's shared prompt blocks as text: each block id always gives the same words, so requests whose
    ids agree share their text block for block (and a prefix cache hits on it)."""
    per_block = max(1, round(num_tokens / max(len(block_ids), 1) / tokens_per_word))
    return " ".join(words(per_block, seed=(BLOCK_SEED, block_id % 2**32)) for block_id in block_ids)


def tokens_per_word(planned_tokens: Sequence[int], served_tokens: Sequence[int]) -> float:
    """The server's tokens per prompt word, from requests sent at one token per word; rounded, so a prefix group
    keeps one word count (and stays cacheable) across windows."""
    planned, served = sum(planned_tokens), sum(served_tokens)
    if planned <= 0 or served <= 0:
        return 1.0
    return round(min(max(served / planned, 0.25), 8.0), 1)


@dataclass(frozen=True)
class TraceRequest:
    planned: PlannedRequest
    prompt: str | None  # recorded text, when the trace has it


def load_trace(path: Path, replay: TraceReplay | None = None) -> list[TraceRequest]:
    """Requests of a trace, arrival times shifted so the first is at 0 and sorted: slotune's JSONL, or an Azure CSV or
    Mooncake JSONL trace (slotune.traces), which `replay` may cut, time-scale and length-limit."""
    if recorded_format(path) is not None or replay is not None:
        chosen = replay or TraceReplay(path)
        return [TraceRequest(r, None) for r in plan_trace(chosen).requests]
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows.append(_trace_row(row))
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}:{number}: {error}") from error
    rows.sort(key=lambda r: r.planned.arrival_s)
    start_s = rows[0].planned.arrival_s if rows else 0.0
    return [TraceRequest(_shifted(r.planned, start_s), r.prompt) for r in rows]


def _trace_row(row: dict) -> TraceRequest:
    prompt = row.get("prompt")
    if prompt is None and "prompt_tokens" not in row:
        raise KeyError("each line needs prompt or prompt_tokens")
    prompt_tokens = int(row["prompt_tokens"]) if "prompt_tokens" in row else len(str(prompt).split())
    output_tokens = int(row["output_tokens"])
    if prompt_tokens < 1 or output_tokens < 1:
        raise ValueError("prompt_tokens and output_tokens must be positive")
    planned = PlannedRequest(float(row["timestamp"]), prompt_tokens, output_tokens, None, 0)
    return TraceRequest(planned, None if prompt is None else str(prompt))


def _shifted(request: PlannedRequest, start_s: float) -> PlannedRequest:
    return PlannedRequest(request.arrival_s - start_s, request.prompt_tokens, request.output_tokens,
                          request.prefix_group, request.shared_prefix_tokens)
