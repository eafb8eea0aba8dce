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
        vocab = logits.shape[-1]
        temps = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], device=logits.device)
        scaled = logits / temps[:, None]
        if any(p.top_k or p.top_p < 1.0 for p in params):
            top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=logits.device)
            top_p = torch.tensor([p.top_p for p in params], device=logits.device, dtype=scaled.dtype)
            scaled = _filter_top_k_top_p(scaled, top_k, top_p)
        probs = scaled.softmax(dim=-1)
        noise = self._noise(probs.shape, params, request_ids)
        sampled = (probs / noise).argmax(dim=-1)
        is_greedy = torch.tensor([p.greedy for p in params], device=logits.device)
        return torch.where(is_greedy, greedy, sampled).tolist()

    def _noise(self, shape: torch.Size, params: list[SamplingParams], request_ids: list[str]) -> torch.Tensor:
        noise = torch.empty(shape, device=self.device).exponential_(generator=self._generator)
        for row, (p, rid) in enumerate(zip(params, request_ids, strict=True)):
            if p.seed is not None and not p.greedy:
                gen = self._request_generators.get(rid)
                if gen is None:
                    gen = torch.Generator(device=self.device).manual_seed(p.seed)
                    self._request_generators[rid] = gen
                noise[row].exponential_(generator=gen)
        return noise
