"""Voice activity: Silero VAD's per-frame speech gate for live audio (gate), and the speech regions of a
file that transcription keeps (regions)."""
