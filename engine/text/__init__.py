"""Text in and out of the model: Whisper's tokenizer, the Chinese script of a transcript, and the
transcript writers (txt, srt, vtt, tsv, json)."""
