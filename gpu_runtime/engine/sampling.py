"""Token sampling for a batch of logits rows: greedy (temperature 0), temperature, top-k, top-p, and per-request
seeds. Sampling uses the exponential race (argmax of p / Exp(1) noise, equivalent to drawing from p, as in vLLM and
gpt-fast), so a seeded request draws its noise from its own generator and gets the same tokens whatever its batch.
"""

from __future__ import annotations

import torch

from gpu_runtime.config import SamplingParams


def _filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k and top-p nucleus to -inf. top_k: [N] (vocab = off), top_p: [N]."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    remove = ranks >= top_k[:, None]
    probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
    # Drop a token when the mass before it already reaches top_p; the top token is always kept.
    remove |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
    remove[:, 0] = False
    return logits.scatter(-1, order, sorted_logits.masked_fill(remove, float("-inf")))


def processed_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The distribution each row samples from: softmax of logits / temperature after top-k and top-p filtering.

    Greedy rows use temperature 1 here (callers take their argmax instead). Speculative verification needs exactly
    this distribution for the target and the draft.
    """
    vocab = logits.shape[-1]
    temps = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], device=logits.device)
    scaled = logits / temps[:, None]
    if any(p.top_k or p.top_p < 1.0 for p in params):
        top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=logits.device)
        top_p = torch.tensor([p.top_p for p in params], device=logits.device, dtype=scaled.dtype)
        scaled = _filter_top_k_top_p(scaled, top_k, top_p)
    return scaled.softmax(dim=-1)


class Sampler:
    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self._generator = torch.Generator(device=device).manual_seed(seed)
        self._request_generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._request_generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, params: list[SamplingParams], request_ids: list[str]) -> list[int]:
        """logits: float32 [N, vocab], one row per request -> N token ids."""
        greedy = logits.argmax(dim=-1)
        if all(p.greedy for p in params):
            return greedy.tolist()
        probs = processed_probs(logits, params)
        noise = self._noise(probs.shape, params, request_ids)
        sampled = (probs / noise).argmax(dim=-1)
        is_greedy = torch.tensor([p.greedy for p in params], device=logits.device)
        return torch.where(is_greedy, greedy, sampled).tolist()

    def _noise(self, shape: torch.Size, params: list[SamplingParams], request_ids: list[str]) -> torch.Tensor:
        noise = torch.empty(shape, device=self.device).exponential_(generator=self._generator)
        for row, (p, rid) in enumerate(zip(params, request_ids, strict=True)):
            gen = self.generator(rid, p)
            if gen is not None:
                noise[row].exponential_(generator=gen)
        return noise

    def generator(self, request_id: str, params: SamplingParams) -> torch.Generator | None:
        """The request's own generator when it is seeded and sampled (None otherwise), created on first use."""
        if params.seed is None or params.greedy:
            return None
        gen = self._request_generators.get(request_id)
        if gen is None:
            gen = torch.Generator(device=self.device).manual_seed(params.seed)
            self._request_generators[request_id] = gen
        return gen
