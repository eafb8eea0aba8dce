"""Text to token ids and back: `tokenizer` (encode, incremental detokenization), read from a checkpoint directory
(`files`) or rebuilt from a GGUF file's vocabulary (`gguf`); `settings` holds what both readers produce besides the
vocabulary.
"""
