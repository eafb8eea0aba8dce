"""The Kubernetes operator: kopf handlers (handlers.py) that deploy a TunedModel's runtime and drive slotune.loop."""
