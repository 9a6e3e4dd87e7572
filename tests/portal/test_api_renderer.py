"""The API's JSON renderer (``portal.api.renderers``): DRF's JSON, encoded by orjson.

Every value an answer can hold reads back as DRF's own renderer writes it; what orjson
cannot encode goes to DRF; the API answers through it."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal

import pytest
from django.utils.translation import gettext_lazy
from rest_framework.renderers import JSONRenderer as DRFRenderer

from portal.api.renderers import JSONRenderer, dumps

VALUES = {
    "text": "naïve café ✓ \u2028 and \u2029 <script>",
    "floats": [0.1, 1e-05, 1e16, 123456.789, -0.0, 2.5e-300, 1.7976931348623157e308],
    "ints": [0, -1, 2**63 - 1, -(2**63)],
    "flags": [True, False, None],
    "nested": {"a": [{"b": {"c": []}}], "empty": {}},
    "utc": datetime(2026, 12, 7, 15, 4, 5, 123456, tzinfo=UTC),
    "offset": datetime(2026, 12, 7, 15, 4, 5, tzinfo=timezone(timedelta(hours=2))),
    "naive": datetime(2026, 12, 7, 15, 4, 5),
    "date": date(2026, 12, 7),
    "time": time(15, 4, 5, 250000),
    "decimal": Decimal("12.50"),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "lazy": gettext_lazy("Not found."),
    "tuple": (1, "two", 3.0),
    3: "an integer key",
}


def test_it_writes_what_drf_writes():
    ours, drf = JSONRenderer().render(VALUES), DRFRenderer().render(VALUES)
    assert json.loads(ours) == json.loads(drf)
    # DRF's own forms: "Z" for UTC, microseconds kept, a Decimal as a number, U+2028/9
    # escaped so the answer is a JavaScript literal too.
    for expected in (
        b'"2026-12-07T15:04:05.123456Z"',
        b'"2026-12-07T15:04:05+02:00"',
        b'"decimal":12.5,',
        b"\\u2028 and \\u2029",
    ):
        assert expected in ours and expected in drf
    assert "\u2028".encode() not in ours
    assert b'"3":"an integer key"' in ours  # a key that is not a string, as json writes it


def test_what_orjson_cannot_encode_goes_to_drf():
    huge = {"n": 2**70}
    expected = b'{"n":1180591620717411303424}'
    assert JSONRenderer().render(huge) == DRFRenderer().render(huge) == expected
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps({"a": object()})  # DRF's encoder says what it cannot encode


def test_indented_answers_are_drfs():
    media = "application/json; indent=2"
    assert JSONRenderer().render(VALUES, media) == DRFRenderer().render(VALUES, media)


def test_not_a_number_is_null_where_drf_refuses_the_answer():
    assert JSONRenderer().render({"x": float("nan"), "y": float("inf")}) == b'{"x":null,"y":null}'
    with pytest.raises(ValueError, match="Out of range float values"):
        DRFRenderer().render({"x": float("nan")})


@pytest.mark.django_db
def test_the_api_answers_through_it(personas, make_run):
    make_run(owner=personas["owner"].user, name="rendered ✓")
    response = personas["owner"].client.get("/api/v1/runs/")
    assert response.status_code == 200
    assert type(response.accepted_renderer) is JSONRenderer
    assert response["Content-Type"] == "application/json"
    body = response.content
    assert body == dumps(response.data)  # compact UTF-8, as orjson writes it
    assert "rendered ✓".encode() in body
