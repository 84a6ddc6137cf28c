"""Aural's desktop app (PySide6): live captions, file transcription, metrics. The only package that imports Qt."""

from .main import main

__all__ = ["main"]
