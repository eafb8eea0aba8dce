"""Verdicts on a change: did it help, hurt, or is it too soon to say, and does the SLO hold with confidence.

`verification` judges a change before/after (one window of the old config against one of the new), `canary` judges a
canary pod against its siblings over the same window, `canary_pool` pools a canary's inconclusive windows,
`canary_noise` measures the pods' A/A spread the canary test must clear, `slo_bound` bounds a percentile over
several met windows (convergence with confidence), `attainment` reports the share of requests within each target,
and `compare` holds the two-sample quantile tests they share. Nothing here chooses a change: that is `policy`.
"""
