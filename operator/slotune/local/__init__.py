"""Local mode: `slotune tune FILE` runs the tuning loop against runtime processes on this machine."""
