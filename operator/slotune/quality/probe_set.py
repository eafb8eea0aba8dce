"""The fixed probe set of the quality gate: short chat conversations whose greedy answers are recorded before an
output-altering change and compared after it.

Chat-like on purpose (a system prompt, a user turn), as served traffic is: a quality loss that shows on chat is one
users see. Four system prompts are each shared by four questions (facts, instructions, arithmetic, code, rewriting),
so the set covers several kinds of text while staying small: 16 conversations of a few dozen tokens each, answered
in `max_tokens` tokens, run in seconds on a CPU. Kept in a module, not a data file, so it ships with the package
whatever the installer copies; change it only knowing that references recorded with the old set no longer compare.
"""

from __future__ import annotations

from dataclasses import dataclass

PROBE_SET_VERSION = 1  # part of a recorded reference: a reference of another version is never compared against


@dataclass(frozen=True)
class Probe:
    system: str
    user: str

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]


_ASSISTANT = "You are a helpful assistant. Answer clearly and briefly."
_TUTOR = "You are a patient tutor for school students. Explain step by step in plain words."
_SUPPORT = ("You are the support agent of an online bookshop. Be polite, keep answers short, and never promise "
            "refunds the policy does not allow: returns within 30 days, unopened books only.")
_CODER = "You are an expert Python programmer. Reply with short, correct code and one sentence of explanation."

PROBES: tuple[Probe, ...] = (
    Probe(_ASSISTANT, "What is the capital of France?"),
    Probe(_ASSISTANT, "Give me three tips for sleeping better."),
    Probe(_ASSISTANT, "Why is the sky blue?"),
    Probe(_ASSISTANT, "Translate 'good morning, my friend' into Spanish."),
    Probe(_TUTOR, "What is 17 times 6?"),
    Probe(_TUTOR, "How do plants make their food?"),
    Probe(_TUTOR, "What is the difference between weather and climate?"),
    Probe(_TUTOR, "Explain what a fraction is."),
    Probe(_SUPPORT, "I bought a book last week and I don't like it. Can I return it?"),
    Probe(_SUPPORT, "My order has not arrived yet. What should I do?"),
    Probe(_SUPPORT, "Do you sell gift cards?"),
    Probe(_SUPPORT, "The cover of my book was torn when it arrived."),
    Probe(_CODER, "Write a function that reverses a string."),
    Probe(_CODER, "How do I read a file line by line?"),
    Probe(_CODER, "Sort a list of numbers in descending order."),
    Probe(_CODER, "Check whether a number is prime."),
)
