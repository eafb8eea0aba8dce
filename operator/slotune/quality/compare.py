"""Compares a candidate config's probe answers with the reference's: how far did the change move the outputs?

Greedy decoding feeds each token back, so after the first token where two answers differ their contexts differ and
nothing later compares. The measures therefore look only where both models saw the same text:
- token agreement: tokens generated before the first divergence, over the longer answer's length (pooled over the
  probes): 1.0 means every answer came out identical;
- top-1 agreement: of the positions with a shared context (the common prefix and the divergent position), the share
  whose most likely token is the same;
- mean KL (nats) at those positions, KL(reference || candidate) with both distributions coarsened to the reference's
  top tokens plus one bucket for the rest of the vocabulary. Coarsening never increases a KL (the data-processing
  inequality), so this reads low rather than high; a candidate token missing from the candidate's top list is
  given the smallest probability it could have had (its last listed one, or what the list leaves over).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slotune.quality.record import ProbeAnswer, QualityRecord, TokenChoice

_MIN_PROB = 1e-9  # floor of a probability before its log: a bucket a top list leaves empty is not impossible


@dataclass(frozen=True)
class QualityMeasurement:
    token_agreement: float
    top1_agreement: float
    mean_kl: float
    identical: int  # probes answered identically
    num_probes: int
    positions: int  # shared-context positions the top-1 agreement and the KL are taken over

    def describe(self) -> str:
        return (f"token agreement {self.token_agreement:.2f}, top-1 agreement {self.top1_agreement:.3f}, "
                f"mean KL {self.mean_kl:.4f} nats, {self.identical}/{self.num_probes} answers identical")


def compare(reference: QualityRecord, candidate: QualityRecord) -> QualityMeasurement:
    if (reference.probe_set_version, reference.max_tokens, len(reference.answers)) != (
            candidate.probe_set_version, candidate.max_tokens, len(candidate.answers)):
        raise ValueError("the records answer different probe sets or lengths and do not compare")
    agreed = total = top1 = positions = identical = 0
    kl_sum = 0.0
    for ref, cand in zip(reference.answers, candidate.answers, strict=True):
        common = _common_prefix(ref, cand)
        agreed += common
        total += max(len(ref.tokens), len(cand.tokens))
        identical += common == len(ref.tokens) == len(cand.tokens)
        for r, c in zip(ref.tokens[:common + 1], cand.tokens[:common + 1], strict=False):
            positions += 1
            top1 += _top1(r) == _top1(c)
            kl_sum += kl(r, c)
    return QualityMeasurement(
        token_agreement=agreed / total if total else 1.0, top1_agreement=top1 / positions if positions else 1.0,
        mean_kl=kl_sum / positions if positions else 0.0, identical=identical, num_probes=len(reference.answers),
        positions=positions)


def _common_prefix(a: ProbeAnswer, b: ProbeAnswer) -> int:
    for i, (x, y) in enumerate(zip(a.tokens, b.tokens, strict=False)):
        if x.token != y.token:
            return i
    return min(len(a.tokens), len(b.tokens))


def _distribution(choice: TokenChoice) -> dict[str, float]:
    """Token text -> probability, the chosen token included (an engine may list it among the top or not)."""
    probs = {token: math.exp(logprob) for token, logprob in choice.top}
    probs.setdefault(choice.token, math.exp(choice.logprob))
    return probs


def _top1(choice: TokenChoice) -> str:
    probs = _distribution(choice)
    return max(probs, key=probs.__getitem__)


def kl(reference: TokenChoice, candidate: TokenChoice) -> float:
    """KL(p || q) over the reference's listed tokens plus one bucket for every other token, in nats."""
    p, q_listed = _distribution(reference), _distribution(candidate)
    q_unlisted = max(min(min(q_listed.values()), 1.0 - sum(q_listed.values())), _MIN_PROB)
    q = {token: q_listed.get(token, q_unlisted) for token in p}
    p_rest = max(1.0 - sum(p.values()), _MIN_PROB)
    q_rest = max(1.0 - sum(q.values()), _MIN_PROB)
    divergence = sum(pt * math.log(pt / max(q[t], _MIN_PROB)) for t, pt in p.items() if pt > 0)
    return max(divergence + p_rest * math.log(p_rest / q_rest), 0.0)
