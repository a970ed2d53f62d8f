"""The unit tools, served on the MCP SDK's low-level `Server`.

Each tool is a flat pydantic argument model from `arguments` (the input schema and its one validation), a
pydantic result model (the output schema and the structured content), a risk label, the standard annotations and
its `UnitService` method, which gets the validated model. The low-level
server is used rather than `MCPServer` so that the schemas come straight from those models and every
`UnitError` is mapped to an `isError` result in one place, `UnitTools.call_tool`.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
import time
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.shared.exceptions import MCPError
from mcp_types.version import is_version_at_least
from opentelemetry import trace
from pydantic import BaseModel

from . import resultlog
from ._version import __version__
from .arguments import Operation, RunTestsArgs, TestStatusArgs
from .cancel import cancellation, client_gone
from .changelog import PAGE, Caller, undo_risk
from .confirm import Confirmations, Elicit
from .errors import Declined, UnitError
from .paging import clip
from .service import UnitService, call_as
from .tooldecl import Refusal, ToolDecl
from .wire import ERROR_META_KEY, REPLAY_META_KEY, Risk, call_risk
from .wire import RISK_META_KEY as RISK_META_KEY  # re-exported: clients read a tool's risk under this key

_PREFIX = re.compile(r"[A-Za-z0-9_-]{0,40}")
_TOOL_NAME = re.compile(
    r"\bunit_(list|resolve|inspect|read_source|apply_patch|create_source|run_tests|reload|read_log|snapshot"
    r"|restore_snapshot|history|revert|changes|checkpoint|rollback|revert_change|test_status|cancel_test"
    r"|request_local_access)\b"
)

log = logging.getLogger("unit_mcp.tools")
# Arguments named in the app log's call lines (`call unit_apply_patch unit_id=counter source_id=… ok in 3.1 ms`);
# contents, patches and hashes are left out.
_LOGGED_ARGS = ("unit_id", "source_id", "test_name", "dry_run")
MAX_SHOWN_ARG = 120
MAX_ERROR_TEXT = 2000

INSTRUCTIONS = """\
Develop the hot-reloadable units (plugins) of a running Python application. A unit is addressed by its \
unit_id and its files by source_id (a path relative to the unit, '/' separators) - never by filesystem paths.

Workflow:
1. unit_list to see every unit, or unit_resolve with a few words to find the one you mean.
2. unit_inspect the unit: its source artifacts (with hashes), lifecycle exports, activities and tests.
3. unit_read_source to get a file's content and its hash.
4. unit_apply_patch with expected_hash set to that hash: either `old`+`new` (exact text, matched once) or \
`patch` (a unified diff). The unit is reloaded at once; if the reload fails the old source is put back. \
unit_create_source adds a new file to a directory unit.
5. unit_run_tests runs the unit's test_<name>.py in a separate process; a long run answers state 'running' \
with a run_id: follow it with unit_test_status (wait_s), stop it with unit_cancel_test.
6. unit_reload reloads a unit after a change made outside these tools; its evidence says whether the \
active activity came back.
7. unit_read_log reads the application log (filter with grep) to see what the units did.
8. unit_checkpoint before a risky series of edits; unit_rollback puts every source back to it (dry_run first); \
unit_changes lists what was written, refused or changed outside; unit_revert_change undoes one change.

A long answer is cut to fit: truncated is true and next_cursor, passed back as cursor, reads on. A result \
leaves out each field at its default (null, false, 0, an empty list): no next_cursor means the end.

A refused call is an error result starting with a stable code in brackets, e.g. [stale_hash] or \
[no_match], followed by a hint that says what to do next."""


CLIENT_INJECTED_ARGUMENTS: dict[str, type] = {
    # Gemini CLI (0.61) adds this boolean to every tool's input schema, tells its model to set it on dependent
    # calls and forwards it unchanged (google-gemini/gemini-cli#27403).
    "wait_for_previous": bool,
}
"""Arguments that known MCP clients add to every call on their own: accepted with their documented type and
ignored. Any other unknown argument is still refused."""


def without_client_arguments(arguments: dict[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """`arguments` without the client-injected ones a tool does not declare itself (a wrong type stays, and
    is refused like any unknown argument)."""
    declared = set(fields)
    return {
        key: value
        for key, value in arguments.items()
        if key in declared
        or key not in CLIENT_INJECTED_ARGUMENTS
        or not isinstance(value, CLIENT_INJECTED_ARGUMENTS[key])
    }


HISTORY_INSTRUCTIONS = """
9. unit_history lists the accepted versions of a source (newest first); unit_revert puts one back, \
checked and reloaded like an edit."""


@dataclass(frozen=True, kw_only=True)
class ToolSpec(ToolDecl):
    """A unit tool: its `UnitService` method (which names its argument model and returns its result model), its
    risk, what its annotations promise and when a person is asked."""

    handler: Operation[BaseModel]
    """The `UnitService` method the tool calls with the service and its validated argument model."""
    args: type[BaseModel] = field(init=False)
    result: type[BaseModel] | None = field(init=False)
    open_world: bool | None = False
    compact_schema: bool = True
    always_confirm: bool = False
    """Every call waits for a person's yes, whatever --confirm says and whatever the page allowed for a while."""
    question: Callable[[UnitService, Any], str] | None = None
    """What the person is asked, from the call's arguments; it refuses a call that could not run anyway."""
    at_once: Callable[[UnitService, Any], BaseModel | None] | None = None
    """Answers on the event loop when the call is cheaper than the hop to a worker thread, else None."""
    raised_risk: Callable[[UnitService, Any], Risk | None] | None = None
    """A higher risk than `risk` for this call, from what it would do (blocking), else None: decided per call, as
    a dry run's lower risk is."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", self.handler.model)
        object.__setattr__(self, "result", typing.get_type_hints(self.handler)["return"])


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "unit_list",
        "List units",
        "List every unit of the application, sorted by unit_id: its loader, source handle (kind and primary "
        "source_id), whether it is loaded (and its load error), what can be edited, its test names and "
        "whether it can be committed. Start here.",
        handler=UnitService.list,
        risk="normal",
        read_only=True,
        destructive=False,
        idempotent=True,
    ),
    ToolSpec(
        "unit_resolve",
        "Find a unit by description",
        "Find the unit meant by a natural-language description. Returns ranked candidates with a confidence "
        "from 0 to 1 and the evidence that matched (unit id, module, file names, docstring, symbols).",
        handler=UnitService.resolve,
        risk="normal",
        read_only=True,
        destructive=False,
        idempotent=True,
    ),
    ToolSpec(
        "unit_inspect",
        "Inspect a unit",
        "Describe one unit: loader, module, source handle, load state, docstring, lifecycle exports "
        "(init/drop/snapshot/restore), registered activities, test names and every source artifact with "
        "its kind, size and hash. Use it to learn the source_ids before reading or editing.",
        handler=UnitService.inspect,
        risk="normal",
        read_only=True,
        destructive=False,
        idempotent=True,
    ),
    ToolSpec(
        "unit_read_source",
        "Read a unit source",
        "Read one UTF-8 text file of a unit. Returns its content, its hash (pass it as expected_hash to "
        "unit_apply_patch), its size and its line endings. Binary files are refused.",
        handler=UnitService.read_source,
        risk="filesystem-read",
        read_only=True,
        destructive=False,
        idempotent=True,
        at_once=UnitService.read_source_at_once,
    ),
    ToolSpec(
        "unit_apply_patch",
        "Edit a unit source",
        "Edit one existing file of a unit, then reload the unit. Give either `old` and `new` (exact text that "
        "must match exactly once, unless replace_all) or `patch` (a unified diff). Always pass expected_hash "
        "from unit_read_source so a concurrent change is not overwritten. Python is compiled first: a syntax "
        "error writes nothing. If the reload fails, the previous source is restored and the error is "
        "returned. dry_run shows the diff without writing. Risk shell: the reload runs the new code in the "
        "application; a dry run only reads.",
        handler=UnitService.apply_patch,
        risk="shell",
        read_only=False,
        destructive=True,
        idempotent=False,
        dry_run_risk="filesystem-read",
        at_once=UnitService.apply_patch_at_once,
    ),
    ToolSpec(
        "unit_create_source",
        "Create a unit source",
        "Create a new file inside a directory unit (never overwrites; missing folders are created), then "
        "reload the unit. Python is compiled first. If the reload fails, the new file is removed again. "
        "Name a test module test_<name>.py to make it runnable with unit_run_tests. Risk shell: the reload runs "
        "the new code in the application.",
        handler=UnitService.create_source,
        risk="shell",
        read_only=False,
        destructive=False,
        idempotent=False,
    ),
    ToolSpec(
        "unit_run_tests",
        "Run a unit's tests",
        "Run the unit's test module test_<test_name>.py in a separate process with the unit loaded: its "
        "main() if it has one (None, 0 or True passes), pytest otherwise. Returns passed, exit_code, stdout, "
        "stderr, duration and timed_out. A run past the timeout is killed and reported as [test_timeout]. "
        "Sends progress notifications while it runs. wait=false, or a run longer than the server's longest "
        "call, answers state 'running' with a run_id: follow it with unit_test_status.",
        handler=UnitService.run_tests,
        risk="shell",
        read_only=False,
        destructive=False,
        idempotent=True,
    ),
    ToolSpec(
        "unit_test_status",
        "Status of a test run",
        "The result of a run started by unit_run_tests (by its run_id), exactly as unit_run_tests would have "
        "returned it, or state 'running' with the time so far. wait_s waits up to that many seconds for the end.",
        handler=UnitService.test_status,
        risk="normal",
        read_only=True,
        destructive=False,
        idempotent=True,
    ),
    ToolSpec(
        "unit_cancel_test",
        "Cancel a test run",
        "Stop a run started by unit_run_tests: its processes are killed. Its status then answers [cancelled]. "
        "Risk shell, like the run: it kills processes (normal stays for calls that only read).",
        handler=UnitService.cancel_test,
        risk="shell",
        read_only=False,
        destructive=False,
        idempotent=True,
    ),
    ToolSpec(
        "unit_reload",
        "Reload a unit",
        "Reload a unit from its current source as one transaction (snapshot, drop, import, init, restore, "
        "re-activate); on failure the previous version keeps running. Returns evidence: reloaded, whether "
        "state was restored, and the activity active before and after. Edits through unit_apply_patch and "
        "unit_create_source reload by themselves.",
        handler=UnitService.reload,
        risk="shell",
        read_only=False,
        destructive=True,
        idempotent=False,
    ),
    ToolSpec(
        "unit_read_log",
        "Read the application log",
        "Read the newest lines of the application log, oldest first, optionally only those containing "
        "`grep`, with their absolute line_numbers. Units log as 'units.<unit_id>'. Page back with "
        "before=line_numbers[0]; or read forward from a line number with offset (and limit). has_more says "
        "whether more matching lines exist in the direction read.",
        handler=UnitService.read_log,
        risk="filesystem-read",
        read_only=True,
        destructive=False,
        idempotent=True,
    ),
    ToolSpec(
        "unit_snapshot",
        "Snapshot a unit's state",
        "Return the live state of a loaded unit as its snapshot() export gives it (the state a reload "
        "carries over), host paths redacted, and a snapshot_id to put it back later with unit_restore_snapshot "
        "(the newest snapshots are kept in memory). supported is false when the unit has no snapshot().",
        handler=UnitService.snapshot,
        risk="normal",
        read_only=True,
        destructive=False,
        idempotent=True,
    ),
    ToolSpec(
        "unit_restore_snapshot",
        "Restore a unit's state",
        "Hand the state captured by unit_snapshot (its snapshot_id) back to the loaded unit's restore(). If "
        "restore() fails, the state it had just before is put back and the error returned. Risk shell: it runs "
        "the unit's restore() code in the application.",
        handler=UnitService.restore_snapshot,
        risk="shell",
        read_only=False,
        destructive=True,
        idempotent=False,
    ),
    ToolSpec(
        "unit_changes",
        "List the change log",
        "List the change log, newest first: every write a tool made or tried (applied, refused with its code, "
        "rolled back after a failed reload, failed) and every change made outside these tools, with the client "
        "that made it, the tool, unit, source, hashes before and after and the sources changed. Filter by "
        "unit_id (and source_id) and since (ISO time); page with cursor=next_cursor.",
        handler=UnitService.changes,
        risk="filesystem-read",
        read_only=True,
        destructive=False,
        idempotent=True,
    ),
    ToolSpec(
        "unit_checkpoint",
        "Take a checkpoint",
        "Keep the bytes of every unit's sources (or of unit_ids; optionally with a label, and with_state: each "
        "unit's snapshot() state too); unit_rollback with the returned checkpoint_id puts every source back to "
        "them, whoever changed it since. Writes no source.",
        handler=UnitService.checkpoint,
        risk="normal",
        read_only=False,
        destructive=False,
        idempotent=False,
    ),
    ToolSpec(
        "unit_rollback",
        "Roll back to a checkpoint",
        "Put every source changed since a checkpoint back to its bytes at the checkpoint, across units, and reload "
        "those units, all or nothing: if one reload fails every source is put back and nothing changes. A source "
        "changed outside these tools since then is reported in conflicts and left alone unless force. dry_run "
        "returns each source's diff and the conflicts without writing. Risk destructive; a dry run only reads.",
        handler=UnitService.rollback,
        risk="destructive",
        read_only=False,
        destructive=True,
        idempotent=False,
        dry_run_risk="filesystem-read",
    ),
    ToolSpec(
        "unit_revert_change",
        "Revert one change",
        "Put every source of one change (change_id from unit_changes or a write's result) back to its bytes "
        "before it and reload, all or nothing; refused with [stale_hash] when a source changed since. dry_run "
        "shows the diff. Risk shell: the reload runs the reverted code; destructive when the change has several "
        "sources or was itself a rollback or a revert (it undoes many changes at once); a dry run only reads.",
        handler=UnitService.revert_change,
        risk="shell",
        read_only=False,
        destructive=True,
        idempotent=False,
        dry_run_risk="filesystem-read",
        raised_risk=lambda service, args: undo_risk(service.change_log, args.change_id),
    ),
)


HISTORY_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "unit_history",
        "List a source's versions",
        "List the accepted versions of one source of a unit, newest first: version number, hash, size, time "
        "and the tool call that wrote it (null for a change made outside these tools). Offered when the "
        "unit's loader keeps history.",
        handler=UnitService.history,
        risk="filesystem-read",
        read_only=True,
        destructive=False,
        idempotent=True,
    ),
    ToolSpec(
        "unit_revert",
        "Revert a source to a version",
        "Put one source of a unit back to a version from unit_history, then reload the unit, exactly like "
        "unit_apply_patch: pass expected_hash from unit_read_source; if the reload fails, the source is "
        "restored and the error returned. dry_run shows the diff without writing. The revert is itself "
        "recorded as a new version. Risk shell: the reload runs the reverted code; a dry run only reads.",
        handler=UnitService.revert,
        risk="shell",
        read_only=False,
        destructive=True,
        idempotent=False,
        dry_run_risk="filesystem-read",
    ),
)


LOCAL_ACCESS_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "unit_request_local_access",
        "Ask for local access to a unit's folder",
        "Ask a person to let this OpenCode session use its own read and edit tools in one directory unit's folder "
        "for `minutes` (default 30), when the unit tools cannot do the job; say why in `reason`. Returns, once "
        "approved, the folder to use and when the access ends; OpenCode must be restarted from $OPENCODE_CMD "
        "to get it. Edits made there skip the stale-content check and reach the application through the file "
        "watcher. Offered when the server runs with --allow-local-access; always asks a person.",
        handler=UnitService.request_local_access,
        risk="destructive",
        read_only=False,
        destructive=True,
        idempotent=False,
        always_confirm=True,
        question=UnitService.local_access_question,
    ),
)


def check_prefix(prefix: str) -> str:
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"tool prefix {prefix!r} must be at most 40 of A-Z a-z 0-9 _ -")
    return prefix


def tool_risks(prefix: str = "", *, history: bool = False, local_access: bool = False) -> dict[str, str]:
    """The risk label of every tool by its (prefixed) name, for approval policies outside MCP; `history` adds
    the two tools offered when the loader keeps history, `local_access` the one of --allow-local-access. A dry
    run of a tool with a `dry_run_risk` is lower (`wire.call_risk`)."""
    check_prefix(prefix)
    extra = (*(HISTORY_TOOLS if history else ()), *(LOCAL_ACCESS_TOOLS if local_access else ()))
    return {prefix + spec.name: spec.risk for spec in (*TOOLS, *extra)}


def _shown(value: object) -> str:
    """An argument as the call log shows it: a plain value as it is; anything else escaped and clipped, so that an
    argument can neither start a log line of its own (newlines, U+2028) nor flood the log."""
    text = str(value)
    if len(text) <= MAX_SHOWN_ARG and text.isprintable() and " " not in text:
        return text
    return ascii(text[:MAX_SHOWN_ARG]) + ("..." if len(text) > MAX_SHOWN_ARG else "")


def _clip(text: str, limit: int = MAX_ERROR_TEXT) -> str:
    """A refusal echoes what it refused; past `limit` characters that costs the model context, not clarity."""
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text) - limit} more characters]"


def _shown_message(text: str) -> str:
    """A refusal message as one log line: clipped, with line breaks and other control characters escaped."""
    return "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in _clip(text))


def _clipped(value: Any) -> Any:
    """A refusal's details with every text clipped: they are sent twice (text and `_meta`) and a timed-out test's
    output could otherwise fill a result."""
    if isinstance(value, str):
        return clip(value, MAX_ERROR_TEXT)
    if isinstance(value, dict):
        return {key: _clipped(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_clipped(item) for item in value]
    return value


def _error_text(code: str, message: str, hint: str, details: dict[str, Any] | None) -> str:
    text = f"[{code}] {message}"
    if hint:
        text += f"\nHint: {hint}"
    if details:
        text += "\nDetails: " + json.dumps(details, ensure_ascii=False, default=str)
    return text


class UnitTools:
    """The tool surface over one `UnitService`: lists the tools and runs calls off the event loop."""

    def __init__(
        self,
        service: UnitService,
        *,
        prefix: str = "",
        progress_interval: float = 1.0,
        confirmations: Confirmations | None = None,
    ) -> None:
        self.service = service
        self.confirmations = confirmations
        self.prefix = check_prefix(prefix)
        self.progress_interval = progress_interval
        # The history tools are always callable (a loader without history refuses with [not_supported]) but
        # listed only when the loader keeps history.
        local = LOCAL_ACCESS_TOOLS if service.local_access is not None else ()
        self.specs = {prefix + spec.name: spec for spec in (*TOOLS, *HISTORY_TOOLS, *local)}
        history = service.loader.capabilities.history
        self.instructions = self._prefixed(INSTRUCTIONS + (HISTORY_INSTRUCTIONS if history else ""))
        offered = {spec.name for spec in (*TOOLS, *(HISTORY_TOOLS if history else ()), *local)}
        self.tools = [
            spec.mcp_tool(name=name, description=self._prefixed(spec.description))
            for name, spec in self.specs.items()
            if spec.name in offered
        ]

    def _prefixed(self, text: str) -> str:
        """Names the tools with the prefix in descriptions, instructions and hints."""
        return _TOOL_NAME.sub(lambda m: self.prefix + m.group(0), text) if self.prefix else text

    def input_schema(self, name: str) -> dict[str, Any] | None:
        spec = self.specs.get(name)
        return None if spec is None else spec.input_schema

    def server(self, name: str = "unit-mcp") -> Server[Any]:
        """A low-level MCP server for these tools: `Bridge` serves it over HTTP, `Client(server)` in memory.

        The SDK wraps every request in an OpenTelemetry span; with no tracer provider set when the server is
        built, those spans record nothing and cost ~5% of a small call, so the middleware is left out."""
        server: Server[Any] = Server(
            name,
            version=__version__,
            title="Unit development tools",
            instructions=self.instructions,
            get_tool_input_schema=self.input_schema,
            on_list_tools=self.list_tools,
            on_call_tool=resultlog.recording(self.call_tool, lambda ctx, params: params.name),
            on_list_resources=_no_resources,
            on_list_prompts=_no_prompts,
        )
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            server.middleware = [m for m in server.middleware if not isinstance(m, OpenTelemetryMiddleware)]
        if self.confirmations is not None:  # seals a parked question's token to its call (tool and arguments)
            security = RequestStateSecurity.ephemeral(ttl=2 * self.confirmations.timeout + 60)
            server.middleware.append(RequestStateBoundary(security, default_audience=name))
        return server

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools)

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Validate, run the tool's handler in a worker thread (storage and unit code never block the loop; a small
        read from a folder is answered at once) and map every outcome to a result."""
        spec = self.specs.get(params.name)
        if spec is None:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {params.name}")
        args = spec.validate(without_client_arguments(params.arguments or {}, spec.args.model_fields), name=params.name)
        if isinstance(args, Refusal):
            return self._error(args.code, args.message, args.hint, None)
        caller = _caller(ctx)
        replay = (params.meta or {}).get(REPLAY_META_KEY) is True
        call = functools.partial(call_as, caller, functools.partial(spec.handler, self.service, args), replay=replay)
        target = " ".join(
            f"{key}={_shown(getattr(args, key))}" for key in _LOGGED_ARGS if key in spec.args.model_fields
        )
        started = time.perf_counter()
        try:
            risk = call_risk(spec.risk, spec.dry_run_risk, params.arguments)
            if spec.raised_risk is not None and risk == spec.risk and self.confirmations is not None:
                raised = await anyio.to_thread.run_sync(spec.raised_risk, self.service, args)
                risk = raised or risk
            if spec.always_confirm and self.confirmations is None:
                raise Declined(f"{params.name} needs a person's yes, and this server asks none (no --confirm).")
            where = {"unit_id": getattr(args, "unit_id", None), "source_id": getattr(args, "source_id", None)}
            if self.confirmations is not None and params.request_state is not None:  # a 2026-era client's answer
                await self.confirmations.resume(params.request_state, _answer(params.input_responses))
            elif self.confirmations is not None and (spec.always_confirm or self.confirmations.needed(risk, caller)):
                diff = await self._dry_run(spec, args, caller)
                summary = f"{params.name} (risk {risk}) from client {caller.name or '(unnamed)'}: {target or 'no unit'}"
                question = self.confirmations.question(
                    caller, params.name, risk, summary, diff, **where, log=self.service.change_log
                )
                if _asks_between_rounds(ctx):
                    await self.confirmations.park(question)
                    return _input_required(self.confirmations.message(question), question.token)
                await self.confirmations.ask(question, _elicitor(ctx), gone=client_gone.get())
            if isinstance(args, RunTestsArgs):
                result = await self._with_progress(ctx, call, f"test_{args.test_name} of unit {args.unit_id}")
            elif isinstance(args, TestStatusArgs) and args.wait_s > 0:
                result = await self._with_progress(ctx, call, f"test run {args.run_id}")
            else:
                quick = None if spec.at_once is None else spec.at_once(self.service, args)
                result = quick if quick is not None else await _in_thread(call)
        except UnitError as exc:
            log.info("call %s %s refused: [%s] %s", params.name, target, exc.code, _shown_message(exc.message))
            return self._error(exc.code, exc.message, exc.hint, exc.details)
        except Exception:
            log.exception("%s failed unexpectedly", params.name)
            return self._error(
                "internal_error",
                f"{params.name} failed unexpectedly; nothing more is known to the caller.",
                "The server log has the details: unit_read_log with grep='unit_mcp.tools'.",
                None,
            )
        log.info("call %s %s ok in %.1f ms", params.name, target, (time.perf_counter() - started) * 1000)
        # The text mirror is for clients that ignore structured content; pydantic's encoder is ~4x json.dumps here.
        # A field at its default is left out of both (docs/tools.md): fewer tokens, and less for a client to check.
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=result.model_dump_json(exclude_defaults=True))],
            structured_content=result.model_dump(mode="json", exclude_defaults=True),
        )

    async def _dry_run(self, spec: ToolSpec, args: BaseModel, caller: Caller) -> str | None:
        """The diff a write would make, for the person asked (a tool with a dry run only), or the tool's own
        `question`; a refusal ends the call."""
        if spec.question is not None:
            ask = functools.partial(call_as, caller, functools.partial(spec.question, self.service, args))
            return str(await anyio.to_thread.run_sync(ask))
        if spec.dry_run_risk is None or getattr(args, "dry_run", None) is not False:
            return None
        dry = args.model_copy(update={"dry_run": True})
        run = functools.partial(spec.handler, self.service, dry)
        result = await _in_thread(functools.partial(call_as, caller, run))
        diff = getattr(result, "diff", None)
        if diff is None:
            diff = "\n".join(s.diff for s in getattr(result, "sources", []) if getattr(s, "diff", None)) or None
        return clip(diff, MAX_ERROR_TEXT) if diff else None

    def _error(self, code: str, message: str, hint: str, details: dict[str, Any] | None) -> types.CallToolResult:
        """The one place a refusal becomes a wire result: redacted text for the model, the fields in `_meta`."""
        redact = self.service.host.redact
        message, hint = _clip(redact(message)), _clip(self._prefixed(redact(hint)))
        error: dict[str, Any] = {"code": code, "message": message, "hint": hint}
        if details:
            error["details"] = _clipped(json.loads(redact(json.dumps(details, ensure_ascii=False, default=str))))
        text = _error_text(error["code"], error["message"], error["hint"], error.get("details"))
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], is_error=True, _meta={ERROR_META_KEY: error}
        )

    async def _with_progress(
        self, ctx: ServerRequestContext[Any], call: Callable[[], BaseModel], label: str
    ) -> BaseModel:
        """Run `call` in a worker thread, reporting progress every `progress_interval` seconds until it ends."""

        async def report() -> None:
            started = anyio.current_time()
            while True:  # once at the start: a run shorter than the interval is reported too
                elapsed = anyio.current_time() - started
                try:
                    await ctx.session.report_progress(elapsed, None, f"running {label}: {elapsed:.0f} s")
                except Exception:
                    log.debug("progress for %s could not be sent", label, exc_info=True)
                    return
                await anyio.sleep(self.progress_interval)

        outcome: list[BaseModel | Exception] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(report)
            try:
                outcome.append(await _in_thread(call))
            except Exception as exc:  # raised after the task group, which would wrap it in an ExceptionGroup
                outcome.append(exc)
            tg.cancel_scope.cancel()
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return outcome[0]


MAX_CLIENT_TEXT = 200


def _caller(ctx: ServerRequestContext[Any]) -> Caller:
    """Who makes a call, for the change log and the page's grants: the client's `clientInfo` and the MCP session
    its transport routed the call by, where there is one. A 2026-07-28 call has none: whatever `Mcp-Session-Id`
    header it carries was routed by nothing and is the caller's own claim."""
    params = ctx.session.client_params
    info = params.client_info if params is not None else None
    session_id = None
    if not is_version_at_least(ctx.protocol_version, "2026-07-28"):
        headers = getattr(ctx.request, "headers", None)  # the session manager routed it to this session
        session_id = headers.get("mcp-session-id") if headers is not None else None
        if session_id is None and (query := getattr(ctx.request, "query_params", None)) is not None:
            session_id = query.get("session_id")  # legacy SSE names the session in its message URL, routed likewise

    def clipped(text: object) -> str | None:
        return None if text is None else str(text)[:MAX_CLIENT_TEXT]

    name = clipped(info and info.name)
    if name == PAGE.name:  # a client's own name for itself: it cannot pass for the page in the log
        name = f"{name} (as a client named itself)"
    return Caller(name, clipped(info and info.version), clipped(session_id))


def _elicitor(ctx: ServerRequestContext[Any]) -> Elicit | None:
    """Asks through the client when it declared elicitation (a form with one yes/no field), else None. Sent on
    the session's channel, not the call's: a call without a progress token is answered as one JSON body here
    (`mcphttp`), which has no room for a request; a connection with no channel at all leaves it to the page."""
    capabilities = ctx.session.client_capabilities
    if capabilities is None or capabilities.elicitation is None:
        return None

    async def elicit(message: str) -> bool:
        related = ctx.request_id if ctx.session.can_send_request else None
        result = await ctx.session.elicit_form(message, _YES_NO, related_request_id=related)
        yes = _yes(result)
        if yes is None:
            raise RuntimeError("the client dismissed the question without a choice (cancel)")
        return yes

    return elicit


def _yes(result: types.ElicitResult) -> bool | None:
    """accept with the box ticked: yes; decline, or accept unticked: no; cancel (dismissed, or a headless client
    that shows no questions): None."""
    if result.action == "cancel":
        return None
    return result.action == "accept" and bool((result.content or {}).get("approve"))


def _asks_between_rounds(ctx: ServerRequestContext[Any]) -> bool:
    """A 2026-07-28 client with elicitation is asked in the call's result (`input_required`) and answers in its
    retry: that era has no channel for a request while the call runs."""
    capabilities = ctx.session.client_capabilities
    declared = capabilities is not None and capabilities.elicitation is not None
    return declared and is_version_at_least(ctx.protocol_version, "2026-07-28")


CONFIRM_INPUT = "confirm"
"""The key of the yes/no form in a 2026-era `input_required` result and in the client's `inputResponses`."""


def _input_required(message: str, token: str | None) -> types.InputRequiredResult:
    form = types.ElicitRequestFormParams(message=message, requested_schema=_YES_NO)
    return types.InputRequiredResult(
        input_requests={CONFIRM_INPUT: types.ElicitRequest(params=form)}, request_state=token
    )


def _answer(responses: types.InputResponses | None) -> bool | None:
    """The person's yes or no in a 2026-era retry; None when the client sent none (or a cancel)."""
    response = (responses or {}).get(CONFIRM_INPUT)
    return _yes(response) if isinstance(response, types.ElicitResult) else None


_YES_NO: Any = {
    "type": "object",
    "properties": {"approve": {"type": "boolean", "title": "Run this call", "default": False}},
    "required": ["approve"],
}


CANCEL_GRACE = 5.0
"""Seconds a cancelled call waits for its worker thread to stop (a test's processes die within 0.1 s)."""


async def _in_thread(call: Callable[[], BaseModel]) -> BaseModel:
    """Run `call` in a worker thread. When the client cancels the request (MCP `notifications/cancelled`, or
    it closes the request), the work is told so (`unit_mcp.cancel`): a test's process group is killed, a
    reload stops waiting for unit code; the call waits up to CANCEL_GRACE for the thread, then ends cancelled."""
    finished = threading.Event()

    def run() -> BaseModel:
        try:
            return call()
        finally:
            finished.set()

    with cancellation() as cancel:
        try:
            return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            cancel.set()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(finished.wait, CANCEL_GRACE)
            log.info("call cancelled by the client%s", "" if finished.is_set() else "; its thread still runs")
            raise


# Clients and the conformance suite list resources and prompts of every server; this one has none.
async def _no_resources(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[])


async def _no_prompts(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[])
