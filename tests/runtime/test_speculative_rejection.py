"""Verification of drafts: greedy matching and the distribution-preserving rejection sampler (seeded chi-square)."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from gpu_runtime.speculative.rejection import pad_drafts, rejection_sample, verify_greedy

VOCAB = 6
K = 3
ROWS = 40_000
P_VALUE_FLOOR = 1e-3  # seeded, so deterministic; a correct sampler sits far above this on these seeds


def _onehot_logits(ids: list[list[int]]) -> torch.Tensor:
    logits = torch.zeros(len(ids), len(ids[0]), VOCAB)
    for b, row in enumerate(ids):
        for i, t in enumerate(row):
            logits[b, i, t] = 5.0
    return logits


def test_greedy_accepts_the_matching_prefix_then_takes_the_target_token() -> None:
    target = _onehot_logits([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [5, 0, 0, 0]])
    drafts, num = pad_drafts([[1, 2, 3], [1, 0, 3], [], [5, 5]])
    out = verify_greedy(target, drafts, num)
    assert out.num_accepted == [3, 1, 0, 1]
    assert out.output_token_ids == [[1, 2, 3, 4], [1, 2], [1], [5, 0]]


def _stat_setup(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    p = torch.distributions.Dirichlet(torch.ones(VOCAB)).sample((K + 1,))  # [K+1, V] target, context-free
    q = torch.distributions.Dirichlet(torch.ones(VOCAB)).sample((K,))  # [K, V] draft
    drafts = torch.stack([torch.multinomial(q[i], ROWS, replacement=True, generator=gen) for i in range(K)], dim=1)
    return p, q, drafts


def _assert_positions_follow(outputs: list[list[int]], p: torch.Tensor) -> None:
    """Token i of every output that reached position i must be distributed as p[i]."""
    for i in range(K + 1):
        tokens = torch.tensor([o[i] for o in outputs if len(o) > i])
        assert tokens.numel() > 500, f"too few samples reach position {i} for a meaningful test"
        observed = torch.bincount(tokens, minlength=VOCAB).double()
        probs = p[i].double()
        expected = probs / probs.sum() * observed.sum()
        assert chisquare(observed.numpy(), expected.numpy()).pvalue > P_VALUE_FLOOR, f"position {i}"


def test_rejection_sampling_keeps_the_target_distribution_with_a_model_draft() -> None:
    torch.manual_seed(1234)
    p, q, drafts = _stat_setup(seed=7)
    out = rejection_sample(p.expand(ROWS, -1, -1), drafts, torch.full((ROWS,), K), draft_probs=q.expand(ROWS, -1, -1))
    _assert_positions_follow(out.output_token_ids, p)
    # Theorem 3.5 of Leviathan et al.: P(accept at a position) = sum_x min(p(x), q(x)).
    expected_rate = torch.minimum(p[0], q[0]).sum().item()
    rate = sum(a > 0 for a in out.num_accepted) / ROWS
    assert abs(rate - expected_rate) < 4 * (expected_rate * (1 - expected_rate) / ROWS) ** 0.5


def test_rejection_sampling_keeps_the_target_distribution_with_a_deterministic_draft() -> None:
    torch.manual_seed(99)
    p, _, _ = _stat_setup(seed=11)
    drafts = torch.tensor([[int(p[i].argmax()) for i in range(K)]]).expand(ROWS, -1)  # likely tokens: long accepts
    out = rejection_sample(p.expand(ROWS, -1, -1), drafts, torch.full((ROWS,), K))
    _assert_positions_follow(out.output_token_ids, p)


def test_the_chi_square_check_has_power_against_a_sampler_that_keeps_the_draft() -> None:
    p, _q, drafts = _stat_setup(seed=7)
    observed = torch.bincount(drafts[:, 0], minlength=VOCAB).double()
    probs = p[0].double()
    assert chisquare(observed.numpy(), (probs / probs.sum() * ROWS).numpy()).pvalue < 1e-9


def test_seeded_rows_reproduce_and_ignore_the_global_rng() -> None:
    p, q, drafts = _stat_setup(seed=3)
    rows = 64

    def run(global_seed: int) -> list[list[int]]:
        torch.manual_seed(global_seed)
        gens = [torch.Generator().manual_seed(b) for b in range(rows)]
        return rejection_sample(
            p.expand(rows, -1, -1), drafts[:rows], torch.full((rows,), K), q.expand(rows, -1, -1), gens
        ).output_token_ids

    assert run(0) == run(1)


@pytest.mark.parametrize("num_draft", [0, 1, 3])
def test_one_hot_target_makes_rejection_sampling_greedy(num_draft: int) -> None:
    target = _onehot_logits([[4, 1, 2, 0]]) * 100
    drafts, num = pad_drafts([[4, 1, 3][:num_draft]])
    sampled = rejection_sample(torch.softmax(target, dim=-1), drafts, num)
    assert sampled == verify_greedy(target, drafts, num)
