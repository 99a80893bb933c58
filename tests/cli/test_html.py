"""``flightlog show --html``: sessions a real daemon recorded, written as a page and opened
from ``file://`` in a real browser (Debian's chromium, driven by Selenium)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flightlog.protocol import events
from flightlog.sdk import connect
from support import DaemonProcess

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
HOSTILE = '</script><img src=x onerror="window.pwned=1"><script>window.pwned=2</script>\u2028&amp;'
BIG = 500  # turns of one model call and one tool call: 1,000 calls

needs_browser = pytest.mark.skipif(
    not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)",
)


def _model(run: Any, exec_id: str, turn: int, answer: Any, **execution: Any) -> events.Execution:
    m = events.Execution(id=exec_id, kind="model", turn_index=turn, **execution)
    run.record(
        events.ModelRequest(
            execution=m, messages=[events.UserMessage(content=f"question of {exec_id}")]
        )
    )
    run.record(events.ModelExecStart(execution=m, model="model-x"))
    if isinstance(answer, str):
        message = events.AssistantMessage(content=[events.TextPart(text=answer)], model="model-x")
    else:
        message = answer
    run.record(
        events.ModelExecEnd(
            execution=m, message=message, usage=events.Usage(input_tokens=100, output_tokens=10)
        )
    )
    return m


def _tool(
    run: Any, exec_id: str, parent: str, turn: int, result: str, *, error: bool = False, **kw: Any
) -> None:
    t = events.Execution(id=exec_id, kind="tool", parent_id=parent, turn_index=turn, **kw)
    arguments = {"city": f"city of {exec_id}"}
    run.record(
        events.ToolExecStart(execution=t, tool_call_id=exec_id, name="lookup", arguments=arguments)
    )
    run.record(
        events.ToolExecEnd(
            execution=t,
            tool_call_id=exec_id,
            name="lookup",
            content=[events.TextPart(text=result)],
            is_error=error,
        )
    )


def _record_walk(session: Any) -> None:
    """Retries, a re-issue, a failed tool, a sub-agent and a hostile tool result."""
    with session.begin_run() as run:
        run.record(events.AgentStart(agent="walker"))
        run.record(events.TurnStart(turn_index=0))
        m1 = events.Execution(id="m1", kind="model", turn_index=0)
        run.record(events.ModelRequest(execution=m1, messages=[events.UserMessage(content="hi")]))
        run.record(events.ModelExecStart(execution=m1, model="model-x"))
        run.record(events.Retry(execution=m1, error="overloaded (529)"))
        _model(run, "m1", 0, "let me look", attempt=2)
        _tool(run, "t-fail", "m1", 0, "timed out", error=True)
        _tool(run, "t-again", "m1", 0, "14°C, rain", replaces="t-fail")
        _tool(run, "t-evil", "m1", 0, HOSTILE)
        # A sub-agent, started by the tool call t-delegate.
        t = events.Execution(id="t-delegate", kind="tool", parent_id="m1", turn_index=0)
        run.record(events.ToolExecStart(execution=t, tool_call_id=t.id, name="delegate"))
        run.record(events.AgentStart(agent="researcher", parent_id="t-delegate"))
        _model(run, "sub-m1", 0, "sub answer", parent_id="t-delegate", agent="researcher")
        _tool(run, "sub-t1", "sub-m1", 0, "sub result", agent="researcher")
        run.record(events.AgentEnd(agent="researcher", parent_id="t-delegate", turns=1))
        run.record(
            events.ToolExecEnd(
                execution=t,
                tool_call_id=t.id,
                name="delegate",
                content=[events.TextPart(text="done")],
            )
        )
        run.record(events.TurnStart(turn_index=1))
        _model(run, "m2", 1, "take an umbrella")
        run.record(events.AgentEnd(agent="walker", ok=True, reason="completed", turns=2))


def _record_big(session: Any) -> None:
    with session.begin_run() as run:
        run.record(events.AgentStart(agent="looper"))
        for turn in range(BIG):
            run.record(events.TurnStart(turn_index=turn))
            _model(run, f"m{turn}", turn, f"answer {turn}")
            _tool(run, f"t{turn}", f"m{turn}", turn, f"result {turn}")
        run.record(events.AgentEnd(agent="looper", ok=True, reason="completed", turns=BIG))


@pytest.fixture(scope="module")
def pages() -> Iterator[dict[str, Path]]:
    base = Path(tempfile.mkdtemp(prefix="fl-", dir="/tmp"))
    daemon = DaemonProcess(base, "--log-format", "json").start()
    try:
        with connect(daemon.socket) as client:
            walk = client.create("walk.jsonl", meta={"name": "<b>walk</b>"})
            _record_walk(walk)
            walk.close()
            big = client.create("big.jsonl")
            _record_big(big)
            big.close()
        found = {}
        for name in ("walk", "big"):
            status, out = show_html(daemon.root / f"{name}.jsonl")
            assert status == 0
            found[name] = base / f"{name}.html"
            found[name].write_bytes(out)
        yield found
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


def show_html(path: Path, *options: str) -> tuple[int, bytes]:
    result = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "show", "--html", str(path), *options],
        capture_output=True,
        timeout=120,
        check=False,
    )
    return result.returncode, result.stdout


def test_nothing_external_in_the_page(pages: dict[str, Path]) -> None:
    big = pages["big"].read_text("utf-8")
    for needle in ("http://", "https://", "src=", "<script", "<link", "@import", "url("):
        assert needle not in big
    walk = pages["walk"].read_text("utf-8")
    # The hostile result is in the page only as escaped text.
    assert "<img" not in walk and "<script" not in walk and "<b>walk" not in walk
    assert "&lt;/script&gt;&lt;img src=x onerror=&quot;window.pwned=1&quot;&gt;" in walk


def test_a_damaged_file_gives_the_page_before_the_bad_line(
    pages: dict[str, Path], tmp_path: Path
) -> None:
    walk = pages["walk"].parent / "root" / "walk.jsonl"
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_bytes(walk.read_bytes() + b"not json\n")
    status, out = show_html(damaged)
    assert status == 1
    page = out.decode()
    assert "NOT SOUND: line " in page and page.count('<details class="call') == 9
    assert page.endswith("</body></html>\n")


def test_a_run_matching_nothing_is_a_usage_error(pages: dict[str, Path]) -> None:
    big = pages["big"].parent / "root" / "big.jsonl"
    status, out = show_html(big, "--run", "nomatch")
    assert status == 2 and out == b""


def test_html_and_call_together_is_a_usage_error(pages: dict[str, Path]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "flightlog.cli", "show", "--html", "--call", "m1", "nowhere.jsonl"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2 and "--call" in result.stderr


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="fl-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


# Opens every call's <details> by clicking its summary, in document order (a nested
# call's parent opens first), then returns what each shows (read after all the clicks,
# so that the page is laid out once, not once a call).
OPEN_ALL = """
const calls = [...document.querySelectorAll('details.call')];
for (const d of calls) d.querySelector(':scope > summary').click();
return calls.map(d => {
  const body = d.querySelector(':scope > .body');
  return [d.id, d.open, body.offsetHeight > 0, body.innerText];
});
"""


@needs_browser
def test_a_thousand_calls_render_and_open(pages: dict[str, Path], browser: Any) -> None:
    browser.get(pages["big"].as_uri())
    assert browser.title.endswith("big.jsonl · flightlog")
    opened = browser.execute_script(OPEN_ALL)
    assert len(opened) == 2 * BIG
    assert all(is_open and shown for _, is_open, shown, _ in opened)
    for turn in range(BIG):
        _, _, _, model = opened[2 * turn]
        _, _, _, tool = opened[2 * turn + 1]
        assert f"question of m{turn}" in model and f"answer {turn}" in model
        assert f'"city": "city of t{turn}"' in tool and f"result {turn}" in tool
    # A tool call is nested in the model call that asked for it.
    nested = browser.execute_script(
        "return document.querySelectorAll('details.call details.call[data-kind=tool]').length"
    )
    assert nested == BIG
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0


@needs_browser
def test_every_call_opens_on_a_real_click(pages: dict[str, Path], browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(pages["walk"].as_uri())
    assert browser.title == "<b>walk</b> · flightlog"
    calls = browser.find_elements(By.CSS_SELECTOR, "details.call")
    labels = [c.find_element(By.CSS_SELECTOR, ":scope > summary").text for c in calls]
    assert len(calls) == 9, labels
    for call in calls:
        summary = call.find_element(By.CSS_SELECTOR, ":scope > summary")
        browser.execute_script("arguments[0].scrollIntoView()", summary)
        summary.click()
        assert call.get_attribute("open") is not None
        assert call.find_element(By.CSS_SELECTOR, ":scope > .body").is_displayed()
    text = browser.find_element(By.TAG_NAME, "body").text
    assert '</script><img src=x onerror="window.pwned=1"><script>window.pwned=2</script>' in text
    assert browser.execute_script("return window.pwned === undefined")
    assert browser.execute_script("return document.images.length") == 0
    assert browser.execute_script("return document.scripts.length") == 0
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0


@needs_browser
def test_retries_reissues_failures_and_sub_agents(pages: dict[str, Path], browser: Any) -> None:
    browser.get(pages["walk"].as_uri())
    links = browser.execute_script(
        "return [...document.querySelectorAll('a')].map(a => [a.textContent,"
        " a.getAttribute('href'), document.querySelector(a.getAttribute('href')).id])"
    )
    by_text = {text: (href, target) for text, href, target in links}
    assert set(by_text) >= {
        "retried as model m1#2",
        "retry of model m1",
        "re-issues tool t-fail",
        "re-issued as tool t-again",
        "inside tool t-delegate",
    }
    assert all(href == "#" + target for href, target in by_text.values())
    failed = browser.execute_script(
        "return [...document.querySelectorAll('details.call.failed')].map(d => d.id)"
    )
    labels = browser.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('details.call')].map("
        "d => [d.id, d.querySelector(':scope > summary .label').textContent]))"
    )
    assert sorted(labels[i].split()[1] for i in failed) == ["m1", "t-fail"]
    # The sub-agent's calls are inside the tool call that started it.
    (delegate,) = [key for key, label in labels.items() if label.startswith("tool t-delegate")]
    inside = browser.execute_script(
        "return [...document.getElementById(arguments[0]).querySelectorAll('details.call')]"
        ".map(d => d.querySelector(':scope > summary .label').textContent)",
        delegate,
    )
    assert [label.split()[1] for label in inside] == ["sub-m1", "sub-t1"]
    assert "[researcher]" in inside[0]


def test_a_call_opens_to_its_whole_prompt(daemon: DaemonProcess) -> None:
    """Every message of a request, with its role, a tool call's arguments and a thinking
    part's text in full (not in the short form of a timeline line); a continued
    request links to the call it continues."""
    long_query = "SELECT name FROM cities WHERE rain_mm > 10 AND country = 'France' ORDER BY 1"
    ask = events.AssistantMessage(
        content=[
            events.ThinkingPart(thinking="The user wants rainy French cities."),
            events.ToolCallPart(id="c1", name="sql", arguments={"query": long_query}),
        ]
    )
    result = events.ToolResultMessage(
        tool_call_id="c1", name="sql", content=[events.TextPart(text="Brest")]
    )
    with connect(daemon.socket) as client:
        session = client.create("whole.jsonl")
        with session.begin_run() as run:
            m1 = events.Execution(id="m1", kind="model")
            question = events.UserMessage(content="Where does it rain?")
            run.record(events.ModelRequest(execution=m1, messages=[question]))
            run.record(events.ModelExecEnd(execution=m1, message=ask))
            m2 = events.Execution(id="m2", kind="model")
            run.record(
                events.ModelRequest(
                    execution=m2, messages=[result], continues="m1", with_response=True
                )
            )
            run.record(
                events.ModelExecEnd(
                    execution=m2,
                    message=events.AssistantMessage(content=[events.TextPart(text="In Brest.")]),
                )
            )
        session.close()
    status, out = show_html(daemon.root / "whole.jsonl")
    assert status == 0
    page = out.decode()
    assert '<span class="role">user</span><pre>Where does it rain?</pre>' in page
    assert '<span class="role">tool_result</span><pre>Brest</pre>' in page
    # The response of m1, as its request shows it and as its answer: whole.
    assert page.count("[thinking] The user wants rainy French cities.") == 1
    whole_call = "→sql({&quot;query&quot;: &quot;" + long_query.replace("'", "&#x27;")
    assert '<span class="role">assistant</span><pre>[thinking]' in page
    assert whole_call.replace(">", "&gt;") + "&quot;})</pre>" in page
    assert '<a href="#' in page and "continues model m1</a>: its messages come first" in page
