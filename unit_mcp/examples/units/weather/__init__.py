"""Weather forecasts for a few cities, read from a bundled table."""

from .forecast import forecast_for, cities

__all__ = ["forecast_for", "cities"]
