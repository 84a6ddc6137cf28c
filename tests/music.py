"""Instrumental music made from numbers, for the "no words on music" checks of live captions and files.

No music ships in shared/data and none may be fetched, so two pieces are synthesised, each from a seed (the
same notes and drum hits every run):
- `band`: a I-V-vi-IV chord progression, a random melody in eighth notes, a bass line and a drum kit (kick,
  snare, hi-hat) at 100 beats a minute: rhythm and broadband transients, as in pop and dance music;
- `strings`: a legato minor-scale melody on a bowed-string-like tone (sawtooth harmonics, 5.5 Hz vibrato),
  notes of 0.4-1.2 s: sustained harmonic sound with a voice-like pitch wobble, nearer a voice than the band.
Both are mono float32 at 16 kHz, peaking at 0.5 and 0.4 of full scale.
"""

from __future__ import annotations

import numpy as np

RATE = 16000
_MAJOR = (0, 2, 4, 5, 7, 9, 11)
_MINOR = (0, 2, 3, 5, 7, 8, 10)
_CHORDS = ((60, 64, 67), (55, 59, 62), (57, 60, 64), (53, 57, 60))  # C, G, Am, F as MIDI notes


def _hz(note: float) -> float:
    return 440.0 * 2 ** ((note - 69) / 12)


def _struck(freq: float, seconds: float, decay_s: float, harmonics: int = 6) -> np.ndarray:
    """A struck string: harmonics k at 1/k^1.5, a 5 ms attack and an exponential decay."""
    t = np.arange(int(seconds * RATE)) / RATE
    wave = sum(np.sin(2 * np.pi * freq * k * t) / k ** 1.5 for k in range(1, harmonics + 1) if freq * k < RATE / 2)
    return wave * np.exp(-t / decay_s) * np.minimum(1.0, t / 0.005)


def _mix(out: np.ndarray, at_s: float, sound: np.ndarray, gain: float) -> None:
    i = int(at_s * RATE)
    if i < out.size:
        part = sound[:out.size - i]
        out[i:i + part.size] += gain * part


def band(seconds: float, seed: int = 0, bpm: float = 100.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    beat = 60.0 / bpm
    out = np.zeros(int(seconds * RATE))
    drum_t = np.arange(int(0.2 * RATE)) / RATE
    for b in range(int(seconds / beat)):
        at, chord = b * beat, _CHORDS[(b // 4) % len(_CHORDS)]
        if b % 4 == 0:  # the chord, once a bar
            for note in chord:
                _mix(out, at, _struck(_hz(note), 4 * beat, 1.2), 0.15)
        if b % 2 == 0:  # the bass: the chord's root two octaves down, every other beat
            _mix(out, at, _struck(_hz(chord[0] - 24), 2 * beat, 0.6, harmonics=3), 0.35)
        for half in (0.0, 0.5):  # the melody, in eighth notes
            _mix(out, at + half * beat, _struck(_hz(72 + _MAJOR[rng.integers(7)]), beat, 0.25), 0.12)
        if b % 2 == 0:  # kick: a sine falling from 150 to 50 Hz
            kick = np.sin(2 * np.pi * (50 + 100 * np.exp(-drum_t / 0.03)) * drum_t) * np.exp(-drum_t / 0.08)
            _mix(out, at, kick, 0.5)
        else:  # snare: a noise burst
            _mix(out, at, rng.normal(0.0, 1.0, drum_t.size) * np.exp(-drum_t / 0.05), 0.15)
        for eighth in (0.0, 0.5):  # hi-hat: differenced (high-passed) noise, 30 ms
            hat = np.diff(rng.normal(0.0, 1.0, int(0.03 * RATE)), prepend=0.0)
            _mix(out, at + eighth * beat, hat * np.exp(-np.arange(hat.size) / (0.01 * RATE)), 0.05)
    return (0.5 * out / np.abs(out).max()).astype(np.float32)


def strings(seconds: float, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros(int(seconds * RATE))
    at = 0.0
    while at < seconds:
        length = rng.uniform(0.4, 1.2)
        freq = _hz(57 + _MINOR[rng.integers(7)] + 12 * rng.integers(2))
        t = np.arange(int(length * RATE)) / RATE
        phase = 2 * np.pi * np.cumsum(freq * (1 + 0.006 * np.sin(2 * np.pi * 5.5 * t))) / RATE
        tone = sum(np.sin(k * phase) / k for k in range(1, 12) if freq * k < RATE / 2)
        bow = np.minimum(1.0, t / 0.08) * np.minimum(1.0, (length - t) / 0.08)  # 80 ms in and out
        _mix(out, at, tone * bow, 1.0)
        at += length
    return (0.4 * out / np.abs(out).max()).astype(np.float32)


PIECES = {"band": band, "strings": strings}
