"""``flightlog diff A B``: where two runs part ways, like ``git diff`` for agent runs.

Theory of operation
-------------------
Each side is one run (``PATH`` for its last run, ``PATH@RUN`` for a run id or a prefix of
one, ``PATH@N`` for the N-th run, ``PATH@-N`` counting from the last), summarised by
:class:`~._inspect.SessionSummary`: its calls, each attempt of a model, tool or compaction
call, in the order they started.

A call's *step* is what two runs can share: its kind and name (the tool, or the model)
to align on, and what it was given and gave back to compare (:class:`Step`): a model
call's new input messages and its response, a tool call's arguments and result, the
error and status of either.  Ids are left out (a provider's tool-call ids, response ids
and execution ids differ between any two runs), and so are times and tokens, which are
shown, not compared.

The two lists of steps are aligned on kind and name (:class:`difflib.SequenceMatcher`,
the algorithm of ``diff``), and walked in order: the *first divergence* is the first
aligned pair whose content differs, or the first call one run made and the other did
not.  Everything after it is *what followed*: both runs' remaining calls, side by side in
the alignment, with their tokens and durations.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from ._commands import EXIT_DIFFERENT, EXIT_OK, EXIT_USAGE, CommandError, open_source
from ._inspect import CallSummary, RunSummary, SessionSummary
from ._render import (
    Style,
    duration,
    format_args,
    format_duration,
    format_tokens,
    one_line,
    record_data,
    short,
)

__all__ = ["Comparison", "Step", "add_diff_arguments", "cmd_diff", "compare", "diff_epilog"]

#: Members whose values differ between any two runs of the same conversation.
_IDS: Final = frozenset({"id", "tool_call_id", "response_id", "signature"})


def diff_epilog(exit_help: str) -> str:
    return f"""\
examples:
  flightlog diff chat.jsonl@1 chat.jsonl@2          the first two runs of a session
  flightlog diff before.jsonl after.jsonl           the last run of each
  flightlog diff chat.jsonl@3f2a9c1e chat.jsonl@-1  a run by id, against the last one
  flightlog diff a.jsonl b.jsonl --json | jq .divergence

Aligns the two runs' calls on kind and name and prints the calls both made alike, the
first place they differ (a model's input or response, a tool's arguments or result, an
error, a call one run made and the other did not), and what followed in each run, with
tokens and durations.  Ids, times and tokens are not compared.  Status 0 when the runs
made the same calls alike, 6 when they differ.

{exit_help}
"""


def add_diff_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", help="a run: PATH, PATH@RUN_ID, PATH@N or PATH@-N")
    parser.add_argument("b", metavar="B", help="the run to compare it with (same forms)")
    parser.add_argument("--json", action="store_true", help="the comparison as one JSON object")
    parser.add_argument(
        "-n",
        "--after",
        type=int,
        default=5,
        metavar="N",
        help="how many calls of what followed to show (default: %(default)s)",
    )


def _normal(value: Any) -> Any:
    """``value`` without the members that differ between any two runs: the ids of the
    protocol's typed objects (a ``$type`` member), never what a tool was given (a
    tool call's ``arguments``, which may well hold an ``id``)."""
    if isinstance(value, Mapping):
        typed = "$type" in value
        return {
            k: v if k == "arguments" else _normal(v)
            for k, v in value.items()
            if not (typed and k in _IDS)
        }
    if isinstance(value, list):
        return [_normal(item) for item in value]
    return value


@dataclass
class Step:
    """One call of a run, as two runs can be compared on it."""

    kind: str
    name: str
    input: Any
    output: Any  # what it gave back, as a person reads it (tool calls in short)
    error: str | None
    status: str
    call: CallSummary
    #: What it gave back, whole (ids left out): a model's response, a tool's content.
    returned: Any = None

    @property
    def key(self) -> tuple[str, str]:
        return self.kind, self.name

    def same(self, other: Step) -> bool:
        return (self.input, self.returned, self.output, self.error, self.status) == (
            other.input,
            other.returned,
            other.output,
            other.error,
            other.status,
        )

    def tokens(self) -> int | None:
        usage = self.call.usage
        if not isinstance(usage, Mapping):
            return None
        counts = (usage.get("input_tokens"), usage.get("output_tokens"))
        # Counted as sessions counts them: a value that is not a number is left out.
        return sum(n for n in counts if isinstance(n, int) and not isinstance(n, bool))

    def seconds(self) -> float | None:
        return duration(self.call.start_time or self.call.first_time, self.call.end_time)

    def headline(self) -> str:
        if self.kind == "tool":
            return one_line(f"tool {self.name}({format_args(self.call.arguments, 50)})")
        return one_line(f"{self.kind} {self.name}")

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "execution_id": self.call.id,
            "attempt": self.call.attempt,
            "status": self.status,
            "error": self.error,
            "input": self.input,
            "output": self.output,
            "returned": self.returned,
            "tokens": self.tokens(),
            "seconds": self.seconds(),
        }


@dataclass
class Side:
    """One run to compare: where it is, and its steps."""

    label: str
    run: RunSummary
    steps: list[Step]

    def totals(self) -> dict[str, Any]:
        tokens = [t for step in self.steps if (t := step.tokens()) is not None]
        return {
            "path": self.label,
            "run_id": self.run.run_id,
            "calls": len(self.steps),
            "tokens": sum(tokens) if tokens else None,
            "seconds": duration(self.run.start_time, self.run.last_time),
            "status": self.run.status,
        }


class _Inputs:
    """The new input messages of each model call (``model_request``), and what each
    call gave back whole (a model's message, a tool's content), by its key."""

    def __init__(self) -> None:
        self.messages: dict[tuple[str, str, int], Any] = {}
        self.returned: dict[tuple[str, str, int], Any] = {}

    def add(self, type: str, data: Mapping[str, Any]) -> None:
        execution = data.get("execution")
        attempt = execution.get("attempt") if isinstance(execution, Mapping) else None
        if isinstance(execution, Mapping) and isinstance(attempt, int):
            key = (str(execution.get("kind")), str(execution.get("id")), attempt)
            if type == "model_request":
                system = data.get("system")
                self.messages[key] = _normal({"system": system, "messages": data.get("messages")})
            elif type == "model_exec_end":
                self.returned[key] = _normal(data.get("message"))
            else:
                self.returned[key] = _normal(data.get("content"))


def _run_spec(spec: str) -> tuple[str, str | None]:
    path, at, run = spec.rpartition("@")
    if not at or not path or "/" in run:
        return spec, None
    return path, run


def _pick(summary: SessionSummary, wanted: str | None, spec: str) -> RunSummary:
    runs = [run for run in summary.run_list() if run.run_id is not None]
    if not runs:
        raise CommandError(f"{spec}: the session has no run", EXIT_USAGE)
    if wanted is None:
        return runs[-1]
    try:
        index = int(wanted)
    except ValueError:
        matches = [run for run in runs if run.run_id and run.run_id.startswith(wanted)]
        if len(matches) != 1:
            known = ", ".join((run.run_id or "")[:8] for run in runs)
            raise CommandError(
                f"{spec}: {'no' if not matches else 'more than one'} run {wanted!r} "
                f"(runs: {known})",
                EXIT_USAGE,
            ) from None
        return matches[0]
    position = index - 1 if index > 0 else index
    if index == 0 or not -len(runs) <= position < len(runs):
        raise CommandError(f"{spec}: no run {index}; the session has {len(runs)}", EXIT_USAGE)
    return runs[position]


def _side(spec: str, args: argparse.Namespace) -> Side:
    path, wanted = _run_spec(spec)
    summary = SessionSummary()
    inputs = _Inputs()
    with open_source(path, args) as source:
        for record in source.records:
            summary.add(record)
            if record.type in ("model_request", "model_exec_end", "tool_exec_end"):
                inputs.add(record.type, record_data(record))
        label = source.label
    run = _pick(summary, wanted, spec)
    steps = []
    for call in sorted(run.calls.values(), key=lambda c: c.first_seq):
        if call.kind == "model":
            name = call.model or "?"
            given = inputs.messages.get((call.kind, call.id, call.attempt))
        else:
            name = call.name or call.kind
            given = call.arguments
        returned = inputs.returned.get((call.kind, call.id, call.attempt))
        steps.append(
            Step(call.kind, name, given, call.result, call.error, call.status, call, returned)
        )
    return Side(label, run, steps)


@dataclass
class Comparison:
    """Two runs aligned: the pairs both made alike, then the first divergence."""

    a: Side
    b: Side
    alike: list[tuple[Step, Step]]
    first: tuple[Step | None, Step | None] | None
    followed: list[tuple[Step | None, Step | None]]


def compare(a: Side, b: Side) -> Comparison:
    """Align ``a`` and ``b`` and find where they part (the theory of operation)."""
    pairs: list[tuple[Step | None, Step | None]] = []
    matcher = difflib.SequenceMatcher(
        None, [step.key for step in a.steps], [step.key for step in b.steps], autojunk=False
    )
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            pairs += zip(a.steps[i1:i2], b.steps[j1:j2], strict=True)
            continue
        left, right = a.steps[i1:i2], b.steps[j1:j2]
        for index in range(max(len(left), len(right))):
            pairs.append(
                (
                    left[index] if index < len(left) else None,
                    right[index] if index < len(right) else None,
                )
            )
    alike: list[tuple[Step, Step]] = []
    for position, (x, y) in enumerate(pairs):
        if x is not None and y is not None and x.key == y.key and x.same(y):
            alike.append((x, y))
            continue
        return Comparison(a, b, alike, (x, y), pairs[position + 1 :])
    return Comparison(a, b, alike, None, [])


# ------------------------------------------------------------------------ printing


def _lines(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [one_line(line) for line in value.split("\n")]
    text = msgspec.json.format(msgspec.json.encode(value), indent=2).decode()
    return [one_line(line) for line in text.split("\n")]


def _delta(name: str, x: Any, y: Any, style: Style) -> Iterator[str]:
    if x == y:
        yield f"    {name}: the same"
        return
    yield f"    {name}:"
    for line in difflib.unified_diff(_lines(x), _lines(y), lineterm="", n=2):
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("-"):
            yield "      " + style.red(line)
        elif line.startswith("+"):
            yield "      " + style.green(line)
        else:
            yield "      " + style.dim(line)


def _cell(step: Step | None, width: int = 44) -> str:
    if step is None:
        return "-".ljust(width)
    figures = [
        format_tokens(t) + " tok" if (t := step.tokens()) is not None else "",
        format_duration(s) if (s := step.seconds()) is not None else "",
    ]
    text = f"{step.headline()} {step.status} {' '.join(f for f in figures if f)}"
    return short(text, width).ljust(width)


def _print(comparison: Comparison, after: int, style: Style) -> None:
    out = sys.stdout
    for sign, side in (("---", comparison.a), ("+++", comparison.b)):
        totals = side.totals()
        figures = [f"{totals['calls']} calls"]
        if totals["tokens"] is not None:
            figures.append(f"{format_tokens(totals['tokens'])} tokens")
        figures.append(format_duration(totals["seconds"]))
        out.write(
            style.bold(one_line(f"{sign} {side.label}@{(side.run.run_id or '')[:8]}"))
            + one_line(f" ({side.run.status}, {', '.join(figures)})")
            + "\n"
        )
    for step, _ in comparison.alike:
        out.write(style.dim(f"  = {step.headline()} {step.status}") + "\n")
    if comparison.first is None:
        out.write(style.green("the runs made the same calls alike") + "\n")
        return
    x, y = comparison.first
    where = len(comparison.alike) + 1
    if x is None or y is None:
        made, only = ("b", y) if x is None else ("a", x)
        assert only is not None
        out.write(style.red(f"! first divergence at call {where}: only {made} made ") + "")
        out.write(style.red(only.headline()) + "\n")
        # What it was given and gave back, as lines only one side has (- a, + b).
        for name, value in (("input", only.input), ("output", only.returned or only.output)):
            a_side, b_side = (None, value) if x is None else (value, None)
            for line in _delta(name, a_side, b_side, style):
                out.write(line + "\n")
    else:
        title = x.headline() if x.key == y.key else f"{x.headline()} | {y.headline()}"
        out.write(style.red(f"! first divergence at call {where}: {title}") + "\n")
        for line in _delta("input", x.input, y.input, style):
            out.write(line + "\n")
        if x.output != y.output or x.returned == y.returned:
            for line in _delta("output", x.output, y.output, style):
                out.write(line + "\n")
        else:  # alike in short (a long argument, a thinking part): shown whole
            for line in _delta("output", x.returned, y.returned, style):
                out.write(line + "\n")
        if (x.error, x.status) != (y.error, y.status):
            for line in _delta("error", x.error or x.status, y.error or y.status, style):
                out.write(line + "\n")
    if comparison.followed:
        out.write(style.bold("what followed (a | b):") + "\n")
        for left, right in comparison.followed[:after]:
            out.write(f"  {_cell(left)} | {_cell(right).rstrip()}\n")
        rest = len(comparison.followed) - after
        if rest > 0:
            out.write(style.dim(f"  … {rest} more") + "\n")


def _as_json(comparison: Comparison) -> dict[str, Any]:
    def step(value: Step | None) -> dict[str, Any] | None:
        return None if value is None else value.as_json()

    first = comparison.first
    return {
        "a": comparison.a.totals(),
        "b": comparison.b.totals(),
        "alike": len(comparison.alike),
        "divergence": None
        if first is None
        else {"call": len(comparison.alike) + 1, "a": step(first[0]), "b": step(first[1])},
        "followed": [{"a": step(x), "b": step(y)} for x, y in comparison.followed],
    }


def cmd_diff(args: argparse.Namespace, style: Style) -> int:
    if args.after < 0:
        raise CommandError("--after takes a number of calls, 0 or more", EXIT_USAGE)
    comparison = compare(_side(args.a, args), _side(args.b, args))
    if args.json:
        sys.stdout.write(msgspec.json.encode(_as_json(comparison)).decode() + "\n")
    else:
        _print(comparison, args.after, style)
    return EXIT_OK if comparison.first is None else EXIT_DIFFERENT
