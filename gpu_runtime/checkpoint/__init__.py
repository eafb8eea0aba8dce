"""Where weights come from: what a model path holds (`files`: a Hugging Face directory or a GGUF file, `gguf/`),
where a `--model` argument points (`source`: paths, builtin://, pkg://), and the deterministic tiny checkpoints that
tests and local mode generate (`builtin`).
"""
