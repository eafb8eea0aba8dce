"""Commands about the TunedModel API itself, run without a cluster: `crdgen` (the CRD), `apidocs` (the field
reference in markdown) and `validate` (a manifest checked the way the API server would). `slotune.cli` dispatches.
"""
