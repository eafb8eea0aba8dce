"""Speculative decoding: settings (config), draft proposers (ngram, draft), verification (rejection), and the
engine-side orchestration (decoder). Submodules are imported directly: `config` stays free of torch so the engine's
pure-Python layers can import the settings type.
"""
