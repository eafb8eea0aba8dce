"""Prompt-lookup n-gram drafting: propose the tokens that followed the latest earlier occurrence of the context's tail.

Prompt lookup decoding (Saxena 2023, github.com/apoorvumang/prompt-lookup-decoding; vLLM's `ngram` method) costs no
model at all: for n from prompt_lookup_max down to prompt_lookup_min, find the most recent earlier position where
the last n tokens of prompt + output occurred, and draft the up to k tokens that came after it. It pays off when the
output copies from the prompt (summarization, code edits, retrieval-augmented answers) and costs one wasted
verification slot per drafted token otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpu_runtime.speculative.config import SpeculativeSettings


def find_ngram_continuation(token_ids: np.ndarray, n: int, k: int) -> list[int]:
    """Up to k tokens following the latest earlier occurrence of the last n tokens, or [] when there is none."""
    length = token_ids.shape[0]
    if length <= n:
        return []
    tail = token_ids[length - n :]
    # Candidate starts i < length - n (the match must end before the last token), narrowed one position at a time:
    # a few vectorised compares instead of materialising every window.
    starts = np.flatnonzero(token_ids[: length - n] == tail[0])
    for j in range(1, n):
        starts = starts[token_ids[starts + j] == tail[j]]
    if starts.size == 0:
        return []
    follow = int(starts[-1]) + n
    return token_ids[follow : follow + k].tolist()


class NgramProposer:
    """Stateless prompt-lookup proposer; `propose` is called once per sequence per speculative step."""

    def __init__(self, settings: SpeculativeSettings):
        self.k = settings.num_speculative_tokens
        self.min_n = settings.prompt_lookup_min
        self.max_n = settings.prompt_lookup_max

    def propose(self, token_ids: Sequence[int], max_tokens: int | None = None) -> list[int]:
        """Draft for one sequence (prompt + output so far); at most min(k, max_tokens) tokens, maybe none."""
        k = self.k if max_tokens is None else min(self.k, max_tokens)
        if k <= 0:
            return []
        ids = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_n, ids.shape[0] - 1), self.min_n - 1, -1):
            draft = find_ngram_continuation(ids, n, k)
            if draft:
                return draft
        return []
