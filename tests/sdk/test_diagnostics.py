"""The account of a run's marked events that its run_close carries, and its bounds."""

from __future__ import annotations

from flightlog.protocol._diagnostics import MAX_EVENTS, RunDiagnostics, joined


def test_the_account_names_the_first_events_then_how_many_more() -> None:
    notes = RunDiagnostics()
    for n in range(MAX_EVENTS + 3):
        notes.add("tool_exec_end", f"t{n}", (f"details: builtins.object (reason {n})",))
    text = notes.text()
    assert text.startswith(
        "codec_error: 11 events written with $flightlog markers: "
        "tool_exec_end t0: details: builtins.object (reason 0); tool_exec_end t1: "
    )
    assert "t7: details" in text and "t8:" not in text
    assert text.endswith("; and 3 more")


def test_one_event_and_one_without_execution() -> None:
    notes = RunDiagnostics()
    notes.add("agent_end", None, ("output: socket.socket (TypeError: no)", "and 9 more"))
    assert notes.text() == (
        "codec_error: 1 event written with $flightlog markers: "
        "agent_end: output: socket.socket (TypeError: no), and 9 more"
    )


def test_a_long_account_of_one_event_is_cut() -> None:
    notes = RunDiagnostics()
    notes.add("message_end", "m1", tuple("x" * 200 for _ in range(9)))
    line = notes.text().split("markers: ", 1)[1]
    assert len(line) == 600 and line.endswith("...")


def test_joined_after_the_runs_own_error() -> None:
    assert joined(None, None) is None
    assert joined("boom", None) == "boom"
    assert joined(None, "codec_error: x") == "codec_error: x"
    assert joined("boom", "codec_error: x") == "boom; codec_error: x"
