"""Speculative decoding: draft proposers (prompt lookup, draft model) and verification against the target."""

from gpu_runtime.speculative.config import SpecMethod, SpeculativeSettings, parse_speculative_config
from gpu_runtime.speculative.ngram import NgramProposer
from gpu_runtime.speculative.rejection import VerifyOutput, pad_drafts, rejection_sample, verify_greedy

__all__ = [
    "NgramProposer",
    "SpecMethod",
    "SpeculativeSettings",
    "VerifyOutput",
    "pad_drafts",
    "parse_speculative_config",
    "rejection_sample",
    "verify_greedy",
]
