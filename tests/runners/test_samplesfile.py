"""The samples file of a point too large to travel inline (runners.samplesfile): written
a slice at a time, read back equal; its reading sample keeps every array aligned."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import random

import pytest

from runners import samplesfile


def detail(n: int, gaps: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    ttfts = [rng.random() for _ in range(n)]
    itls = [[rng.random() / 100 for _ in range(rng.randint(0, gaps))] for _ in range(n)]
    return {
        "input_lens": [rng.randint(1, 99) for _ in range(n)],
        "output_lens": [len(g) + 1 for g in itls],
        "ttfts": ttfts,
        "itls": itls,
        "latencies": [t + sum(g) for t, g in zip(ttfts, itls, strict=True)],
        "errors": ["" if i % 7 else "timeout" for i in range(n)],
    }


def test_written_a_slice_at_a_time_it_reads_back_equal(monkeypatch, tmp_path):
    monkeypatch.setattr(samplesfile, "SLICE", 7)  # many slices, and a short last one
    arrays = detail(50, 12) | {"empty": [], "one": [1.5], "meta": {"k": 1}}
    out = io.BytesIO()
    samplesfile.write(arrays, out)
    assert json.loads(gzip.decompress(out.getvalue())) == arrays
    size, digest = samplesfile.write_file(arrays, tmp_path / "s.json.gz")
    blob = (tmp_path / "s.json.gz").read_bytes()
    assert size == len(blob) and digest == hashlib.sha256(blob).hexdigest()
    assert json.loads(gzip.decompress(blob)) == arrays


def test_a_non_finite_number_is_refused():
    with pytest.raises(ValueError):
        samplesfile.write({"ttfts": [1.0, math.nan]}, io.BytesIO())


def test_values_count_every_number_and_every_token_gap():
    arrays = {"ttfts": [1.0, 2.0], "itls": [[0.1, 0.2, 0.3], []], "errors": ["", ""]}
    assert samplesfile.values_in(arrays) == 2 + 2 + 3 + 2
    assert samplesfile.requests_in(arrays) == 2


def test_the_reading_sample_is_aligned_bounded_and_the_same_on_a_retry():
    full = detail(2000, 40)
    limit = samplesfile.values_in(full) // 10
    sample, kept = samplesfile.reading_sample(full, limit, "vllm|single|0")
    again, _ = samplesfile.reading_sample(full, limit, "vllm|single|0")
    other, _ = samplesfile.reading_sample(full, limit, "vllm|single|1")
    assert sample == again and sample != other
    assert sample["sample_of"] == 2000 and 150 <= kept <= 250
    assert all(len(sample[k]) == kept for k in full)
    # Each kept request is one whole request of the full arrays, in the original order.
    rows = list(zip(*(full[k] for k in full), strict=True))
    index = {json.dumps(r): i for i, r in enumerate(rows)}
    picked = [index[json.dumps(r)] for r in zip(*(sample[k] for k in full), strict=True)]
    assert picked == sorted(picked) and len(set(picked)) == kept
    assert samplesfile.values_in({k: sample[k] for k in full}) <= limit * 1.3
    small, n = samplesfile.reading_sample(detail(10, 3), 10**6, "x")
    assert n == 10 and small["ttfts"] == detail(10, 3)["ttfts"]


def test_the_inline_limit_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(samplesfile.INLINE_VALUES_ENV, raising=False)
    assert samplesfile.inline_values() == samplesfile.INLINE_VALUES
    monkeypatch.setenv(samplesfile.INLINE_VALUES_ENV, "5000")
    assert samplesfile.inline_values() == 5000
    monkeypatch.setenv(samplesfile.INLINE_VALUES_ENV, "0")
    assert samplesfile.inline_values() == 1
