"""Looks forecasts up in data/cities.json."""

import json
from pathlib import Path

_TABLE = json.loads((Path(__file__).parent / "data" / "cities.json").read_text(encoding="utf-8"))


def cities():
    return sorted(_TABLE)


def forecast_for(city):
    """Return the forecast text for a city, or raise KeyError."""
    entry = _TABLE[city.lower()]
    return f"{entry['sky']}, {entry['high_c']} °C"
