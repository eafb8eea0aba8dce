"""The trace benchmark: slotune against the replica autoscalers people run, on replayed production traces, in the
continuous simulation (`slotune bench-traces`)."""
