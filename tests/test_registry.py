"""server.json, the MCP registry's description of this server, checked offline against the registry's published
schema (vendored in tests/data/registry from modelcontextprotocol/registry, docs/reference/server-json) and against
pyproject.toml, so the name and version cannot drift."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import jsonschema

from unit_mcp import __version__

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "tests" / "data" / "registry" / "server.schema.json").read_text())


def test_server_json_is_valid_for_the_registry_and_agrees_with_pyproject() -> None:
    server = json.loads((REPO / "server.json").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    jsonschema.Draft7Validator(SCHEMA, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER).validate(server)
    assert server["$schema"] == SCHEMA["$id"]
    assert server["name"].split("/")[1] == project["name"]
    assert server["version"] == project["version"] == __version__
    assert server["description"] == project["description"]
    (package,) = server["packages"]
    assert package["registryType"] == "pypi"
    assert (package["identifier"], package["version"]) == (project["name"], __version__)
    assert project["scripts"][project["name"]] == "unit_mcp.cli:main"  # what the runtime hint starts
    assert package["packageArguments"][0] == {  # its subcommand: the unit server
        "type": "positional",
        "value": "serve",
        "valueHint": "command",
        "description": "The unit server (unit-mcp serve).",
    }


def test_the_schema_check_is_not_a_formality() -> None:
    """The vendored schema refuses what the registry refuses (a version range, a name without a namespace)."""
    server = json.loads((REPO / "server.json").read_text())
    validator = jsonschema.Draft7Validator(SCHEMA, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    assert validator.is_valid(server)
    assert not validator.is_valid({**server, "name": "unit-mcp"})
    assert not validator.is_valid({**server, "packages": [{**server["packages"][0], "version": "latest"}]})
    assert not validator.is_valid({**server, "description": "x" * 101})
