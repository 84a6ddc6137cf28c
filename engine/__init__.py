"""Aural's transcription pipeline: audio, features, tokenizer, decoding, models, metrics (no Qt here)."""

__version__ = "0.1.0"
