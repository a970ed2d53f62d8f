"""A failing test, so a newcomer sees what a failure looks like."""


def test_oslo_is_warm(unit):
    assert unit.forecast_for("oslo").endswith("25 °C")
