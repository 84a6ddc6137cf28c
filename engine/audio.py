"""Audio input: any file FFmpeg can decode (or headerless PCM) as 16 kHz mono float32, decoded progressively.

Why PyAV: it binds FFmpeg's libavformat/libavcodec/libswresample in-process, so a single code path reads
WAV/FLAC/MP3/Ogg-Opus/AAC and the audio track of MP4/WebM video, and swresample downmixes and resamples
frame by frame while decoding. That needs no ffmpeg executable on PATH (openai-whisper shells out to one)
and never holds a whole file in memory, which matters for hour-long recordings. Headerless PCM gives
FFmpeg nothing to probe, so it is read in blocks with numpy and fed through the same resampler.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import av
import numpy as np

from .errors import AudioError

__all__ = [
    "SAMPLE_RATE",
    "RAW_FORMATS",
    "AudioInfo",
    "Resampler16k",
    "probe",
    "stream_audio",
    "load_audio",
]

logger = logging.getLogger(__name__)

# Whisper's input rate (openai-whisper whisper/audio.py SAMPLE_RATE).
SAMPLE_RATE = 16000

# Headerless PCM layouts: (numpy dtype, zero offset, full scale), so float = (x - offset) / scale is in [-1, 1).
RAW_FORMATS = {
    "s16le": ("<i2", 0, 32768.0),
    "s32le": ("<i4", 0, 2147483648.0),
    "f32le": ("<f4", 0, 1.0),
    "u8": ("u1", 128, 128.0),
}
_RAW_EXTENSIONS = (".raw", ".pcm")

# Decoding this much less than the header's duration means the file was cut short (a truncated MP3 or
# FLAC often decodes without an error: the demuxer just drops the partial last frame). Seconds; encoder
# delay and padding differ from the header by tens of ms at most (e.g. 1024 samples for AAC).
_SHORTFALL_S = 0.5

# What PyAV raises on bad input: av.error.FFmpegError subclasses for anything FFmpeg reports, plain
# ValueError from its own frame/format checks, OSError from the file system.
_PYAV_ERRORS = (av.error.FFmpegError, OSError, ValueError)


@dataclass(frozen=True)
class AudioInfo:
    """What a file declares about its first audio stream, read without decoding it.

    Attributes:
        path: The file, as given.
        duration_s: Length in seconds from the stream or container header; None when the file does not say.
        sample_rate: Native sample rate in Hz.
        channels: Native channel count.
        codec: FFmpeg decoder name (e.g. "flac", "mp3", "pcm_s16le"), or the raw PCM format.
        format_name: FFmpeg demuxer name (e.g. "wav", "mov,mp4,m4a,3gp,3g2,mj2"), or "raw".
    """

    path: str
    duration_s: float | None
    sample_rate: int
    channels: int
    codec: str
    format_name: str


@dataclass(frozen=True)
class _RawSpec:
    """How to interpret a headerless PCM file.

    Attributes:
        rate: Sample rate in Hz.
        dtype: numpy dtype of one sample.
        offset: Value of digital silence (128 for unsigned 8-bit, else 0).
        scale: Full-scale magnitude; (x - offset) / scale is in [-1, 1).
        channels: Interleaved channel count.
        name: The format name as given (e.g. "s16le").
    """

    rate: int
    dtype: np.dtype
    offset: float
    scale: float
    channels: int
    name: str

    @property
    def frame_bytes(self) -> int:
        """Bytes per sample frame (one sample of every channel)."""
        return self.dtype.itemsize * self.channels


class Resampler16k:
    """Converts a stream of float32 blocks at any rate to 16 kHz mono, e.g. a 44.1/48 kHz capture device.

    swresample keeps its filter state between calls, so block boundaries leave no clicks; its filter
    delays a few milliseconds of output, which flush() returns at the end of the stream.
    """

    def __init__(self, rate: int) -> None:
        if rate <= 0:
            raise ValueError(f"sample rate must be positive, got {rate}")
        self.rate = rate
        self._resampler = _mono16k_resampler()

    def process(self, block: np.ndarray) -> np.ndarray:
        """Resamples one block, shape (n,) mono or (n, channels) interleaved, to (m,) float32 at 16 kHz."""
        mono = block.mean(axis=1) if block.ndim == 2 else block
        if mono.size == 0:
            return np.zeros(0, dtype=np.float32)
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(mono, dtype=np.float32)[np.newaxis, :], format="flt", layout="mono"
        )
        frame.sample_rate = self.rate
        return _join(_resample(self._resampler, frame))

    def flush(self) -> np.ndarray:
        """Returns the samples still inside the filter; call once, after the last block."""
        return _join(_resample(self._resampler, None))


def probe(
    path: str | os.PathLike,
    *,
    raw_rate: int | None = None,
    raw_format: str | None = None,
    raw_channels: int = 1,
) -> AudioInfo:
    """Describes the first audio stream of `path` without decoding it; raises AudioError if it has none."""
    p = _check_file(path)
    if _is_raw(p, raw_rate, raw_format):
        spec = _raw_spec(p, raw_rate, raw_format, raw_channels)
        duration_s = os.path.getsize(p) // spec.frame_bytes / spec.rate
        return AudioInfo(p, duration_s, spec.rate, spec.channels, spec.name, "raw")
    with _open(p) as container:
        stream = _audio_stream(container, p)
        ctx = stream.codec_context
        return AudioInfo(p, _duration_s(container, stream), ctx.sample_rate, ctx.channels, ctx.name,
                         container.format.name)


def stream_audio(
    path: str | os.PathLike,
    *,
    chunk_s: float = 30.0,
    raw_rate: int | None = None,
    raw_format: str | None = None,
    raw_channels: int = 1,
) -> Iterator[np.ndarray]:
    """Yields `path` as float32 mono 16 kHz chunks of round(chunk_s * 16000) samples, the last one shorter.

    The path is checked at once (missing, directory, unreadable, empty, raw options); decoding happens
    lazily as the chunks are consumed. Headerless PCM is read when `raw_rate` is given: `raw_format` is
    one of RAW_FORMATS (default "s16le") with `raw_channels` interleaved channels. Every failure is an
    AudioError; a file that breaks off mid-stream yields what decoded before the break, with a warning.
    """
    if chunk_s <= 0:
        raise ValueError(f"chunk_s must be positive, got {chunk_s}")
    p = _check_file(path)
    if _is_raw(p, raw_rate, raw_format):
        blocks = _decode_raw(p, _raw_spec(p, raw_rate, raw_format, raw_channels))
    else:
        blocks = _decode_av(p)
    return _chunks(_finite(blocks, p), max(1, round(chunk_s * SAMPLE_RATE)), p)


def load_audio(
    path: str | os.PathLike,
    *,
    chunk_s: float = 30.0,
    raw_rate: int | None = None,
    raw_format: str | None = None,
    raw_channels: int = 1,
) -> np.ndarray:
    """Decodes all of `path` into one float32 mono 16 kHz array (for short files and tests)."""
    chunks = stream_audio(path, chunk_s=chunk_s, raw_rate=raw_rate, raw_format=raw_format,
                          raw_channels=raw_channels)
    return np.concatenate(list(chunks))


def _check_file(path: str | os.PathLike) -> str:
    """Fails early, with a specific message, on the problems FFmpeg would report vaguely."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise AudioError(f"Audio file not found: {p}")
    if os.path.isdir(p):
        raise AudioError(f"{p} is a directory, not an audio file.")
    if not os.access(p, os.R_OK):
        raise AudioError(f"Cannot read {p}: permission denied.")
    if os.path.getsize(p) == 0:
        raise AudioError(f"{p} contains no audio samples (the file is 0 bytes long).")
    return p


def _is_raw(p: str, raw_rate: int | None, raw_format: str | None) -> bool:
    """Raw mode is chosen by raw_rate; a .raw/.pcm name or a raw_format without a rate cannot be decoded."""
    if raw_rate is not None:
        return True
    if raw_format is not None or p.lower().endswith(_RAW_EXTENSIONS):
        # Said for every front end: the app has no raw-PCM options, the CLI has.
        raise AudioError(f"{p} is headerless PCM: its sample rate is not in the file. Convert it to WAV or FLAC "
                         "first, or give the rate to `aural transcribe` with --raw-rate (and --raw-format/"
                         "--raw-channels if it is not s16le mono).")
    return False


def _raw_spec(p: str, rate: int, name: str | None, channels: int) -> _RawSpec:
    name = name or "s16le"
    if name not in RAW_FORMATS:
        raise AudioError(f"Cannot read {p}: unknown raw PCM format {name!r} (use one of {', '.join(RAW_FORMATS)}).")
    if rate <= 0 or channels < 1:
        raise AudioError(f"Cannot read {p}: raw rate ({rate} Hz) and channels ({channels}) must be positive.")
    dtype, offset, scale = RAW_FORMATS[name]
    return _RawSpec(rate, np.dtype(dtype), offset, scale, channels, name)


def _open(p: str) -> av.container.InputContainer:
    try:
        # metadata_errors="replace": tags in a broken or foreign encoding must not stop decoding.
        return av.open(p, mode="r", metadata_errors="replace")
    except _PYAV_ERRORS as exc:
        raise AudioError(f"{p} is not a readable audio file ({_reason(exc)}).") from exc


def _audio_stream(container: av.container.InputContainer, p: str) -> av.audio.stream.AudioStream:
    if not container.streams.audio:
        raise AudioError(f"{p} has no audio stream (container format {container.format.name}).")
    stream = container.streams.audio[0]
    if stream.codec_context is None:  # PyAV leaves it unset when FFmpeg has no decoder for the codec id
        raise AudioError(f"{p} uses an audio codec that this FFmpeg build cannot decode.")
    return stream


def _duration_s(container: av.container.InputContainer, stream: av.audio.stream.AudioStream) -> float | None:
    """Stream duration if the header has it, else the container's (in av.time_base units), else None."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    return None


def _reason(exc: BaseException) -> str:
    """FFmpeg's own wording ("Invalid data found when processing input") without errno and path noise."""
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _mono16k_resampler() -> av.AudioResampler:
    # "flt" is packed float32, so each output frame's to_ndarray() has shape (1, n_samples).
    return av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)


def _resample(resampler: av.AudioResampler, frame: av.AudioFrame | None) -> list[np.ndarray]:
    """Pushes one frame (None flushes) and returns the (n,) float32 blocks that came out."""
    return [out.to_ndarray()[0] for out in resampler.resample(frame)]


def _join(blocks: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.float32)


def _decode_av(p: str) -> Iterator[np.ndarray]:
    """Yields 16 kHz mono float32 blocks (one per decoded frame, any length) of the first audio stream."""
    with _open(p) as container:
        stream = _audio_stream(container, p)
        if container.format.name == "wav":
            _warn_if_wav_truncated(p)
        try:
            yield from _resampled(_decoded_frames(container, stream, p))
        except _PYAV_ERRORS as exc:
            raise AudioError(f"{p} could not be resampled ({_reason(exc)}).") from exc


def _decoded_frames(container: av.container.InputContainer, stream: av.audio.stream.AudioStream,
                    p: str) -> Iterator[av.AudioFrame]:
    """Yields decoded frames of `stream`, tolerating damage as the ffmpeg CLI does.

    An undecodable packet (a frame cut mid-way, garbage between frames) is skipped; a demuxer error ends
    the stream. Damage is logged at the end, and is fatal only when no audio decoded at all.
    """
    declared_s = _duration_s(container, stream)
    seconds, errors, last_error = 0.0, 0, None
    try:
        for packet in container.demux(stream):
            try:
                frames = packet.decode()
            except _PYAV_ERRORS as exc:
                errors, last_error = errors + 1, exc
                continue
            for frame in frames:
                seconds += frame.samples / frame.sample_rate
                yield frame
    except _PYAV_ERRORS as exc:
        errors, last_error = errors + 1, exc
    if errors and seconds == 0.0:
        raise AudioError(f"{p} could not be decoded ({_reason(last_error)}).") from last_error
    if errors:
        logger.warning("%s: %d damaged packet(s) skipped (%s); the file looks truncated or corrupt",
                       p, errors, _reason(last_error))
    if declared_s is not None and seconds < declared_s - _SHORTFALL_S:
        logger.warning("%s: decoded %.2f s of the %.2f s its header declares; the file looks truncated",
                       p, seconds, declared_s)


def _wav_data_chunk(p: str) -> tuple[int, int, int] | None:
    """(byte rate, data offset, declared data bytes) from a RIFF/WAVE header; None if it has no such chunks."""
    with open(p, "rb") as f:
        riff = f.read(12)  # "RIFF", size, "WAVE"
        if riff[:4] != b"RIFF" or riff[8:12] != b"WAVE":
            return None
        byte_rate = None
        while len(header := f.read(8)) == 8:
            chunk, size = header[:4], struct.unpack("<I", header[4:])[0]
            if chunk == b"fmt " and size >= 12:
                byte_rate = struct.unpack("<I", f.read(12)[8:12])[0]
                f.seek(size - 12 + (size & 1), os.SEEK_CUR)
            elif chunk == b"data":
                return (byte_rate, f.tell(), size) if byte_rate else None
            else:
                f.seek(size + (size & 1), os.SEEK_CUR)  # chunks are word-aligned
    return None


def _warn_if_wav_truncated(p: str) -> None:
    """FFmpeg takes a WAV's length from the file's size, so a cut-off file decodes without complaint;
    its data chunk still declares the full length. 0 and 0xFFFFFFFF mean "unknown" (streamed writers)."""
    try:
        found = _wav_data_chunk(p)
    except (OSError, struct.error):
        return
    if found is None or found[2] in (0, 0xFFFFFFFF):
        return
    byte_rate, offset, declared = found
    present = os.path.getsize(p) - offset
    if declared - present > _SHORTFALL_S * byte_rate:
        logger.warning("%s: holds %.2f s of the %.2f s its header declares; the file looks truncated",
                       p, present / byte_rate, declared / byte_rate)


def _resampled(frames: Iterable[av.AudioFrame]) -> Iterator[np.ndarray]:
    """Resamples frames to 16 kHz mono, starting a fresh resampler when the stream changes rate or layout.

    AudioResampler is fixed to the first frame it sees; concatenated MP3/ADTS files can switch sample rate
    or channel count mid-stream, so the old filter is flushed and a new one built at each change.
    """
    resampler, setup = None, None
    for frame in frames:
        frame_setup = (frame.format.name, frame.layout.name, frame.sample_rate)
        if frame_setup != setup:
            if resampler is not None:
                yield from _resample(resampler, None)
            resampler, setup = _mono16k_resampler(), frame_setup
        yield from _resample(resampler, frame)
    if resampler is not None:
        yield from _resample(resampler, None)


def _decode_raw(p: str, spec: _RawSpec) -> Iterator[np.ndarray]:
    """Yields 16 kHz mono float32 blocks of headerless PCM, reading one second of input at a time."""
    resampler = Resampler16k(spec.rate)
    block_bytes = spec.frame_bytes * spec.rate
    try:
        with open(p, "rb") as f:
            while data := f.read(block_bytes):
                yield resampler.process(_pcm_to_float(data, spec, p))
    except OSError as exc:
        raise AudioError(f"Cannot read {p} ({_reason(exc)}).") from exc
    yield resampler.flush()


def _pcm_to_float(data: bytes, spec: _RawSpec, p: str) -> np.ndarray:
    """Interleaved PCM bytes -> (n_frames, channels) float32 in [-1, 1); a trailing partial frame is dropped."""
    spare = len(data) % spec.frame_bytes
    if spare:
        logger.warning("%s: ignoring %d trailing bytes that do not form a whole sample frame", p, spare)
    samples = np.frombuffer(data[: len(data) - spare], dtype=spec.dtype).reshape(-1, spec.channels)
    return (samples.astype(np.float32) - np.float32(spec.offset)) / np.float32(spec.scale)


def _finite(blocks: Iterable[np.ndarray], p: str) -> Iterator[np.ndarray]:
    """Replaces NaN/Inf (possible in float WAV/raw files) by silence, warning once per file."""
    warned = False
    for block in blocks:
        if not np.isfinite(block).all():
            if not warned:
                logger.warning("%s: NaN/Inf samples replaced by silence", p)
                warned = True
            block = np.nan_to_num(block, nan=0.0, posinf=0.0, neginf=0.0)
        yield block


def _chunks(blocks: Iterable[np.ndarray], size: int, p: str) -> Iterator[np.ndarray]:
    """Regroups blocks of any length into chunks of `size` samples (the last one shorter)."""
    pending: list[np.ndarray] = []
    n_pending = 0
    n_total = 0
    for block in blocks:
        pending.append(block)
        n_pending += block.size
        n_total += block.size
        if n_pending >= size:
            joined = np.concatenate(pending)
            cut = n_pending - n_pending % size
            yield from (joined[start : start + size] for start in range(0, cut, size))
            pending, n_pending = [joined[cut:]], n_pending - cut
    if n_total == 0:
        raise AudioError(f"{p} contains no audio samples.")
    if n_pending:
        yield np.concatenate(pending)
