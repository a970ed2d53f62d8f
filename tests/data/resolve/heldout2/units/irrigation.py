"""Waters garden zones on a schedule, skipping them when the soil is wet."""


def water_zone(*args):
    return args


def soil_moisture(*args):
    return args
