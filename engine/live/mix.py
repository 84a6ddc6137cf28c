"""Several live inputs summed into one stream: a microphone and what the computer plays, for meetings.

    source = MixSource([open_input("alsa_input.usb-mic"), open_input("alsa_output.pci.monitor")])
    source.start()
    samples = source.read()  # 16 kHz float32: the sum of both inputs
    source.levels            # each input's RMS over the samples last mixed, for its own meter
    source.inputs[1].dropped_blocks

Each input keeps its own ring, resampler and drop counter (capture._RingSource); the mix is made in
`read()`, on the consumer's thread, so the audio callbacks still only copy. Inputs deliver in blocks of
their own size and timing (an idle PulseAudio null sink renders in 2 s blocks, docs/testing-gui-and-audio.md),
so the mix waits for the slowest input up to `max_skew_s`. Past that, the late input counts as silent for
the samples it owes, and a stalled input delays the captions by at most `max_skew_s`. When it catches up
with a burst, as many of its samples as it owes are dropped from the part that would run ahead of the
others, so the inputs are in step again; one that is always late by more (a source with a long latency)
is heard that much later, with nothing dropped.

Threads: start(), read() and stop() from one consumer thread, as for every source.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..audio import SAMPLE_RATE

__all__ = ["MAX_SKEW_S", "MIX_PREFIX", "MixSource", "mix_name", "mix_parts"]

# The most one input may run ahead of another before the late one counts as silent: a PulseAudio source
# delivers every 0.1 s (capture.MicrophoneSource's block), so 0.5 s is several blocks of scheduling jitter
# and well under live decoding's 1 s step.
MAX_SKEW_S = 0.5


# A mix as one input name, for pickers and settings: "mix:" and the inputs' names joined by "|", which
# PulseAudio's source names ("alsa_input.usb-...", "vsink.monitor") never hold.
MIX_PREFIX = "mix:"
_MIX_JOIN = "|"


def mix_name(names: Sequence[str]) -> str:
    return MIX_PREFIX + _MIX_JOIN.join(names)


def mix_parts(name: str) -> list[str] | None:
    """The input names of a `mix_name`; None for the name of a single input."""
    return name[len(MIX_PREFIX):].split(_MIX_JOIN) if name.startswith(MIX_PREFIX) else None


class MixSource:
    """The sum of `inputs` (capture sources at 16 kHz), read like one source.

    Attributes:
        inputs: the sources mixed, in the order given.
        levels: each input's RMS (0..1) over the samples last returned by `read()`.
        silent_samples: per input, 16 kHz samples counted as silent because it lagged past max_skew_s.
        samples_read: 16 kHz samples returned by `read()` since `start()`.
    """

    def __init__(self, inputs: Sequence, *, max_skew_s: float = MAX_SKEW_S):
        if len(inputs) < 2:
            raise ValueError(f"a mix needs at least two inputs, got {len(inputs)}")
        self.inputs = list(inputs)
        self.samplerate = SAMPLE_RATE
        self.max_skew = round(max_skew_s * SAMPLE_RATE)
        self._reset()

    def _reset(self) -> None:
        n = len(self.inputs)
        self.levels = [0.0] * n
        self.silent_samples = [0] * n
        self.samples_read = 0
        self._pending = [np.zeros(0, dtype=np.float32) for _ in range(n)]
        self._owed = [0] * n  # samples counted silent that the input has not delivered yet

    @property
    def dropped_blocks(self) -> int:
        return sum(self.dropped_by_input)

    @property
    def dropped_by_input(self) -> list[int]:
        """Each input's dropped blocks, in the mix's order (a meeting's lost microphone audio apart from the
        system audio's)."""
        return [source.dropped_blocks for source in self.inputs]

    @property
    def error(self) -> Exception | None:
        """The first input's error: the mix ends when any input fails (a lost microphone is not half a meeting)."""
        return next((source.error for source in self.inputs if source.error is not None), None)

    @property
    def finished(self) -> bool:
        ended = self.error is not None or all(source.finished for source in self.inputs)
        return ended and not any(p.size for p in self._pending)

    def start(self) -> None:
        """Starts every input; when one cannot open, the ones started are stopped and its error raised."""
        self._reset()
        started = []
        try:
            for source in self.inputs:
                source.start()
                started.append(source)
        except BaseException:
            for source in started:
                source.stop()
            raise

    def stop(self) -> None:
        for source in self.inputs:
            source.stop()

    def read(self, timeout_s: float = 0.1) -> np.ndarray | None:
        """The mixed samples every input has delivered (or owes past max_skew_s); None when there are none.
        Once an input has ended, the others are no longer waited for; once one has failed, what is left is
        returned and the mix ends."""
        failed = self.error is not None
        if not failed:  # after a failure only what was taken is still mixed
            for i, source in enumerate(self.inputs):
                # Only the first wait may block: the others have had that long to deliver too.
                self._take(i, source.read(timeout_s if i == 0 else 0.0))
            failed = self.error is not None
        live = [] if failed else [i for i, source in enumerate(self.inputs) if not source.finished]
        self._realign(live)
        n = max((p.size for p in self._pending), default=0)
        if live:
            n = min(n, max(min(self._pending[i].size for i in live), n - self.max_skew))
        if n == 0:
            return None
        mixed = np.zeros(n, dtype=np.float32)
        for i, pending in enumerate(self._pending):
            part = pending[:n]
            if part.size < n:  # late (or ended): silent for the rest, which it then owes
                self.silent_samples[i] += n - part.size
                if i in live:
                    self._owed[i] += n - part.size
            mixed[:part.size] += part
            self.levels[i] = float(np.sqrt(np.mean(np.square(part)) * part.size / n)) if part.size else 0.0
            self._pending[i] = pending[n:]
        self.samples_read += n
        return mixed

    def _take(self, i: int, samples: np.ndarray | None) -> None:
        if samples is not None:
            self._pending[i] = np.concatenate([self._pending[i], samples])

    def _realign(self, live: list[int]) -> None:
        """Drops, from an input that owes samples, its oldest pending ones that run ahead of every other
        live input: the samples whose time was already mixed in as silence."""
        for i in live:
            others = [self._pending[j].size for j in live if j != i]
            ahead = self._pending[i].size - min(others) if others else 0
            drop = min(self._owed[i], max(ahead, 0))
            if drop:
                self._owed[i] -= drop
                self._pending[i] = self._pending[i][drop:]
