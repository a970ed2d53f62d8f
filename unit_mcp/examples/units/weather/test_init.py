"""No main(): runs under pytest, with the fixtures `host` and `unit`."""


def test_cities_are_sorted(unit):
    assert unit.cities() == sorted(unit.cities())


def test_forecast_for_lisbon(unit):
    assert unit.forecast_for("Lisbon") == "sunny, 19 °C"
