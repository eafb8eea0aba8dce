"""Tuner benchmark: scenarios, strategies (slotune, grid, random, TPE), the exhaustive oracle and the report."""
