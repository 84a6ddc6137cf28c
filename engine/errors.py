"""Errors that reach the user as one clear line (the CLI prints them without a traceback)."""


class AuralError(Exception):
    """Base of every error Aural reports to the user."""


class AudioError(AuralError):
    """An input that cannot be read as audio: missing, unreadable, unsupported, corrupt or empty."""


class ModelError(AuralError):
    """A model file that cannot be converted or loaded: missing, truncated, wrong architecture or shapes."""


class DeviceError(AuralError):
    """No usable input device, or the device vanished while capturing."""


class DownloadError(AuralError):
    """A model download that failed: no network, an HTTP error, a cut that did not resume, a checksum mismatch,
    no space or no permission in the cache."""
