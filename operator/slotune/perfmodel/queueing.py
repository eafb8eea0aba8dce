"""Erlang C: how often an arrival finds every batch slot taken.

A replica admits up to max_num_seqs sequences; with Poisson arrivals and `busy` slots in use on average (the
offered load in slots, Little's law: arrival rate x time a sequence holds its slot), the share of arrivals that find
all `slots` taken and wait is Erlang's C formula for an M/M/c queue. It is what makes a small batch bind the tail at
a low mean: 4 slots at 1.5 busy on average are all taken for ~7% of arrivals, which a P99 first-token target feels,
where 64 slots at 20 busy almost never are.
"""

from __future__ import annotations


def erlang_c(slots: int, busy: float) -> float:
    """Share of arrivals that wait for a slot, with `busy` slots in use on average; 1.0 where the load is at or
    above the slots (the queue grows)."""
    if slots < 1 or busy >= slots:
        return 1.0
    if busy <= 0.0:
        return 0.0
    blocked = 1.0  # Erlang B by its recursion over the slots: stable where the closed form overflows
    for k in range(1, slots + 1):
        blocked = busy * blocked / (k + busy * blocked)
    utilisation = busy / slots
    return blocked / (1.0 - utilisation * (1.0 - blocked))
