"""Aural's transcription pipeline: audio, features, tokenizer, decoding, models, metrics (no Qt here)."""

import os

__version__ = "0.1.0"

# ggml's CPU backend synchronises its threads with OpenMP barriers after every graph node. libgomp's
# default (spinning) wait turns into a stall whenever another process holds a core: measured on the
# 2-core dev machine with one busy neighbour, tiny.en decode went from 10 ms to 730 ms per token.
# Passive waiting costs little when idle and keeps a desktop app usable under load. libgomp reads this
# once, when the native module loads it, so it is set before `aural._native` is imported (every
# engine module imports it lazily); a value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
