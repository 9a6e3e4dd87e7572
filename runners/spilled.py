"""A large point's token gaps on disk, and what a merge computes from them there.

Several clients' union (``runners.clientmerge``) holds one number per request per array,
plus one per output token in ``itls``: the token gaps are what grows to billions at a
million requests. When the union passes the inline limit (``runners.samplesfile``), the
merge writes every request's gaps to a float64 file as it reads each client
(``GapWriter``) and keeps only each request's count; ``Gaps`` then gives:

- ``statistics``: vLLM's ITL statistics over the successful requests' gaps (mean, median,
  std, 50/90/99th percentiles, numpy's linear method), a chunk at a time. Up to
  ``IN_MEMORY`` gaps they are numpy's own functions over the gaps read back; past it the
  percentiles are exact order statistics found by narrowing a histogram over the file
  (each pass reads it once; a bin of at most ``DIRECT`` values is sorted);
- ``peaks``: the most output tokens in a one-second bucket and the most requests in
  flight, as ``clientmerge`` buckets them;
- ``lists``: the gaps as a sequence of per-request lists, read a slice at a time, for the
  samples file; and ``request(i)`` for the reading sample.

numpy is imported where it is used: the portal imports this module's callers, not numpy.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, overload

CHUNK = 1 << 22  # gaps read at a time (32 MB)
IN_MEMORY = 1 << 23  # up to this many gaps, numpy's own statistics over them (64 MB)
BINS = 1 << 16
DIRECT = 1 << 20  # a histogram bin this small is read and sorted


class GapWriter:
    """Appends each request's gaps to ``path`` (float64) and keeps each one's count."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.counts = array("q")

    def extend(self, column: Sequence[Any]) -> None:
        """One entry per request: its list of gaps (None or a non-list: none)."""
        for gaps in column:
            values = array("d", gaps if isinstance(gaps, list) else [])
            values.tofile(self._file)
            self.counts.append(len(values))

    def close(self) -> Gaps:
        self._file.close()
        return Gaps(self.path, self.counts)


class Gaps:
    """The gaps ``GapWriter`` wrote: ``counts[i]`` of them for request ``i``, in order."""

    def __init__(self, path: Path, counts: array) -> None:
        import numpy as np

        self.path = path
        self.counts = np.array(counts, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        self.total = int(self.offsets[-1])
        self._mm = (
            np.memmap(path, dtype=np.float64, mode="r", shape=(self.total,))
            if self.total
            else np.zeros(0)
        )

    def __len__(self) -> int:
        return len(self.counts)

    def request(self, i: int) -> list[float]:
        return self._mm[self.offsets[i] : self.offsets[i + 1]].tolist()

    def lists(self) -> GapLists:
        return GapLists(self)

    def _selected(self, ok: Sequence[int]) -> Iterator[Any]:
        """The gaps of requests ``ok`` in request order, a chunk of requests at a time."""
        import numpy as np

        mask = np.zeros(len(self.counts), dtype=bool)
        mask[list(ok)] = True
        start, n = 0, len(self.counts)
        while start < n:
            end = int(np.searchsorted(self.offsets, self.offsets[start] + CHUNK, side="right"))
            end = min(max(end - 1, start + 1), n)
            part = np.asarray(self._mm[self.offsets[start] : self.offsets[end]])
            yield part[np.repeat(mask[start:end], self.counts[start:end])]
            start = end

    def statistics(self, ok: Sequence[int], percentiles: Sequence[int]) -> dict[str, float]:
        """``clientmerge._ms``'s statistics (in seconds) of the gaps of requests ``ok``."""
        import numpy as np

        path = self.path.with_suffix(".ok.f64")
        n, total, lo, hi = 0, 0.0, math.inf, -math.inf
        with open(path, "wb") as out:
            sums = []
            for part in self._selected(ok):
                part.tofile(out)
                n += len(part)
                sums.append(float(np.sum(part)))
                if len(part):
                    lo, hi = min(lo, float(part.min())), max(hi, float(part.max()))
            total = math.fsum(sums)
        try:
            if n == 0:
                return {"mean": 0.0, "median": 0.0, "std": 0.0} | {
                    f"p{p}": 0.0 for p in percentiles
                }
            values = np.memmap(path, dtype=np.float64, mode="r", shape=(n,))
            if n <= IN_MEMORY:
                data = np.array(values)
                out_stats = {
                    "mean": float(np.mean(data)),
                    "median": float(np.median(data)),
                    "std": float(np.std(data)),
                }
                for p in percentiles:
                    out_stats[f"p{p}"] = float(np.percentile(data, p))
                return out_stats
            mean = total / n
            squares = math.fsum(
                float(np.sum((values[i : i + CHUNK] - mean) ** 2)) for i in range(0, n, CHUNK)
            )
            found = {"mean": mean, "std": math.sqrt(squares / n)}
            a, b = _kth_pair(values, (n - 1) // 2, lo, hi)
            found["median"] = a if n % 2 else (a + b) / 2.0
            for p in percentiles:
                found[f"p{p}"] = percentile(values, p, lo, hi)
            return found
        finally:
            path.unlink(missing_ok=True)

    def peaks(
        self, ok: Sequence[int], starts: Sequence[float], ttfts: Sequence[float],
        lats: Sequence[float],
    ) -> tuple[float, int]:  # fmt: skip
        """``clientmerge._peaks`` over requests ``ok`` (``starts``... in that order)."""
        import numpy as np

        if not starts:
            return 0.0, 0
        t0 = min(starts)
        end = max(s + lat for s, lat in zip(starts, lats, strict=True))
        n = math.ceil(end - t0) + 1
        tokens, steps = np.zeros(n), np.zeros(n + 1)
        for i, s, ttft, lat in zip(ok, starts, ttfts, lats, strict=True):
            gaps = self._mm[self.offsets[i] : self.offsets[i + 1]]
            first = np.array([s + ttft])
            times = np.cumsum(np.concatenate([first, gaps])) if len(gaps) else first
            idx = (times - t0).astype(int)
            np.add.at(tokens, idx[(idx >= 0) & (idx < n)], 1)
            steps[int(s - t0)] += 1
            steps[min(int(s + lat - t0) + 1, n)] -= 1
        return float(tokens.max()), int(np.cumsum(steps)[:n].max())


class GapLists(Sequence):
    """``Gaps`` as a sequence of per-request lists (a slice reads only its requests)."""

    def __init__(self, gaps: Gaps) -> None:
        self._gaps = gaps

    def __len__(self) -> int:
        return len(self._gaps)

    @overload
    def __getitem__(self, i: int) -> list[float]: ...
    @overload
    def __getitem__(self, i: slice) -> list[list[float]]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self._gaps.request(j) for j in range(*i.indices(len(self)))]
        return self._gaps.request(i if i >= 0 else len(self) + i)


def percentile(values: Any, q: float, lo: float, hi: float) -> float:
    """numpy's ``percentile(values, q)`` (linear) of the float64 ``values`` (a memmap),
    from order statistics; ``lo``/``hi``: their minimum and maximum."""
    n = len(values)
    position = (q / 100.0) * (n - 1)
    below = math.floor(position)
    t = position - below
    a, b = _kth_pair(values, below, lo, hi)
    if below + 1 >= n or t == 0:
        return a
    diff = b - a
    return b - diff * (1.0 - t) if t >= 0.5 else a + diff * t  # numpy's _lerp


def _kth_pair(values: Any, k: int, lo: float, hi: float) -> tuple[float, float]:
    """The k-th and (k+1)-th smallest of ``values`` (0-based; the k-th twice for the last):
    a histogram over the range that holds the k-th, narrowed pass by pass until its bin
    holds at most ``DIRECT`` values (read and sorted) or at most two distinct ones."""
    import numpy as np

    n = len(values)

    def parts() -> Iterator[Any]:
        for i in range(0, n, CHUNK):
            yield np.asarray(values[i : i + CHUNK])

    a, b, closed, below = lo, hi, True, 0  # the k-th is in [a, b] (or [a, b)); `below` < a
    while True:

        def inside(part: Any, a: float = a, b: float = b, closed: bool = closed) -> Any:
            return part[(part >= a) & ((part < b) | (closed & (part == b)))]

        def above(a: float = a, b: float = b, closed: bool = closed) -> float:
            """The smallest value past the range (the (k+1)-th when the k-th is its last)."""
            rest = [p[p > b] if closed else p[p >= b] for p in parts()]
            return float(min(float(r.min()) for r in rest if len(r)))

        hist = np.zeros(BINS, dtype=np.int64)
        edges = np.linspace(a, b, BINS + 1)
        for part in parts():
            idx = np.clip(np.searchsorted(edges, inside(part), side="right") - 1, 0, BINS - 1)
            hist += np.bincount(idx, minlength=BINS)
        count = int(hist.sum())
        j = int(np.searchsorted(np.cumsum(hist), k - below, side="right"))
        narrower = (float(edges[j]), float(edges[j + 1]))
        if count <= DIRECT or narrower == (a, b) or a == b:
            if count <= DIRECT:
                found = np.sort(np.concatenate([inside(p) for p in parts()]))
                r = k - below
                if k + 1 >= n:
                    return float(found[r]), float(found[r])
                second = float(found[r + 1]) if r + 1 < len(found) else above()
                return float(found[r]), second
            else:  # at most two distinct values (equal, or adjacent floats): count each
                distinct = [a] if a == b or not closed else [a, b]
                runs = [
                    (v, sum(int(np.count_nonzero(inside(p) == v)) for p in parts()))
                    for v in distinct
                ]
            first = _nth(runs, k - below)
            assert first is not None
            if k + 1 >= n:
                return first, first
            second = _nth(runs, k + 1 - below)
            return first, (above() if second is None else second)
        below += int(hist[:j].sum())
        closed = closed and j == BINS - 1
        a, b = narrower


def _nth(runs: Sequence[tuple[float, int]], r: int) -> float | None:
    """The r-th (0-based) of sorted (value, how many) runs; None past their end."""
    for value, many in runs:
        if r < many:
            return value
        r -= many
    return None


def reading_sample(
    union: dict[str, list[Any]], gaps: Gaps, limit: int, seed: str
) -> tuple[dict[str, Any], int]:
    """``runners.samplesfile.reading_sample`` of the union whose token gaps are ``gaps``."""
    from runners import samplesfile

    n = len(gaps)
    values = samplesfile.values_in(union) + n + gaps.total
    chosen = samplesfile.chosen_requests(n, values, limit, seed)
    out: dict[str, Any] = {
        key: [column[i] for i in chosen] for key, column in union.items() if len(column) == n
    }
    out["itls"] = [gaps.request(i) for i in chosen]
    out[samplesfile.SAMPLE_OF] = n
    return out, len(chosen)
