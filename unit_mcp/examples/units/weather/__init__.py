"""Weather forecasts for a few cities, read from a bundled table."""

from starlette.responses import JSONResponse
from starlette.routing import Route

from .forecast import forecast_for, cities

__all__ = ["forecast_for", "cities", "routes"]


async def forecast(request):
    try:
        return JSONResponse({"forecast": forecast_for(request.path_params["city"])})
    except KeyError:
        return JSONResponse({"error": "unknown city", "cities": cities()}, status_code=404)


routes = [Route("/{city}", forecast)]
