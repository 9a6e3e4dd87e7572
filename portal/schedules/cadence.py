"""When a schedule's slots are: pure functions of its cadence, no database.

- ``daily`` at HH:MM UTC: one slot a day.
- ``hours``: every N hours on a grid anchored at HH:MM UTC of 1970-01-01 (for N dividing
  24, the same times every day: every 4 h from 00:00 is 00:00, 04:00, ... 20:00).

``next_slot(..., after)`` is the first slot strictly after ``after``: a beat that was down
for a day fires a schedule once when it comes back, not once per missed slot.
"""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_HOURS = 24 * 7


def next_slot(cadence: str, at: time, every_hours: int | None, after: datetime) -> datetime:
    """The first slot of the cadence strictly after ``after`` (aware, UTC)."""
    after = after.astimezone(UTC)
    anchor = EPOCH + timedelta(hours=at.hour, minutes=at.minute)
    if cadence == "daily":
        step = timedelta(days=1)
    elif cadence == "hours" and every_hours and 1 <= every_hours <= MAX_HOURS:
        step = timedelta(hours=every_hours)
    else:
        raise ValueError(f"no cadence {cadence!r} every {every_hours!r} hours")
    periods = (after - anchor) // step + 1
    return anchor + periods * step
