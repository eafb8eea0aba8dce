"""Log probabilities of generated tokens, for OpenAI's `logprobs` / `top_logprobs` (vLLM's semantics).

A token's logprob is log_softmax of the model's raw logits at the position that produced it, before temperature,
top-k or top-p (vLLM's default `raw_logprobs` mode), so it describes the model, not the sampler. Each generated token
is scored by exactly one logits row, whether it came from a plain decode step, the last chunk of a chunked prefill,
or a verified speculative draft (row j of the verification scores the token at draft position j), so the numbers do
not depend on batching, chunking or speculation beyond floating-point rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its logprob and the num_top most likely tokens at its position (best first)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: torch.Tensor, token_ids: list[int], num_top: list[int]) -> list[TokenLogprob]:
    """logits: [N, V] raw rows; token_ids[i] was emitted from row i; num_top[i] alternatives for it."""
    logprobs = logits.float().log_softmax(dim=-1)  # [N, V]
    ids = torch.tensor(token_ids, device=logits.device)[:, None]  # [N, 1]
    chosen = logprobs.gather(1, ids)[:, 0].tolist()  # [N]
    k = min(max(num_top, default=0), logprobs.shape[-1])
    top_values, top_ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], ids[:, :0])  # [N, k] each
    rows = zip(top_ids.tolist(), top_values.tolist(), strict=True)
    return [
        TokenLogprob(token, value, tuple(zip(row_ids[:n], row_values[:n], strict=True)))
        for token, value, n, (row_ids, row_values) in zip(token_ids, chosen, num_top, rows, strict=True)
    ]


def step_logprobs(
    rows: list[torch.Tensor], tokens: list[list[int]], wanted: list[int | None]
) -> list[list[TokenLogprob] | None]:
    """Per completing sequence of a step: rows[i] its logits [>= len(tokens[i]), V], tokens[i] what it emitted,
    wanted[i] its SamplingParams.logprobs. One log_softmax over all sequences that asked, None for the others."""
    asking = [i for i, n in enumerate(wanted) if n is not None and tokens[i]]
    results: list[list[TokenLogprob] | None] = [None if n is None else [] for n in wanted]
    if not asking:
        return results
    logits = torch.cat([rows[i][: len(tokens[i])] for i in asking])  # [sum of emitted tokens, V]
    flat = token_logprobs(logits, [t for i in asking for t in tokens[i]],
                          [int(wanted[i] or 0) for i in asking for _ in tokens[i]])
    start = 0
    for i in asking:
        results[i], start = flat[start : start + len(tokens[i])], start + len(tokens[i])
    return results
