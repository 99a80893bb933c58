"""``flightlog demo``: a simulated agent that records a realistic session.

It records with the real SDK and the real event types of :mod:`flightlog.protocol`,
exactly as an agent loop would: an agent that plans a walk, over two turns, with model
calls and their usage, tool calls (one of which times out and is retried), a model call
that is rate limited and retried, and a checkpoint.  The model and the tools are
simulated; the pauses between steps (skipped with ``--fast``) make it worth following
live with ``flightlog tail -f``.

When no daemon is running it starts ``flightlogd`` on the default paths, detached from
this process (its own session, its output in ``<data root>/flightlogd.log``), and waits
until its socket accepts connections.  The SDK itself never depends on the daemon:
``flightlogd`` is found as a program next to this Python or on ``$PATH``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, Final

from flightlog.protocol import (
    ErrorCode,
    Execution,
)
from flightlog.protocol.events import (
    AgentEnd,
    AgentStart,
    AssistantMessage,
    CallConfig,
    ContextPrepareEnd,
    ContextPrepareStart,
    MessageEnd,
    ModelExecEnd,
    ModelExecStart,
    ModelRequest,
    Retry,
    RetryWaitEnd,
    RetryWaitStart,
    TextPart,
    ToolCallPart,
    ToolDeclaration,
    ToolExecEnd,
    ToolExecStart,
    ToolInvokeEnd,
    ToolInvokeStart,
    ToolQueued,
    ToolResultMessage,
    TurnEnd,
    TurnStart,
    Usage,
    UserMessage,
)
from flightlog.protocol.wire import (
    default_root,
    default_socket_path,
)
from flightlog.sdk import DaemonError, DaemonNotRunning, Run, connect

from ._commands import EXIT_NO_DAEMON, CommandError, cmd_show
from ._render import Style

__all__ = ["cmd_demo", "find_flightlogd", "record_demo_run", "start_daemon"]

_START_TIMEOUT: Final = 15.0
_MODEL: Final = "demo-sonnet-1"
_PROVIDER: Final = "simulated"

#: Commands that work without a package index (docs/operations.md, "Installing").
_INSTALL_HINT: Final = (
    "flightlogd is not installed: in a checkout of flightlog, `uv run flightlog demo` "
    "runs both from the workspace, and `uv tool install ./daemon "
    "--with-executables-from flightlog-sdk` installs the daemon with this command for "
    "you (`uv tool install flightlogd --with-executables-from flightlog-sdk` once it is "
    "published; see docs/operations.md, Installing); or start a daemon yourself and "
    "point $FLIGHTLOG_SOCKET at its socket"
)

_TOOLS: Final = [
    ToolDeclaration(
        name="get_weather",
        description="Tomorrow's weather forecast for a city.",
        parameters={
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    ),
]

_SYSTEM: Final = "You are a helpful trip planner. Use tools for facts; answer in one paragraph."
_QUESTION: Final = "Is tomorrow better for a long walk in Paris or in Lisbon?"


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


# ------------------------------------------------------------------------- daemon


def _accepts(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def find_flightlogd() -> str | None:
    """The ``flightlogd`` program next to this Python (a virtualenv) or on ``$PATH``."""
    beside = os.path.join(os.path.dirname(sys.executable), "flightlogd")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return shutil.which("flightlogd")


def start_daemon(socket_path: str, root: str) -> int:
    """Start ``flightlogd`` detached on ``socket_path`` and ``root``; returns its pid.

    Waits until the socket accepts connections.  Raises :class:`CommandError` when
    ``flightlogd`` is not installed, exits early or does not listen in time.
    """
    program = find_flightlogd()
    if program is None:
        raise CommandError(
            f"no daemon listens on {socket_path}, and {_INSTALL_HINT}", EXIT_NO_DAEMON
        )
    os.makedirs(root, mode=0o700, exist_ok=True)
    log_path = os.path.join(root, "flightlogd.log")
    command = [program, "--socket", socket_path, "--root", root, "--log-format", "json"]
    with open(log_path, "ab") as log:
        # Its own session: the daemon outlives this command and ignores its Ctrl-C.
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + _START_TIMEOUT
    while not _accepts(socket_path):
        if proc.poll() is not None:
            raise CommandError(
                f"flightlogd exited with status {proc.returncode} at start; "
                f"its log: {log_path}\n{_last_lines(log_path)}",
                EXIT_NO_DAEMON,
            )
        if time.monotonic() > deadline:
            raise CommandError(
                f"flightlogd (pid {proc.pid}) did not listen on {socket_path} within "
                f"{_START_TIMEOUT:.0f}s; its log: {log_path}",
                EXIT_NO_DAEMON,
            )
        time.sleep(0.02)
    # Detached on purpose: it keeps running for later commands and agents.
    proc.returncode = 0
    return proc.pid


def _last_lines(path: str, count: int = 10) -> str:
    try:
        with open(path, "rb") as log:
            lines = log.read()[-8192:].decode(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-count:])


# ---------------------------------------------------------------------- the agent


class _Pace:
    """Pauses between steps, so that ``tail -f`` shows the session as it happens."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, seconds: float) -> None:
        if self.factor > 0:
            time.sleep(seconds * self.factor)


def _text(text: str) -> list[Any]:
    return [TextPart(text=text)]


def _tool_call(
    run: Run,
    pause: Callable[[float], None],
    execution: Execution,
    call: ToolCallPart,
    *,
    outcome: str,
    is_error: bool = False,
    seconds: float,
    queued: bool = True,
) -> None:
    """One attempt of a tool call: queued, exec, invoke, result."""
    name, arguments = call.name, call.arguments
    if queued:
        run.record(
            ToolQueued(execution=execution, tool_call_id=call.id, name=name, arguments=arguments)
        )
    run.record(
        ToolExecStart(execution=execution, tool_call_id=call.id, name=name, arguments=arguments)
    )
    run.record(
        ToolInvokeStart(execution=execution, tool_call_id=call.id, name=name, arguments=arguments)
    )
    pause(seconds)
    run.record(
        ToolInvokeEnd(
            execution=execution,
            tool_call_id=call.id,
            name=name,
            content=_text(outcome),
            is_error=is_error,
        )
    )
    run.record(
        ToolExecEnd(
            execution=execution,
            tool_call_id=call.id,
            name=name,
            content=_text(outcome),
            is_error=is_error,
            disposition="ran",
        )
    )


def _model_call(
    run: Run,
    pause: Callable[[float], None],
    execution: Execution,
    messages: list[Any],
    *,
    seconds: float,
    reply: AssistantMessage | None,
    usage: Usage | None,
    error: str | None = None,
) -> None:
    config = CallConfig(
        model=_MODEL,
        provider=_PROVIDER,
        temperature=0.2,
        max_tokens=1024,
        # Credentials never reach the file: the codec removes this key.
        extra={"api_key": "sk-demo-never-written", "timeout": 30},
    )
    run.record(
        ModelRequest(
            execution=execution,
            messages=list(messages),
            tools=_TOOLS,
            config=config,
            system=_SYSTEM,
        )
    )
    run.record(ModelExecStart(execution=execution, model=_MODEL, provider=_PROVIDER))
    pause(seconds)
    run.record(
        ModelExecEnd(
            execution=execution,
            message=reply,
            error=error,
            usage=usage,
            provider_state={"response_id": f"resp_{execution.id}_{execution.attempt}"}
            if error is None
            else {},
        )
    )
    if reply is not None and error is None:
        run.record(MessageEnd(message=reply, execution=execution))


def _retry(
    run: Run, pause: Callable[[float], None], execution: Execution, error: str, delay: float
) -> Execution:
    run.record(Retry(execution=execution, error=error, delay_seconds=delay))
    run.record(RetryWaitStart(execution=execution, delay_seconds=delay))
    pause(delay)
    run.record(RetryWaitEnd(execution=execution))
    return execution.next_attempt()


def record_demo_run(run: Run, pace: float) -> None:
    """Record one simulated agent loop into ``run``; ``pace`` scales the pauses (0: none)."""
    pause = _Pace(pace)
    question = UserMessage(content=_QUESTION)
    messages: list[Any] = [question]
    run.record(AgentStart(agent="trip-planner", messages=[question]))

    # Turn 0: the model asks for the weather in both cities.
    run.record(TurnStart(turn_index=0))
    run.record(ContextPrepareStart(turn_index=0, message_count=1))
    run.record(ContextPrepareEnd(message_count=1, token_estimate=96))
    paris = ToolCallPart(id="call_paris", name="get_weather", arguments={"city": "Paris"})
    lisbon = ToolCallPart(id="call_lisbon", name="get_weather", arguments={"city": "Lisbon"})
    usage0 = Usage(input_tokens=412, output_tokens=61, cache_read_tokens=0)
    reply0 = AssistantMessage(
        content=[TextPart(text="Let me check tomorrow's weather in both cities."), paris, lisbon],
        model=_MODEL,
        provider=_PROVIDER,
        stop_reason="tool_use",
        response_id="resp_m0",
    )
    model0 = Execution(id="m0", kind="model", turn_index=0)
    _model_call(run, pause, model0, messages, seconds=1.2, reply=reply0, usage=usage0)
    messages.append(reply0)

    tool_paris = Execution(id=paris.id, kind="tool", parent_id="m0", turn_index=0)
    paris_weather = "Paris tomorrow: 14°C, rain from 11:00, wind 30 km/h"
    _tool_call(run, pause, tool_paris, paris, outcome=paris_weather, seconds=0.3)
    result = ToolResultMessage(tool_call_id=paris.id, name=paris.name, content=_text(paris_weather))
    run.record(MessageEnd(message=result, execution=tool_paris))
    messages.append(result)

    # The weather service times out for Lisbon; the loop retries the call.
    tool_lisbon = Execution(id=lisbon.id, kind="tool", parent_id="m0", turn_index=0)
    timeout = "weather service timed out after 0.5s"
    _tool_call(run, pause, tool_lisbon, lisbon, outcome=timeout, is_error=True, seconds=0.5)
    tool_lisbon = _retry(run, pause, tool_lisbon, timeout, delay=0.5)
    lisbon_weather = "Lisbon tomorrow: 22°C, sunny, light breeze"
    _tool_call(run, pause, tool_lisbon, lisbon, outcome=lisbon_weather, seconds=0.2, queued=False)
    result = ToolResultMessage(
        tool_call_id=lisbon.id, name=lisbon.name, content=_text(lisbon_weather)
    )
    run.record(MessageEnd(message=result, execution=tool_lisbon))
    messages.append(result)
    run.record(
        TurnEnd(
            turn_index=0,
            stop_reason="tool_use",
            message_count=len(messages),
            tool_call_count=2,
            usage=usage0,
        )
    )

    # Turn 1: the first attempt is rate limited; the second answers.
    run.record(TurnStart(turn_index=1))
    run.record(ContextPrepareStart(turn_index=1, message_count=len(messages)))
    run.record(ContextPrepareEnd(message_count=len(messages), token_estimate=530))
    model1 = Execution(id="m1", kind="model", turn_index=1)
    limited = "429 Too Many Requests: rate limited, retry after 1s"
    _model_call(run, pause, model1, messages, seconds=0.3, reply=None, usage=None, error=limited)
    model1 = _retry(run, pause, model1, limited, delay=1.0)
    usage1 = Usage(input_tokens=688, output_tokens=74, cache_read_tokens=412)
    answer = (
        "Lisbon. Tomorrow Paris has rain from 11:00 and a 30 km/h wind, while Lisbon is "
        "sunny at 22°C with a light breeze: ideal for a long walk along the river."
    )
    reply1 = AssistantMessage(
        content=_text(answer),
        model=_MODEL,
        provider=_PROVIDER,
        stop_reason="end_turn",
        response_id="resp_m1",
    )
    _model_call(run, pause, model1, messages, seconds=1.4, reply=reply1, usage=usage1)
    messages.append(reply1)
    run.record(
        TurnEnd(turn_index=1, stop_reason="end_turn", message_count=len(messages), usage=usage1)
    )

    # What a resumed agent would need: the conversation so far.
    run.save_checkpoint({"messages": messages, "turns": 2, "answer": answer})
    total = Usage(
        input_tokens=usage0.input_tokens + usage1.input_tokens,
        output_tokens=usage0.output_tokens + usage1.output_tokens,
        cache_read_tokens=usage1.cache_read_tokens,
    )
    run.record(AgentEnd(ok=True, reason="completed", turns=2, usage=total))


# ---------------------------------------------------------------------- the command


def cmd_demo(args: argparse.Namespace, style: Style) -> int:
    """``flightlog demo``: make sure a daemon runs, record one run, show it."""
    socket_path = args.socket or default_socket_path(os.environ, os.getuid())
    if not _accepts(socket_path):
        if args.no_start:
            raise DaemonNotRunning(socket_path)
        root = default_root(os.environ, os.path.expanduser("~"))
        pid = start_daemon(socket_path, root)
        _err(style.dim(f"started flightlogd (pid {pid}) on {socket_path}, data root {root}"))
    with connect(socket_path, client_name="flightlog-demo") as client:
        try:
            session = client.create(
                args.path, meta={"app": "flightlog-demo", "agent": "trip-planner"}
            )
        except DaemonError as exc:
            if exc.code != ErrorCode.SESSION_EXISTS:
                raise
            session = client.open(args.path)
        _err(
            style.dim(f"recording into {session.path}; follow it live with: ")
            + f"flightlog tail -f {args.path}"
        )
        with session.begin_run() as run:
            record_demo_run(run, pace=0.0 if args.fast else 1.0)
        run_id = run.run_id
        session.close()
    _err("")
    shown = argparse.Namespace(**{**vars(args), "path": session.path, "run": run_id, "call": None})
    status = cmd_show(shown, style)
    _err("")
    _err(
        style.dim("next: ")
        + f"flightlog inspect {args.path} · flightlog show {args.path} --call call_lisbon · "
        f"flightlog tail {args.path} --type tool_exec_end"
    )
    return status
