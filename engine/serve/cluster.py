"""`aural transcribe --ray ADDRESS FILES_OR_DIRS`: an archive of files fanned out to the workers of a Ray
cluster (Ray's own actor pool does the scheduling: no scheduler of ours).

    for outcome in fan_out("auto", files, options, model=None, threads=2):   # an existing cluster
        print(outcome.name, outcome.error or outcome.segments)

Each worker is a Ray actor that loads the model once and transcribes one file at a time, with `threads`
CPU threads (the cluster gives each actor as many CPUs). The files are read on this machine and sent as
bytes only when a worker takes them, so workers need no shared disk and the driver holds one file at a time
per worker; results come back as they finish, each a `Outcome`. Workers run the same Aural (install it on
every node: the same venv, or `pip install aural` in the cluster's image). ADDRESS is what `ray.init`
takes ("auto", "ray://head:10001"), or "local" for a one-machine cluster started for this command.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import AuralError
from ..metrics import Timings
from ..transcribe import Segment, TranscribeOptions, TranscriptionInfo

__all__ = ["LOCAL", "Outcome", "audio_files", "fan_out"]

logger = logging.getLogger(__name__)

LOCAL = "local"
# What a folder given to --ray contributes: files FFmpeg reads as audio or video, by their usual suffixes.
AUDIO_SUFFIXES = frozenset({".wav", ".flac", ".mp3", ".m4a", ".aac", ".ogg", ".oga", ".opus", ".wma", ".webm",
                            ".mp4", ".mkv", ".mov", ".avi", ".aiff", ".aif", ".amr", ".3gp"})


@dataclass(frozen=True)
class Outcome:
    """One file's transcription from a worker.

    Attributes:
        path: the file on this machine.
        info, segments, timings: as `transcribe` gives them (segments read to the end); None on error.
        error: the one-line reason the file failed, else None.
        worker: the Ray node that transcribed it.
    """

    path: Path
    info: TranscriptionInfo | None
    segments: list[Segment] | None
    timings: Timings | None
    error: str | None
    worker: str


def audio_files(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given, and the audio and video files inside folders (recursively, sorted)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in AUDIO_SUFFIXES)
        else:
            out.append(p)
    return out


class _Transcriber:
    """A Ray actor: one model, one file at a time."""

    def __init__(self, model: str | None, threads: int):
        from ..models.store import resolve_model
        from ..runtime import load_model

        self.model = load_model(resolve_model(model), n_threads=threads)

    def run(self, path: str, data: bytes, options: TranscribeOptions):
        import ray

        from ..text.chinese import default_script, localize_transcription
        from ..transcribe import transcribe

        node = ray.get_runtime_context().get_node_id()[:12]
        fd, local = tempfile.mkstemp(prefix="aural-ray-", suffix=Path(path).suffix[:16])
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            result = transcribe(self.model, local, options)
            segments = list(localize_transcription(result, default_script(), translated=options.task == "translate"))
            info = dataclasses.replace(result.info, path=path)
            return path, info, segments, result.timings, None, node
        except AuralError as exc:
            return path, None, None, None, str(exc).replace(local, path), node
        finally:
            os.unlink(local)


def fan_out(address: str, files: list[Path], options: TranscribeOptions, *, model: str | None, threads: int,
            workers: int = 0) -> Iterator[Outcome]:
    """Transcribes `files` on the cluster at `address`, yielding each outcome as it finishes. `workers`
    actors (0: as many as the cluster's CPUs allow at `threads` each)."""
    import ray
    from ray.util import ActorPool

    threads = max(1, threads)
    # Ray's own start-up lines (INFO, and a WARNING about its token authentication) are not the user's news.
    quiet = dict(log_to_driver=False, logging_level=logging.ERROR)
    if address == LOCAL:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, **quiet)
    else:
        ray.init(address=address, **quiet)
    try:
        n = workers or max(1, int(ray.cluster_resources().get("CPU", 1) // threads))
        actor = ray.remote(num_cpus=threads)(_Transcriber)
        pool = ActorPool([actor.remote(model, threads) for _ in range(min(n, len(files)) or 1)])
        # The bytes are read when a worker takes the file, not before (ActorPool calls this lazily).
        submit = lambda a, p: a.run.remote(str(p), p.read_bytes(), options)  # noqa: E731
        for path, info, segments, timings, error, node in pool.map_unordered(submit, files):
            yield Outcome(Path(path), info, segments, timings, error, node)
    finally:
        ray.shutdown()
