"""Verification of drafted tokens against the target model: greedy matching and rejection sampling.

Both take, per sequence b, the target's distribution at each of the num_draft[b] + 1 positions that the single
verification forward pass scored (the last one is the "bonus" position after the final draft) and return the
accepted drafts followed by exactly one token chosen by the target, so every step emits 1..k+1 tokens.

Rejection sampling is speculative sampling (Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via
Speculative Decoding", Algorithm 1 / Theorem 1; Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling", Algorithm 2): draft x_i ~ q_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the
first rejection the replacement is drawn from norm(max(0, p_i - q_i)); if all are accepted a bonus token is drawn
from p_{k+1}. The emitted tokens are then distributed exactly as sampling from p autoregressively. A prompt-lookup
draft is deterministic, i.e. q_i is one-hot at x_i: acceptance becomes p_i(x_i) and the residual is p_i with x_i
removed. Greedy verification is the temperature -> 0 limit: accept while the draft equals the target's argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VerifyOutput:
    """Per sequence: the tokens to append (accepted drafts, then one target token) and how many drafts were kept."""

    output_token_ids: list[list[int]]
    num_accepted: list[int]


def _num_accepted(accept: torch.Tensor, num_draft: torch.Tensor) -> torch.Tensor:
    """Length of the all-accepted prefix of each row of `accept` [B, K], counting only the first num_draft[b]."""
    k = accept.shape[1]
    valid = torch.arange(k, device=accept.device)[None, :] < num_draft[:, None]  # [B, K]
    return torch.cumprod((accept & valid).to(torch.int64), dim=1).sum(dim=1)  # [B]


def _assemble(draft_token_ids: torch.Tensor, num_accepted: torch.Tensor, last_token: torch.Tensor) -> VerifyOutput:
    drafts = draft_token_ids.tolist()
    accepted = num_accepted.tolist()
    last = last_token.tolist()
    outputs = [[*row[:a], t] for row, a, t in zip(drafts, accepted, last, strict=True)]
    return VerifyOutput(outputs, accepted)


def verify_greedy(target_logits: torch.Tensor, draft_token_ids: torch.Tensor, num_draft: torch.Tensor) -> VerifyOutput:
    """target_logits [B, K+1, V]; draft_token_ids [B, K] (padding past num_draft[b] is ignored); num_draft [B]."""
    target_ids = target_logits.argmax(dim=-1)  # [B, K+1]
    k = draft_token_ids.shape[1]
    num_accepted = _num_accepted(target_ids[:, :k] == draft_token_ids, num_draft)
    last = target_ids.gather(1, num_accepted[:, None]).squeeze(1)  # correction at the first mismatch, or the bonus
    return _assemble(draft_token_ids, num_accepted, last)


def _uniform(num_draft: torch.Tensor, width: int, generators: Sequence[torch.Generator | None] | None):
    """[B, width] uniforms in [0, 1). A row with its own generator (a seeded request) draws exactly num_draft[b]
    from it, so what a seeded request consumes never depends on the other requests in the batch."""
    u = torch.rand((num_draft.shape[0], width), device=num_draft.device)
    for b, gen in enumerate(generators or ()):
        if gen is not None:
            n = int(num_draft[b])
            u[b, :n] = torch.rand(n, generator=gen, device=num_draft.device)
    return u


def _exponential(shape: tuple[int, int], generators: Sequence[torch.Generator | None] | None, device: torch.device):
    e = torch.empty(shape, device=device).exponential_()
    for b, gen in enumerate(generators or ()):
        if gen is not None:
            e[b] = torch.empty(shape[1], device=device).exponential_(generator=gen)
    return e


def rejection_sample(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    generators: Sequence[torch.Generator | None] | None = None,
) -> VerifyOutput:
    """Speculative sampling for a batch.

    target_probs [B, K+1, V] (after the request's temperature/top-k/top-p); draft_token_ids [B, K]; num_draft [B];
    draft_probs [B, K, V] for a model draft, or None for a deterministic (n-gram) draft.
    """
    batch, k = draft_token_ids.shape
    device = target_probs.device
    ids = draft_token_ids[:, :, None]  # [B, K, 1]
    p_x = target_probs[:, :k].gather(2, ids).squeeze(2)  # [B, K]
    q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs.gather(2, ids).squeeze(2)
    # u < p/q happens with probability min(1, p/q); written multiplied out so q = 0 never divides.
    accept = _uniform(num_draft, k, generators) * q_x < p_x
    num_accepted = _num_accepted(accept, num_draft)  # [B]
    rows = torch.arange(batch, device=device)
    p_last = target_probs[rows, num_accepted]  # [B, V]
    rejected = num_accepted < num_draft  # [B]; otherwise every draft was accepted and p_last is the bonus position
    if draft_probs is None:
        q_last = torch.zeros_like(p_last)
        q_last[rows, draft_token_ids[rows, num_accepted.clamp(max=k - 1)]] = 1.0
    else:
        q_last = draft_probs[rows, num_accepted.clamp(max=k - 1)]
    residual = (p_last - q_last).clamp(min=0)
    # A zero residual means p == q there, where rejection has probability 0; fall back to p against rounding.
    residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, p_last)
    dist = torch.where(rejected[:, None], residual, p_last)
    # Exponential-race sampling: argmax(w / E) with E ~ Exp(1) picks index i with probability w_i / sum(w).
    last = (dist / _exponential(tuple(dist.shape), generators, device)).argmax(dim=1)
    return _assemble(draft_token_ids, num_accepted, last)


def pad_drafts(
    drafts: Sequence[Sequence[int]], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged drafts -> (draft_token_ids [B, K] zero-padded, num_draft [B]) with K the longest draft (at least 1).

    The target tensors passed with them must be [B, K+1, V] for this K (positions past num_draft[b] + 1 are ignored).
    """
    k = max((len(d) for d in drafts), default=0)
    padded = torch.zeros((len(drafts), max(k, 1)), dtype=torch.int64)
    for b, draft in enumerate(drafts):
        padded[b, : len(draft)] = torch.tensor(list(draft), dtype=torch.int64)
    num = torch.tensor([len(d) for d in drafts], dtype=torch.int64)
    return padded.to(device), num.to(device)
