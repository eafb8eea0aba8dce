"""Serving a model from one GGUF file (llama.cpp's format): its shape, weights, special tokens and chat template all
come from the file. `reader` opens it, `config` maps its metadata onto `ModelConfig`, `weights` dequantizes its
tensors into `LlamaModel`; gpu_runtime.tokenizer.gguf rebuilds its byte-level BPE tokenizer.
"""
