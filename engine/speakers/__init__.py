"""Speaker diarization: who spoke when (pipeline.py), from pyannote's segmentation model on onnxruntime
(segmentation.py) and CAM++ speaker embeddings on Aural's ggml engine (campplus.py, fbank.py), clustered
(clustering.py); weights.py installs the models on the user's request."""

from aural.engine.speakers.pipeline import DiarizeOptions, Diarizer, Turn, assign_speakers, speaker_label

__all__ = ["DiarizeOptions", "Diarizer", "Turn", "assign_speakers", "speaker_label"]
