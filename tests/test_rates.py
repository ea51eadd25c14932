from __future__ import annotations

import pytest

from mcpcreds.core.rates import Rate, parse_duration, parse_rate


@pytest.mark.parametrize(
    ("text", "burst", "per"),
    [
        ("60/1m", 60, 60.0),
        ("20/1s", 20, 1.0),
        ("20/1sec", 20, 1.0),
        ("20/0.5s", 20, 0.5),
        ("20/1", 20, 1.0),
        ("5/500ms", 5, 0.5),
        ("1/1d", 1, 86400.0),
        ("2/1w", 2, 604800.0),
        ("100/1h", 100, 3600.0),
        ("10/s", 10, 1.0),
        ("600/min", 600, 60.0),
        (" 3 / 2s ", 3, 2.0),
    ],
)
def test_every_seed_rate_form_parses(text: str, burst: int, per: float) -> None:
    assert parse_rate(text) == Rate(burst, per)


@pytest.mark.parametrize("text", ["0/1s", "10", "-1/1s", "10/1.5m", "x/1s", "10/0s", "10/1y", "", "5/1 s"])
def test_bad_rates_are_errors_that_never_quote_the_string(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_rate(text)
    assert str(info.value).startswith("invalid rate") and repr(text) not in str(info.value)


def test_rate_formats_readably_and_knows_its_refill() -> None:
    assert str(parse_rate("60/1m")) == "60/1m"
    assert str(parse_rate("5/500ms")) == "5/500ms"
    assert parse_rate("60/1m").per_second == 1.0


@pytest.mark.parametrize(("value", "seconds"), [("60s", 60.0), ("5m", 300.0), ("1.5s", 1.5), (30, 30.0)])
def test_durations(value: str | int, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["soon", "-5s", -1, True])
def test_bad_durations(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)  # type: ignore[arg-type]
