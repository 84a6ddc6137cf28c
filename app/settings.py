"""Persistent user settings: one typed key enum over QSettings."""

from __future__ import annotations

from enum import Enum
from typing import Any

from PySide6.QtCore import QByteArray, QSettings

from aural.engine.models.store import DEFAULT_MODEL

__all__ = ["Key", "Settings"]


class Key(Enum):
    """Every persisted setting: its QSettings path, Python type and default."""

    # A sound server's source name (InputDevice.name), else a PortAudio device's; "" or a missing one: the default.
    INPUT_DEVICE = ("live/input_device", str, "")
    MODEL = ("model/name", str, DEFAULT_MODEL)
    # A ggml device's name ("CPU", "Vulkan0"), or "auto" for the backend policy's pick (the best GPU, else the CPU).
    COMPUTE_DEVICE = ("model/compute_device", str, "auto")
    LANGUAGE = ("model/language", str, "")  # "": detect (multilingual models only)
    KV_MODE = ("model/kv_mode", str, "device")
    GEOMETRY = ("window/geometry", QByteArray, QByteArray())
    EXPORT_DIR = ("files/export_dir", str, "")  # "": the user's documents folder
    RECENT_FILES = ("files/recent", list, [])  # paths, newest first (File → Recent)
    METRICS_SHOWN = ("window/metrics_shown", bool, False)  # collapsed at first: a newcomer sees captions
    # Decoding of files (Preferences; the CLI's flags of the same names).
    BEAM_SIZE = ("decoding/beam_size", int, 5)  # 1: greedy
    WORD_TIMESTAMPS = ("decoding/word_timestamps", bool, False)
    VAD_FILTER = ("decoding/vad_filter", bool, False)
    HOTWORDS = ("decoding/hotwords", str, "")
    INITIAL_PROMPT = ("decoding/initial_prompt", str, "")
    TRANSLATE = ("decoding/translate", bool, False)  # task "translate": English text (multilingual models)
    DIARIZE = ("decoding/diarize", bool, False)  # name each segment's speaker (engine.speakers; --diarize)
    DIARIZE_SPEAKERS = ("decoding/diarize_speakers", int, 0)  # how many speak (--speakers); 0: found from the voices
    KEEP_LIVE_AUDIO = ("live/keep_audio", bool, True)  # a live session's audio beside its journal (History)
    # The caption window (View → Caption window).
    CAPTION_FONT_FAMILY = ("captions/font_family", str, "")  # "": the application's font
    CAPTION_FONT_PX = ("captions/font_px", int, 0)  # 0: follows the window's height
    CAPTION_ON_TOP = ("captions/always_on_top", bool, False)
    CAPTION_TEXT_COLOR = ("captions/text_color", str, "#ffffff")
    CAPTION_BACKGROUND = ("captions/background", str, "#07090c")

    def __init__(self, path: str, kind: type, default: Any):
        self.path = path
        self.kind = kind
        self.default = default


class Settings:
    """Typed access to a QSettings store; the application passes the real one, tests an isolated one."""

    def __init__(self, store: QSettings):
        self._store = store

    def get(self, key: Key) -> Any:
        value = self._store.value(key.path, key.default)
        # QSettings hands back strings from INI files and QByteArray or str from native stores.
        if key.kind is QByteArray:
            return value if isinstance(value, QByteArray) else QByteArray(value or b"")
        if key.kind is bool and isinstance(value, str):  # INI files store booleans as "true" / "false"
            return value.lower() in ("true", "1")
        if key.kind is list:  # an INI file gives a one-item list back as a plain string
            return [value] if isinstance(value, str) else list(value or [])
        return key.kind(value)

    def set(self, key: Key, value: Any) -> None:
        self._store.setValue(key.path, value)

    def sync(self) -> None:
        self._store.sync()
