"""The engine: `llm_engine.LLMEngine` (requests in, one step at a time, outputs out) over the `scheduler` (which
sequences run this step, with their KV blocks from `block_manager`) and the `model_runner` (one forward pass on the
device). `scheduler`, `sequence` and `block_manager` are pure Python and never import torch; modules are imported
directly, so importing this package loads nothing.
"""
