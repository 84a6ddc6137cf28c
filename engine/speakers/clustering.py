"""Grouping speaker embeddings into speakers: agglomerative clustering on cosine similarity.

    labels = cluster(embeddings, threshold=0.45)    # (n, 192) -> (n,) ints 0..k-1, numbered by first appearance
    labels = cluster(embeddings, n_speakers=2)      # min(2, n) speakers

Average linkage: two groups' similarity is the mean cosine similarity of their members' pairs, so one odd
embedding (a cough, crosstalk) does not pull two speakers together as single linkage would, nor split a
speaker as complete linkage would. Merging stops when no two groups are more similar than `threshold`
(the number of speakers is then found), or at `n_speakers` when the user knows it.

Groups of fewer than `min_size` embeddings are not speakers of their own: a voice heard for a second or
more lies in several overlapping windows, so a lone embedding is noise, laughter or a bad window. Such groups
join the large group whose centroid is nearest, and `n_speakers` counts large groups only (as pyannote's
min_cluster_size does): otherwise a noisy recording's one odd window would take a speaker's place and
two real voices would be merged to make room for it (measured: 49 % DER on a noisy 2-speaker mix).

The whole similarity matrix is kept: n embeddings cost n^2 floats (2 800 embeddings, an hour at a 2.5 s
step, are 63 MB) and each merge one pass over it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["cluster", "min_group_size"]


def min_group_size(n: int) -> int:
    """1 below 10 embeddings (a short recording: every window counts), 2 below 20, then 3."""
    return min(3, n // 10 + 1)


def _normalised(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _merges(x: np.ndarray, threshold: float | None) -> list[tuple[int, int]]:
    """The average-linkage merges (kept row, absorbed row), most similar first, down to one group or until
    no pair reaches `threshold`."""
    n = len(x)
    sim = x @ x.T
    np.fill_diagonal(sim, -np.inf)
    sizes = np.ones(n)
    merges = []
    for _ in range(n - 1):
        a, b = divmod(int(np.argmax(sim)), n)
        if threshold is not None and sim[a, b] < threshold:
            break
        merged = (sizes[a] * sim[a] + sizes[b] * sim[b]) / (sizes[a] + sizes[b])
        sim[a], sim[:, a] = merged, merged
        sim[a, a] = -np.inf
        sim[b], sim[:, b] = -np.inf, -np.inf
        sizes[a] += sizes[b]
        merges.append((a, b))
    return merges


def _replay(n: int, merges: list[tuple[int, int]]) -> np.ndarray:
    owner = np.arange(n)
    for a, b in merges:
        owner[owner == b] = a
    return owner


def _steps_for(n: int, merges: list[tuple[int, int]], n_speakers: int, min_size: int) -> int | None:
    """How many merges leave exactly `n_speakers` large groups at the deepest point that has them (merges
    change the count of large groups by one at most); None when no point has that many."""
    sizes = np.ones(n, dtype=np.int64)
    large = int(min_size <= 1) * n
    best = None
    for step, (a, b) in enumerate(merges, start=1):
        large -= int(sizes[a] >= min_size) + int(sizes[b] >= min_size)  # numpy's bools would add as "or"
        sizes[a] += sizes[b]
        large += int(sizes[a] >= min_size)
        if large >= n_speakers:
            best = step
    return best


def _absorb_small(x: np.ndarray, owner: np.ndarray, min_size: int) -> np.ndarray:
    """Members of small groups move to the large group whose centroid is most similar."""
    groups, counts = np.unique(owner, return_counts=True)
    large = groups[counts >= min_size]
    if len(large) == 0 or len(large) == len(groups):
        return owner
    centroids = _normalised(np.stack([x[owner == g].mean(axis=0) for g in large]))
    out = owner.copy()
    for i in np.flatnonzero(~np.isin(owner, large)):
        out[i] = large[int(np.argmax(centroids @ x[i]))]
    return out


def cluster(embeddings: np.ndarray, *, threshold: float = 0.45, n_speakers: int | None = None) -> np.ndarray:
    """Cluster labels of the rows of `embeddings`; see the module's docstring."""
    n = len(embeddings)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    x = _normalised(embeddings)
    min_size = min_group_size(n)
    if n_speakers:
        merges = _merges(x, None)
        wanted = min(n_speakers, n)
        steps = _steps_for(n, merges, wanted, min_size)
        if steps is None:  # fewer large groups than speakers at every point: each group counts
            steps, min_size = n - wanted, 1
        owner = _replay(n, merges[:steps])
    else:
        owner = _replay(n, _merges(x, threshold))
    owner = _absorb_small(x, owner, min_size)
    # Number speakers by their first embedding, so "Speaker 1" is the first voice heard.
    order = {group: i for i, group in enumerate(dict.fromkeys(owner.tolist()))}
    return np.array([order[g] for g in owner.tolist()], dtype=np.int64)
