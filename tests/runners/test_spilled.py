"""A large merge's token gaps on disk (runners.spilled): exact percentiles found pass by
pass, and a spilled merge equal to the merge in memory (runners.clientmerge)."""

from __future__ import annotations

import gzip
import json
import random
from array import array

import numpy as np
import pytest

from runners import clientmerge, spilled


@pytest.fixture
def tiny_passes(monkeypatch):
    """Chunks, bins and the sorted bin so small that every search narrows many times."""
    monkeypatch.setattr(spilled, "CHUNK", 97)
    monkeypatch.setattr(spilled, "BINS", 8)
    monkeypatch.setattr(spilled, "DIRECT", 5)


@pytest.mark.parametrize(
    "values",
    [
        np.random.default_rng(0).lognormal(-5, 1, 3001),
        np.round(np.random.default_rng(1).random(2000), 2),  # many equal values
        np.array([0.25] * 500 + [0.5] * 3 + [1e-9]),
        np.array([np.nextafter(1.0, 2.0)] * 40 + [1.0] * 40),  # adjacent floats only
        np.array([3.0]),
    ],
    ids=["lognormal", "duplicates", "one-value-mostly", "adjacent-floats", "single"],
)
def test_percentiles_from_order_statistics_equal_numpy(tiny_passes, values):
    lo, hi = float(values.min()), float(values.max())
    for q in (0, 1, 25, 50, 90, 99, 99.9, 100):
        assert spilled.percentile(values, q, lo, hi) == pytest.approx(
            np.percentile(values, q), rel=1e-12, abs=0
        ), q
    ordered = np.sort(values)
    for k in {0, len(values) // 2, len(values) - 2, len(values) - 1}:
        if k < 0:
            continue
        a, b = spilled._kth_pair(values, k, lo, hi)
        assert a == ordered[k] and b == ordered[min(k + 1, len(values) - 1)]


def write_gaps(tmp_path, lists):
    writer = spilled.GapWriter(tmp_path / "gaps.f64")
    writer.extend(lists)
    return writer.close()


@pytest.mark.parametrize("in_memory", [True, False])
def test_statistics_of_the_successful_requests_gaps_equal_numpy(
    tmp_path, monkeypatch, tiny_passes, in_memory
):
    if not in_memory:
        monkeypatch.setattr(spilled, "IN_MEMORY", 0)
    rng = random.Random(3)
    lists = [[rng.random() for _ in range(rng.randint(0, 9))] for _ in range(300)]
    lists[5] = None  # a failed request has no gaps
    gaps = write_gaps(tmp_path, lists)
    ok = [i for i in range(300) if i % 4]
    want = np.array([g for i in ok for g in lists[i] or []])
    got = gaps.statistics(ok, (50, 90, 99))
    assert got["mean"] == pytest.approx(np.mean(want), rel=1e-12)
    assert got["std"] == pytest.approx(np.std(want), rel=1e-9)
    assert got["median"] == pytest.approx(np.median(want), rel=1e-12)
    for p in (50, 90, 99):
        assert got[f"p{p}"] == pytest.approx(np.percentile(want, p), rel=1e-12)
    assert gaps.lists()[3:5] == [lists[3], lists[4]] and gaps.request(5) == []
    assert write_gaps(tmp_path, [[], None]).statistics([0, 1], (99,))["p99"] == 0.0


def client_file(tmp_path, i: int, n: int, seed: int):
    rng = random.Random(seed)
    starts = sorted(rng.random() * 20 for _ in range(n))
    ttfts = [0.01 + rng.random() * 0.05 for _ in range(n)]
    itls = [[0.002 + rng.random() * 0.01 for _ in range(rng.randint(0, 40))] for _ in range(n)]
    errors = ["" if rng.random() > 0.05 else "timeout" for _ in range(n)]
    data = {
        "start_times": starts,
        "ttfts": ttfts,
        "itls": itls,
        "latencies": [t + sum(g) for t, g in zip(ttfts, itls, strict=True)],
        "output_lens": [len(g) + 1 for g in itls],
        "input_lens": [rng.randint(10, 99) for _ in range(n)],
        "queue_times": [0.0] * n,
        "errors": errors,
        "num_prompts": n,
        "max_concurrency": 4,
    }
    path = tmp_path / f"c{i}.json"
    path.write_text(json.dumps(data))
    return path


def test_a_spilled_merge_equals_the_merge_in_memory_and_keeps_every_sample(tmp_path):
    paths = [client_file(tmp_path, i, 150 + 20 * i, i) for i in range(3)]
    slo = {"ttft": 40.0, "e2el": 300.0}
    held, _ = clientmerge.merge(paths, slo)
    spill = tmp_path / "point.samples"
    merged, _ = clientmerge.merge(paths, slo, spill=spill, inline_limit=2000)
    assert "samples_full" not in held and "samples_full" in merged
    for key, value in held.items():
        if key in clientmerge.DETAIL_KEYS:
            continue
        if isinstance(value, float):
            assert merged[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert merged[key] == value, key
    # The samples file is the whole union, exactly; the gaps' file is gone.
    full = merged["samples_full"]
    blob = (spill / "samples.json.gz").read_bytes()
    assert merged["samples_file"] == str(spill / "samples.json.gz")
    assert full["bytes"] == len(blob) and full["requests"] == 150 + 170 + 190
    assert json.loads(gzip.decompress(blob)) == {k: held[k] for k in clientmerge.DETAIL_KEYS}
    assert not (spill / "itls.f64").exists()
    # The result carries a reading sample: whole requests of the union, in order.
    kept = full["kept"]
    assert merged["sample_of"] == 510 and 0 < kept < 510
    assert all(len(merged[k]) == kept for k in clientmerge.DETAIL_KEYS)
    rows = {
        json.dumps(r): i
        for i, r in enumerate(zip(*(held[k] for k in clientmerge.DETAIL_KEYS), strict=True))
    }
    picked = [
        rows[json.dumps(r)] for r in zip(*(merged[k] for k in clientmerge.DETAIL_KEYS), strict=True)
    ]
    assert picked == sorted(picked)
    # Under the limit nothing spills: the merge is what it always was.
    small, _ = clientmerge.merge(paths, slo, spill=tmp_path / "other", inline_limit=10**9)
    assert small == held and not (tmp_path / "other").exists()


def test_gaps_written_as_numbers_read_back_as_numbers(tmp_path):
    gaps = write_gaps(tmp_path, [[1.5, 2.5], [], [0.125]])
    assert list(gaps.counts) == [2, 0, 1] and gaps.total == 3
    assert array("d", gaps.request(0)).tolist() == [1.5, 2.5]
