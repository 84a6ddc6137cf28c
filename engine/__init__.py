"""Aural's transcription pipeline: audio, features, tokenizer, decoding, models, metrics (no Qt here)."""

import os

__version__ = "0.1.0"

# ggml's CPU backend synchronises its threads with OpenMP barriers after every graph node. libgomp's
# default wait spins for ~300k iterations, which stalls ggml whenever another process holds a core.
# Measured on the 2-core dev VM, tiny.en decode ms/token, idle / one busy neighbour: default spin
# 5.6 / 728; passive (no spin) 13.2 / 12.7; a 2,000-iteration spin 4.8 / 13.6, fast in both cases.
# libgomp reads this once, when the native module loads it, so it is set before `aural._native` is
# imported (engine modules import it lazily); a value the user set wins.
os.environ.setdefault("GOMP_SPINCOUNT", "2000")
