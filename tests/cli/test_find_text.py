"""``flightlog find --text``: never a missed match, whatever the spelling of the line.

Each question is answered twice: by ``search`` (the byte prefilter, then the exact test)
and by reading every record with ``flightlog.sdk.read`` and matching the pattern in its
texts; the two must name the same records.
"""

from __future__ import annotations

import io
import json
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from bench._find import write_corpus
from flightlog.cli import run as cli_run
from flightlog.sdk import read
from flightlog.sdk._find import search
from flightlog.sdk._query import Query
from flightlog.sdk._text import byte_test, snippet, texts

REPO = Path(__file__).resolve().parents[2]

SESSION = uuid.UUID(int=1).hex


def write_session(path: Path, datas: list[tuple[str, dict[str, Any]]], **dumps: Any) -> None:
    """A session file of ``datas`` (type, data), each line spelled by ``json.dumps``."""
    lines = [
        {
            "session_id": SESSION,
            "seq": 1,
            "type": "session_start",
            "time": "2026-11-29T20:00:00.000000Z",
            "run_id": None,
            "data": {"format_version": 1, "meta": {}},
        },
    ]
    for seq, (type, data) in enumerate(datas, 2):
        lines.append(
            {
                "session_id": SESSION,
                "seq": seq,
                "type": type,
                "time": "2026-11-29T20:00:01.000000Z",
                "run_id": "a" * 32,
                "data": data,
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line, **dumps) + "\n" for line in lines))


def oracle(paths: list[Path], pattern: re.Pattern[str]) -> list[tuple[str, int]]:
    found = []
    for path in sorted(paths):
        for record in read(path):
            if any(pattern.search(text) for text in texts(record.decode_data())):
                found.append((str(path), record.seq))
    return found


def searched(root: Path, pattern: re.Pattern[str]) -> list[tuple[str, int]]:
    return [(f.path, f.record.seq) for f in search(Query(text=pattern), [str(root)])]


def user(text: Any) -> dict[str, Any]:
    return {"messages": [{"$type": "user", "content": text}]}


def reply(*parts: str) -> dict[str, Any]:
    content = [{"$type": "text", "text": part} for part in parts]
    return {"message": {"$type": "assistant", "content": content}, "error": None}


# ---------------------------------------------------------------- what is searched


def test_texts_join_parts_and_skip_tags() -> None:
    data = {
        "execution": {"id": "m1", "kind": "model"},
        "message": {
            "$type": "assistant",
            "content": [
                {"$type": "thinking", "thinking": "I should ", "signature": "sig"},
                {"$type": "text", "text": "say hel"},
                {"$type": "tool_call", "id": "c1", "name": "t", "arguments": {"q": "x"}},
                {"$type": "text", "text": "lo"},
            ],
        },
    }
    found = list(texts(data))
    assert "I should say hello" in found
    assert "sig" in found and "q" not in found and "x" in found
    assert "assistant" not in found and "model" not in found and "m1" not in found


def test_the_literal_is_spelled_as_the_writer_spells_it() -> None:
    assert byte_test(re.compile(r'say "hi"\s+now')) == b'say \\"hi\\"'
    assert byte_test(re.compile("a\nb")) == b"a\\nb"
    assert byte_test(re.compile(r"\d+|x")) is None
    case = byte_test(re.compile("Hello", re.IGNORECASE))
    assert isinstance(case, re.Pattern) and case.search(b"HELLO")
    assert byte_test(re.compile("Été", re.IGNORECASE)) is None


def test_without_case_the_byte_test_lets_through_what_the_pattern_matches() -> None:
    """Only i, k and s of ASCII match other code points without case (U+0130,
    U+0131, U+212A, U+017F):
    the byte test lets each through, as the pattern itself does."""
    folding = {
        char: "".join(
            chr(c) for c in range(128, sys.maxunicode + 1) if re.fullmatch(char, chr(c), re.I)
        )
        for char in "abcdefghijklmnopqrstuvwxyz"
    }
    assert {char: more for char, more in folding.items() if more} == {
        "i": "\u0130\u0131",
        "k": "\u212a",
        "s": "\u017f",
    }
    case = byte_test(re.compile("Kiss", re.IGNORECASE))
    assert isinstance(case, re.Pattern)
    for text in ("kiss", "KISS", "\u212a\u0131\u017f\u017f", "k\u0130Ss"):
        assert case.search(text.encode()), text


def test_snippet_is_one_line() -> None:
    text = "x" * 100 + "the needle\nhere" + "y" * 100
    match = re.search("needle", text)
    assert match is not None
    assert snippet(text, match) == "…" + "x" * 36 + "the needle\\nhere" + "y" * 35 + "…"


# ---------------------------------------------------------------- never missed


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("text")
    write_corpus(base / "corpus", 400_000)
    datas = [
        ("agent_start", user("Where is the café? It's near the gare")),
        ("model_exec_end", reply("The answer is ", "forty", "-two.")),
        (
            "tool_exec_end",
            {
                "content": [{"$type": "text", "text": 'said "stop"\nthen left'}],
                "is_error": True,
                "name": "shell",
                "tool_call_id": "c",
            },
        ),
        ("model_request", {"system": "You are terse.", "messages": [], "tools": []}),
        ("tool_queued", {"arguments": {"path": "/etc/hosts"}, "name": "read_file"}),
        ("model_exec_end", {"message": None, "error": "429 Too Many Requests"}),
        # Without case, a Unicode pattern's i, k and s match these too.
        (
            "tool_exec_end",
            {"content": [{"$type": "text", "text": "\u212aelvin in \u0130stanbul, \u017funny"}]},
        ),
    ]
    # The writer's spelling; ASCII with \u escapes; escaped slashes; whitespace.
    write_session(base / "plain.jsonl", datas, ensure_ascii=False, separators=(",", ":"))
    write_session(base / "ascii.jsonl", datas, ensure_ascii=True)
    slashed = base / "slashed.jsonl"
    write_session(slashed, datas, ensure_ascii=False, separators=(",", ":"))
    slashed.write_text(slashed.read_text().replace("/", "\\/"))
    return base


PATTERNS = [
    "café",
    "forty-two",
    r"answer is forty",
    'said "stop"\nthen',
    r"stop.\s+then",
    "/etc/hosts",
    "terse",
    r"\d{3} Too Many",
    r"(?i)CAFÉ",
    r"(?i)THE GARE",
    r"(?i)kelvin in istanbul",
    r"(?i)Sunny",
    r"\d+|nothing",
    "look into it",
    r"result\s+result",
    "timed out",
]


@pytest.mark.parametrize("text", PATTERNS)
def test_search_finds_what_the_records_say(root: Path, text: str) -> None:
    pattern = re.compile(text)
    expected = oracle(sorted(root.rglob("*.jsonl")), pattern)
    assert sorted(searched(root, pattern)) == expected
    assert expected, "each pattern matches somewhere"


@settings(max_examples=60, deadline=None)
@given(
    words=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=6),
    cut=st.integers(min_value=0, max_value=100),
    ascii_only=st.booleans(),
)
def test_any_text_split_any_way_is_found(
    tmp_path_factory: pytest.TempPathFactory, words: list[str], cut: int, ascii_only: bool
) -> None:
    whole = " ".join(words)
    parts = [whole[: cut % (len(whole) + 1)], whole[cut % (len(whole) + 1) :]]
    base = tmp_path_factory.mktemp("split")
    write_session(base / "s.jsonl", [("model_exec_end", reply(*parts))], ensure_ascii=ascii_only)
    assert searched(base, re.compile(re.escape(whole))) == [(str(base / "s.jsonl"), 2)]


# ---------------------------------------------------------------- the command


def run_find(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    saved, sys.stdout = sys.stdout, out
    out.buffer = io.BytesIO()  # type: ignore[misc]
    try:
        status = cli_run(["find", *args])
    finally:
        sys.stdout = saved
    return status, out.getvalue() + out.buffer.getvalue().decode()  # type: ignore[attr-defined]


def test_command_shows_each_match_in_context(root: Path) -> None:
    status, output = run_find("--text", "forty-?two", str(root / "plain.jsonl"))
    assert status == 0
    lines = output.splitlines()
    assert len(lines) == 2 and "model_exec_end" in lines[0]
    assert lines[1].strip() == "The answer is forty-two."


def test_command_json_has_the_match(root: Path) -> None:
    status, output = run_find(
        "--json", "-i", "--text", "CAFÉ", "--type", "agent_start", str(root / "ascii.jsonl")
    )
    assert status == 0
    [line] = output.splitlines()
    record = json.loads(line)
    assert record["path"] == str(root / "ascii.jsonl")
    assert record["match"] == {"text": "Where is the café? It's near the gare", "count": 1}
    assert record["type"] == "agent_start"


def test_bad_regex_is_a_usage_error(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_run(["find", "--text", "(unclosed", str(root)]) == 2
    assert "--text takes a regular expression" in capsys.readouterr().err
