"""``find`` by agent, by call tree, by session tree and by meta and data members, in the
CLI and the SDK: sessions recorded by a real daemon (a planner that hands a task to a
sub-agent, a sub-agent's own session, a fork and the fork's fork), every answer checked
against what the records say, and ``flightlog find --json`` against ``flightlog.sdk.find``
on the same files, also on the benchmark's corpus."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench._find import write_corpus
from flightlog.cli import run as cli_run
from flightlog.protocol import Origin, events
from flightlog.sdk import Found, connect, find, read
from support import DaemonProcess

Ex = events.Execution


def _plan(run: Any, *, question: str) -> None:
    """A planner's run: a model call, then a tool call ``t1`` that runs the sub-agent
    ``researcher`` (two model calls, one nested tool call ``r_t1``), then a last call."""
    run.record(events.AgentStart(agent="planner", messages=[events.UserMessage(content=question)]))
    m1 = Ex(id="m1", kind="model", turn_index=0)
    run.record(events.ModelExecStart(execution=m1, model="big"))
    run.record(events.ModelExecEnd(execution=m1, usage=events.Usage(input_tokens=10)))
    t1 = Ex(id="t1", kind="tool", parent_id="m1", turn_index=0)
    run.record(
        events.ToolExecStart(
            execution=t1, tool_call_id="c1", name="research", arguments={"topic": {"id": 7}}
        )
    )
    run.record(events.AgentStart(agent="researcher", parent_id="t1"))
    r1 = Ex(id="r_m1", kind="model", agent="researcher", turn_index=0)
    run.record(events.ModelExecStart(execution=r1, model="small"))
    run.record(events.ModelExecEnd(execution=r1))
    rt = Ex(id="r_t1", kind="tool", parent_id="r_m1", agent="researcher", turn_index=0)
    run.record(events.ToolExecStart(execution=rt, tool_call_id="c2", name="search"))
    run.record(events.ToolExecEnd(execution=rt, tool_call_id="c2", name="search"))
    run.record(events.TurnStart(turn_index=1))  # names no agent: the researcher's
    r2 = Ex(id="r_m2", kind="model", agent="researcher", turn_index=1)
    run.record(events.ModelExecStart(execution=r2, model="small"))
    run.record(events.ModelExecEnd(execution=r2))
    run.record(events.AgentEnd(agent="researcher", parent_id="t1"))
    run.record(
        events.ToolExecEnd(
            execution=t1, tool_call_id="c1", name="research", is_error=True, disposition="ran"
        )
    )
    m2 = Ex(id="m2", kind="model", turn_index=1)
    run.record(events.ModelExecStart(execution=m2, model="big"))
    run.record(events.ModelExecEnd(execution=m2))
    run.record(events.AgentEnd(agent="planner", ok=True))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("tree")
    daemon = DaemonProcess(base).start()
    ids: dict[str, str] = {}
    paths: dict[str, str] = {}
    try:
        with connect(daemon.socket) as client:

            def session(name: str, meta: dict[str, Any], origin: Origin | None = None) -> None:
                created = client.create(f"tree/{name}.jsonl", meta=meta, origin=origin)
                ids[name] = created.session_id
                paths[name] = created.path
                with created.begin_run() as run:
                    _plan(run, question=name)
                created.close()

            session("root", {"app": "tree", "owner": {"team": "red", "level": 2}})
            session("child", {"app": "tree", "parent_session": ids["root"]})
            session("fork", {"app": "tree", "forked_from": ids["root"]})
            # A fork as flightlog resume --fork makes it: the format's origin.
            origin = Origin(session_id=ids["fork"], path=paths["fork"], seq=1)
            session("forkfork", {"app": "tree"}, origin)
            session("grandchild", {"app": "tree", "parent_session": ids["child"]})
            session("other", {"app": "other", "owner": {"team": "blue", "level": 2}})
    finally:
        daemon.stop()
    yield {"dir": daemon.root / "tree", "ids": ids}


def keys(found: Iterator[Found]) -> list[tuple[str, int]]:
    return [(Path(item.path).stem, item.record.seq) for item in found]


def paths(found: Iterator[Found]) -> list[tuple[str, int]]:
    return [(item.path, item.record.seq) for item in found]


def cli_paths(capsys: pytest.CaptureFixture[str], *args: str) -> list[tuple[str, int]]:
    assert cli_run(["find", "--json", *args]) == 0
    return [
        (line["path"], line["seq"])
        for line in map(json.loads, capsys.readouterr().out.splitlines())
    ]


def oracle(directory: Path, keep: Any) -> list[tuple[str, int]]:
    """Every record of ``directory``'s files, by a plain reading, that ``keep`` accepts
    (given the record and the file's session ids)."""
    found = []
    for path in sorted(directory.glob("*.jsonl")):
        for record in read(path):
            if keep(record.to_builtins(), path.stem):
                found.append((path.stem, record.seq))
    return found


def by_type(directory: Path, stem: str, seqs_of: Any) -> list[tuple[str, int]]:
    return oracle(directory, lambda record, name: name == stem and seqs_of(record))


def test_agent_is_the_author(recorded: dict[str, Any]) -> None:
    directory = recorded["dir"]
    researcher = keys(find(directory, agent="researcher"))

    def written_by_researcher(record: dict[str, Any]) -> bool:
        data = record["data"]
        if record["type"] in ("agent_start", "agent_end"):
            return bool(data["agent"] == "researcher")
        execution = data.get("execution")
        if execution is not None:
            return bool(execution["agent"] == "researcher")
        return record["type"] == "turn_start" and data["turn_index"] == 1

    assert researcher == oracle(directory, lambda record, name: written_by_researcher(record))
    assert len(researcher) == 6 * 9  # in each of the six sessions
    planner = keys(find(directory, agent="planner", type="model_exec_start"))
    # The planner's own calls name no agent: it is the innermost agent around them.
    assert [seq for name, seq in planner if name == "root"] == [4, 17]
    assert keys(find(directory, agent="nobody")) == []


def test_agent_with_a_byte_test_still_follows_the_agents(recorded: dict[str, Any]) -> None:
    """--type drives the byte scan: the agent_start and agent_end lines it skips must
    still be read, or the planner's calls would be nobody's."""
    directory = recorded["dir"]
    assert keys(find(directory / "root.jsonl", agent="planner", type="model_exec_end")) == [
        ("root", 5),
        ("root", 18),
    ]


def test_under_a_call(recorded: dict[str, Any]) -> None:
    directory = recorded["dir"] / "root.jsonl"
    under = [seq for _, seq in keys(find(directory, under="t1"))]
    # t1's start, the sub-agent's whole span (its calls, its turn, its end), t1's end.
    assert under == list(range(6, 17))
    assert [seq for _, seq in keys(find(directory, under="r_m1"))] == [8, 9, 10, 11]
    assert [seq for _, seq in keys(find(directory, under="m1"))] == list(range(4, 17))
    assert keys(find(directory, under="t1", type="model_exec_end")) == [
        ("root", 9),
        ("root", 14),
    ]


def test_session_tree_and_forks(recorded: dict[str, Any]) -> None:
    directory, ids = recorded["dir"], recorded["ids"]

    def sessions(found: Iterator[Found]) -> set[str]:
        return {name for name, _ in keys(found)}

    assert sessions(find(directory, tree=ids["root"])) == {
        "root",
        "child",
        "grandchild",
        "fork",
        "forkfork",
    }
    assert sessions(find(directory, tree=ids["child"])) == {"child", "grandchild"}
    assert sessions(find(directory, fork_of=ids["root"])) == {"fork", "forkfork"}
    assert sessions(find(directory, fork_of=ids["fork"])) == {"forkfork"}
    assert sessions(find(directory, tree=ids["fork"], fork_of=ids["root"])) == {
        "fork",
        "forkfork",
    }
    assert sessions(find(directory, tree="0" * 32)) == set()


def test_meta_and_data_members(recorded: dict[str, Any]) -> None:
    directory = recorded["dir"]
    assert {name for name, _ in keys(find(directory, meta={"owner.team": "blue"}))} == {"other"}
    assert {name for name, _ in keys(find(directory, meta={"owner.level": 2}))} == {
        "root",
        "other",
    }
    topic = keys(find(directory, data={"arguments.topic.id": 7}))
    assert topic == oracle(
        directory,
        lambda record, name: (
            record["type"] == "tool_exec_start" and record["data"]["name"] == "research"
        ),
    )
    assert keys(find(directory / "root.jsonl", data={"execution.agent": "researcher"})) == [
        ("root", seq) for seq in (8, 9, 10, 11, 13, 14)
    ]
    # None: the member is missing or null.
    closes = keys(find(directory / "root.jsonl", type="run_close", data={"error": None}))
    assert closes == [("root", 20)]


@pytest.mark.parametrize(
    ("cli", "sdk"),
    [
        (["--agent", "researcher"], {"agent": "researcher"}),
        (["--agent", "planner", "--error"], {"agent": "planner", "error": True}),
        (["--under", "t1", "--type", "tool_exec_end"], {"under": "t1", "type": "tool_exec_end"}),
        (["--tree", "ROOT"], {"tree": "ROOT"}),
        (["--fork-of", "ROOT", "--model", "small"], {"fork_of": "ROOT", "model": "small"}),
        (
            ["--meta", "owner.team=red", "--data", "name=search"],
            {"meta": {"owner.team": "red"}, "data": {"name": "search"}},
        ),
        (["--data", "arguments.topic.id=7"], {"data": {"arguments.topic.id": 7}}),
        (
            ["--data", "execution.turn_index=1", "-n", "5"],
            {"data": {"execution.turn_index": 1}, "limit": 5},
        ),
    ],
)
def test_cli_and_sdk_find_the_same_records(
    recorded: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    cli: list[str],
    sdk: dict[str, Any],
) -> None:
    root = recorded["ids"]["root"]
    cli = [root if arg == "ROOT" else arg for arg in cli]
    sdk = {key: root if value == "ROOT" else value for key, value in sdk.items()}
    directory = str(recorded["dir"])
    found = paths(find(directory, **sdk))
    assert found  # each question has an answer here
    assert cli_paths(capsys, *cli, directory) == found


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("corpus")
    write_corpus(directory, 1_000_000)
    return directory


@pytest.mark.parametrize(
    ("cli", "sdk"),
    [
        (
            ["--agent", "bench-agent", "--type", "tool_exec_end", "--error"],
            {"agent": "bench-agent", "type": "tool_exec_end", "error": True},
        ),
        (
            ["--under", "m2", "--since", "2000-01-01T00:00:00Z"],
            {"under": "m2", "since": "2000-01-01T00:00:00Z"},
        ),
        (
            ["--meta", "team=team-3", "--data", "execution.kind=tool"],
            {"meta": {"team": "team-3"}, "data": {"execution.kind": "tool"}},
        ),
    ],
)
def test_cli_and_sdk_on_the_benchmark_corpus(
    corpus: Path, capsys: pytest.CaptureFixture[str], cli: list[str], sdk: dict[str, Any]
) -> None:
    found = paths(find(corpus, **sdk))
    assert found
    assert cli_paths(capsys, *cli, str(corpus)) == found


def test_sdk_find_refuses_what_the_cli_refuses(recorded: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="since takes an RFC 3339 UTC time"):
        list(find(recorded["dir"], since="yesterday"))
    with pytest.raises(ValueError, match="limit"):
        list(find(recorded["dir"], limit=0))
