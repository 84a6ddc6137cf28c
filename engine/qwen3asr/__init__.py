"""Qwen3-ASR on Aural's engine (issue #23): an audio tower and a Qwen3 language model whose KV arena stays in
the backend's memory (native/qwen3-*), with the official wrapper's prompt, chunking and output parsing
(qwen-asr 0.0.6, inference/qwen3_asr.py and utils.py).

    model = Qwen3AsrModel("qwen3-asr-0.6b.gguf")     # `aural models convert` of a checkpoint directory
    for chunk in transcribe_qwen3(model, samples):   # 16 kHz mono float32
        print(chunk.language, chunk.text)

Live captions: streaming.py (`Qwen3Stream`, `qwen3_live_events`; `aural live -m qwen3-asr.gguf`), the
official streaming's chunks and forced text with the unchanged work of each chunk kept.

No Qt. A model serves one transcription at a time per context; contexts are made per call.
"""

from aural.engine.qwen3asr.model import Qwen3AsrModel, gguf_architecture, language_name
from aural.engine.qwen3asr.text import parse_output
from aural.engine.qwen3asr.transcribe import Qwen3Chunk, split_chunks, transcribe_qwen3

__all__ = ["Qwen3AsrModel", "Qwen3Chunk", "gguf_architecture", "language_name", "parse_output", "split_chunks",
           "transcribe_qwen3"]
