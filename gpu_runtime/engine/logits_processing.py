"""Per-request changes to the logits a token is drawn from: `logit_bias` and `min_tokens` (OpenAI and vLLM).

They apply to the distribution that plain sampling and speculative verification draw from, never to the logprobs a
request is sent back: those stay the model's raw logits, as vLLM reports them by default. A request without either
costs nothing here (its rows are passed through, not copied).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from gpu_runtime.config import SamplingParams


def needs_processing(params: SamplingParams, num_output_tokens: int) -> bool:
    return bool(params.logit_bias) or num_output_tokens < params.min_tokens


def processed_rows(
    rows: Sequence[torch.Tensor], params: Sequence[SamplingParams], num_output_tokens: Sequence[int],
    eos_token_ids: Collection[int],
) -> list[torch.Tensor]:
    """rows[i]: logits [k, V] of one sequence, row j choosing its output token number num_output_tokens[i] + j + 1.

    logit_bias is added to every row; while a row's token would be within min_tokens, the tokens that would stop the
    request (EOS unless ignore_eos, and stop_token_ids) get -inf, so a stop can neither be sampled nor accepted as a
    draft.
    """
    out = []
    for row, p, done in zip(rows, params, num_output_tokens, strict=True):
        if not needs_processing(p, done):
            out.append(row)
            continue
        row = row.clone()
        if p.logit_bias:
            ids = torch.tensor([t for t, _ in p.logit_bias], device=row.device)
            bias = torch.tensor([b for _, b in p.logit_bias], device=row.device, dtype=row.dtype)
            row[:, ids] += bias
        num_masked = min(row.shape[0], p.min_tokens - done)
        if num_masked > 0:
            stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
            if stops:
                row[:num_masked, sorted(stops)] = float("-inf")
        out.append(row)
    return out
