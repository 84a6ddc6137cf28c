"""How fast each catalog model would run on this machine, for the Models dialog: measured, never invented.

The reference is one 30 s encoder pass of the loaded model, timed here (`workers.EncoderProbe`). Another
model's time is that scaled by its parameter count: the proxy for encoder multiply-accumulates the catalog
gives. It leaves decoding out and treats every weight type alike, so it is labelled an estimate. A model
that has transcribed a file in this run shows that file's real-time factor instead, decoding included.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SpeedReference", "Speeds"]

_WINDOW_S = 30.0  # audio seconds in one encoder window


@dataclass(frozen=True)
class SpeedReference:
    """One timed encoder pass.

    Attributes:
        model: the catalog name of the model timed.
        device: the compute device it ran on.
        parameters: its parameter count (the catalog's).
        encoder_s: seconds for one 30 s window.
    """

    model: str
    device: str
    parameters: int
    encoder_s: float


def _describe(rtf: float) -> str:
    """rtf (processing seconds per audio second) as a person reads it."""
    if rtf <= 1.0:
        return f"≈ {1 / max(rtf, 1e-3):.0f}× faster than real time"
    return f"≈ {rtf * 60:.0f} s per minute of audio"


class Speeds:
    """The reference pass and the real-time factors measured on files, by catalog name."""

    def __init__(self):
        self.reference: SpeedReference | None = None
        self._measured: dict[str, float] = {}

    def record_run(self, model: str, rtf: float) -> None:
        """A file transcribed by `model` in `rtf` (wall / audio seconds)."""
        if rtf > 0:
            self._measured[model] = rtf

    def text(self, model: str, parameters: int | None) -> tuple[str, str]:
        """(cell text, tooltip) for `model` of `parameters` weights."""
        if model in self._measured:
            return (f"{_describe(self._measured[model])} (measured)",
                    "Measured on a file this model transcribed here, decoding included.")
        ref = self.reference
        if ref is None:
            return "—", "Measured once a catalog model (tiny.en, the default) is loaded."
        if not parameters:
            return "—", "The catalog does not give this model's size."
        rtf = ref.encoder_s * parameters / ref.parameters / _WINDOW_S
        return (f"{_describe(rtf)} (estimate)",
                f"{ref.model} encoded 30 s of audio in {ref.encoder_s:.2f} s on {ref.device}; scaled by "
                "parameter count. Decoding adds to it; transcribe a file with the model for a measured figure.")
