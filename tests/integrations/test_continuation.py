"""``Continuation``: a request continues only one the recorder knows is in the file, and
the runs of a conversation continue each other while the recorder holds its session."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from flightlog.integrations import RecordedRun, Recorder
from flightlog.protocol import default_codec, events
from flightlog.sdk import CallNotFound, Transcript, check
from support import DaemonProcess

from .helpers import of_type, records


@pytest.fixture
def recorder(daemon: DaemonProcess) -> Iterator[Recorder]:
    recorder = Recorder(socket=daemon.socket)
    yield recorder
    recorder.close()


def step(run: RecordedRun, sent: list[Any], config: dict[str, Any] | None = None) -> str:
    """Record a model request sending ``sent`` as the integrations do; its call id."""
    execution = events.Execution(id=events.new_execution_id(), kind="model")
    continues, new = run.continuation("agent").split(execution.id, sent)
    run.record(
        events.ModelRequest(
            execution=execution,
            messages=new,
            config=events.CallConfig(model="m", extra=config or {}),
            continues=continues,
        )
    )
    return execution.id


def j(messages: list[Any]) -> list[Any]:
    return list(msgspec.json.decode(default_codec.encode_value(messages)))


def grow(history: list[Any], index: int) -> None:
    history.append(events.AssistantMessage(content=[events.TextPart(text=f"answer {index}")]))
    history.append(events.UserMessage(content=f"question {index}"))


def test_a_thousand_step_run_writes_each_message_once(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    sizes = {}
    for steps in (100, 1000):
        run = recorder.begin(f"long{steps}.jsonl")
        history: list[Any] = [events.UserMessage(content="go")]
        for index in range(steps):
            step(run, history)
            grow(history, index)
        run.close()
        recorder.close()
        path = daemon.root / f"long{steps}.jsonl"
        sizes[steps] = path.stat().st_size
        requests = of_type(records(path), "model_request")
        assert sum(r["data"]["continues"] is None for r in requests) == 1
        assert Transcript.read(path).latest().messages == j(history[:-2])
    assert sizes[1000] <= 11 * sizes[100], sizes


def test_after_a_request_written_as_a_stub_the_next_is_written_in_full(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    daemon = DaemonProcess(tmp_path_factory.mktemp("small"), "--max-frame-size", "65536")
    daemon.start()
    recorder = Recorder(socket=daemon.socket)
    try:
        run = recorder.begin("stub.jsonl")
        history: list[Any] = [events.UserMessage(content="go")]
        sent = []
        for index in range(5):
            # The third request is larger than a frame: written as its stub.
            big = {"pad": "x" * 100_000} if index == 2 else None
            sent.append((step(run, history, big), list(history)))
            grow(history, index)
        run.close()
        recorder.close()
        path = daemon.root / "stub.jsonl"
        assert check(path).sound
        assert recorder.stats.problems == 0, recorder.stats
        requests = of_type(records(path), "model_request")
        assert [r["data"]["execution"]["id"] for r in requests] == [call for call, _ in sent]
        assert requests[2]["data"]["$flightlog"] == "oversized"
        # The one after the stub is in full; the chain starts again from it.
        assert [r["data"]["continues"] for r in requests[3:]] == [None, sent[3][0]]
        transcript = Transcript.read(path)
        for index in (0, 1, 3, 4):
            assert transcript.prompt(sent[index][0]).messages == j(sent[index][1])
        with pytest.raises(CallNotFound) as raised:
            transcript.prompt(sent[2][0])
        assert raised.value.line == requests[2]["seq"]
        assert "too large to record" in raised.value.message
        [close] = of_type(records(path), "run_close")
        assert "oversized" in close["data"]["error"]
    finally:
        recorder.close()
        daemon.stop()


def test_the_runs_of_a_conversation_continue_each_other_while_its_session_is_held(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    history: list[Any] = [events.UserMessage(content="go")]
    calls = []
    for index in range(3):
        run = recorder.begin("chat.jsonl")
        calls.append(step(run, history))
        grow(history, index)
        run.close()
    # A recorder that closed its sessions knows nothing of the file: in full again.
    recorder.close()
    run = recorder.begin("chat.jsonl")
    calls.append(step(run, history))
    run.close()
    recorder.close()
    path = daemon.root / "chat.jsonl"
    requests = of_type(records(path), "model_request")
    assert [r["data"]["continues"] for r in requests] == [None, calls[0], calls[1], None]
    assert len({r["run_id"] for r in requests}) == 4
    transcript = Transcript.read(path)
    assert [len(p.messages) for p in transcript.prompts()] == [1, 3, 5, 7]
    assert transcript.latest().messages == j(history)


def test_another_agent_of_the_session_has_its_own_chain(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    run = recorder.begin("two.jsonl")
    one = run.continuation("one")
    assert run.continuation("one") is one
    assert run.continuation("two") is not one
    run.close()
    stopped = RecordedRun(recorder, "x.jsonl", None)
    # A run that records nothing never continues.
    assert stopped.continuation("one").split("a", [1]) == (None, [1])


def test_a_response_is_left_out_only_once_its_end_is_recorded(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    run = recorder.begin("answers.jsonl")
    continuation = run.continuation("agent")
    question = events.UserMessage(content="q")
    answer = events.AssistantMessage(content=[events.TextPart(text="a")])
    first = events.Execution(id="m1", kind="model")
    split = continuation.request("m1", [question])
    run.record(events.ModelRequest(execution=first, messages=split.new))
    continuation.respond("m1", answer)
    # Its model_exec_end not recorded yet (held back, say): the answer is written.
    assert continuation.request("m2", [question, answer]) == ("m1", False, [answer])
    run.record(events.ModelExecEnd(execution=first, message=answer))
    # Recorded: the next request leaves it out.
    follow = events.UserMessage(content="q2")
    assert continuation.request("m3", [question, answer, follow]) == ("m1", True, [follow])
    run.close()


def test_a_response_recorded_with_its_request_is_left_out_when_sent_back_converted(
    daemon: DaemonProcess, recorder: Recorder
) -> None:
    # As the OpenAI Agents integration records a call: its request and its end in one
    # send, the response said before either is confirmed; the next request sends the
    # response back in another shape, which ``answer`` converts.
    run = recorder.begin("converted.jsonl")
    continuation = run.continuation("agent")
    said = events.AssistantMessage(content=[events.TextPart(text="hello")], model="m")
    history: list[Any] = [{"role": "user", "content": "hi"}]

    def answer(item: Any) -> Any:
        return [events.TextPart(text=item["content"])] if item["role"] == "assistant" else None

    def call(sent: list[Any]) -> tuple[bool, list[Any]]:
        execution = events.Execution(id=events.new_execution_id(), kind="model")
        continues, with_response, new = continuation.request(execution.id, sent, answer=answer)
        continuation.respond(execution.id, said.content)
        run.record(
            events.ModelRequest(
                execution=execution,
                messages=[events.UserMessage(content=m["content"]) for m in new],
                config=events.CallConfig(model="m"),
                continues=continues,
                with_response=with_response,
            ),
            events.ModelExecEnd(execution=execution, message=said),
        )
        return with_response, new

    assert call(history) == (False, history)
    history += [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    assert call(history) == (True, [history[-1]])
    # A message that is not the response (another text) is written.
    history += [{"role": "assistant", "content": "other"}, {"role": "user", "content": "x"}]
    assert call(history) == (False, history[-2:])
    run.close()
    recorder.close()
    prompts = list(Transcript.read(daemon.root / "converted.jsonl").prompts())
    assert [m["$type"] for m in prompts[1].messages] == ["user", "assistant", "user"]
    assert prompts[1].messages[1]["content"] == [{"$type": "text", "text": "hello"}]
