"""The conformance suite's LangChain/LangGraph scenarios: real graphs over a scripted
chat model that keeps the messages it is handed at each call (streamed or not); each
scenario returns what every model call was handed, in call order, in the normal form
(conformance.py)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated, Any

import anyio
import pydantic
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import InjectedToolCallId, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import InjectedState, ToolNode, create_react_agent, tools_condition
from langgraph.types import Command

from flightlog.integrations import Recorder
from flightlog.integrations.langchain import FlightlogCallbackHandler

from .conformance import PDF64, PNG64, WAV64, Sent, from_langchain

Scenario = Callable[[Recorder, str], Awaitable[list[Sent]]]
Answer = Callable[[list[BaseMessage], int], AIMessage]

SYSTEM = "You are a weather assistant."


class Scripted(BaseChatModel):
    """A chat model that answers from ``answer`` (the messages, the call's number), and
    keeps in ``sent`` what each call was handed; it streams its text word by word and
    its tool calls as chunks, as a provider's model does."""

    answer: Answer
    #: Not validated (so not copied): models of one scenario share one list.
    sent: Any
    fails: int = 0
    calls: int = 0

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.sent.append(from_langchain(messages))
        self.calls += 1
        if self.fails:
            self.fails -= 1
            raise RuntimeError("429 Too Many Requests")
        return ChatResult(generations=[ChatGeneration(message=self.answer(messages, self.calls))])

    def _stream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:
        message = self._generate(messages).generations[0].message
        assert isinstance(message, AIMessage)
        for word in str(message.content).split(" "):
            yield ChatGenerationChunk(message=AIMessageChunk(content=word + " "))
        chunks = [
            {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i}
            for i, c in enumerate(message.tool_calls)
        ]
        yield ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=chunks))


def call(name: str, args: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def _tool_then_text(messages: list[BaseMessage], calls: int) -> AIMessage:
    if messages[-1].type == "human":
        return AIMessage(content="", tool_calls=[call("lookup", {"city": "Lisbon"}, f"c{calls}")])
    return AIMessage(content=f"sunny, after {calls} calls")


@tool
def lookup(city: str) -> str:
    """Look the weather up."""
    return f"{city}: sunny, 21 degrees"


def _handler(recorder: Recorder, path: str) -> dict[str, Any]:
    return {"callbacks": [FlightlogCallbackHandler(path=path, recorder=recorder)]}


def _react(model: Scripted, tools: list[Any], **kwargs: Any) -> Any:
    return create_react_agent(model, ToolNode(tools), prompt=SYSTEM, name="weather", **kwargs)


async def parallel_tools(recorder: Recorder, path: str) -> list[Sent]:
    def answer(messages: list[BaseMessage], calls: int) -> AIMessage:
        if calls == 1:
            return AIMessage(
                content="Looking both up.",
                tool_calls=[
                    call("lookup", {"city": "Lisbon"}, "call_1"),
                    call("lookup", {"city": "Porto"}, "call_2"),
                ],
            )
        return AIMessage(content="Both sunny.")

    model = Scripted(answer=answer, sent=[])
    await _react(model, [lookup]).ainvoke(
        {"messages": [("user", "Lisbon and Porto?")]}, _handler(recorder, path)
    )
    return model.sent


@tool
def strict(n: int) -> str:
    """A tool that refuses small numbers."""
    if n < 2:
        raise ValueError("n must be at least 2")
    return f"ok {n}"


def _graph(node: Callable[[MessagesState], Any], tools: list[Any]) -> Any:
    graph = StateGraph(MessagesState)
    graph.add_node("agent", node)
    graph.add_node("tools", ToolNode(tools, handle_tool_errors=True))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(name="weather")


async def retries(recorder: Recorder, path: str) -> list[Sent]:
    # A model call retried after a 429 (with_retry), and a tool error the model is shown
    # (handle_tool_errors), after which it asks again.
    def answer(messages: list[BaseMessage], calls: int) -> AIMessage:
        if calls < 4:
            return AIMessage(content="", tool_calls=[call("strict", {"n": calls - 1}, f"c{calls}")])
        return AIMessage(content="done")

    model = Scripted(answer=answer, sent=[], fails=1)
    bound = model.bind_tools([strict]).with_retry(
        stop_after_attempt=2, wait_exponential_jitter=False
    )

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke([("system", SYSTEM), *state["messages"]])]}

    graph = _graph(agent, [strict])
    await graph.ainvoke({"messages": [("user", "go")]}, _handler(recorder, path))
    return model.sent


async def fallback(recorder: Recorder, path: str) -> list[Sent]:
    sent: list[Sent] = []
    failing = Scripted(answer=_tool_then_text, sent=sent, fails=100)
    model = Scripted(answer=_tool_then_text, sent=sent)
    bound = failing.bind_tools([lookup]).with_fallbacks([model.bind_tools([lookup])])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke([("system", SYSTEM), *state["messages"]])]}

    await _graph(agent, [lookup]).ainvoke(
        {"messages": [("user", "Lisbon?")]}, _handler(recorder, path)
    )
    return sent


class Weather(pydantic.BaseModel):
    city: str
    degrees: int


async def structured_output(recorder: Recorder, path: str) -> list[Sent]:
    # The ReAct agent's response_format: one more call after the loop, answered through
    # a tool call named after the schema.
    def answer(messages: list[BaseMessage], calls: int) -> AIMessage:
        if calls == 3:
            return AIMessage(
                content="", tool_calls=[call("Weather", {"city": "Lisbon", "degrees": 21}, "w")]
            )
        return _tool_then_text(messages, calls)

    model = Scripted(answer=answer, sent=[])
    await _react(model, [lookup], response_format=Weather).ainvoke(
        {"messages": [("user", "Lisbon?")]}, _handler(recorder, path)
    )
    return model.sent


async def streaming(recorder: Recorder, path: str) -> list[Sent]:
    model = Scripted(answer=_tool_then_text, sent=[])
    async for _ in _react(model, [lookup]).astream(
        {"messages": [("user", "Lisbon?")]}, _handler(recorder, path), stream_mode="messages"
    ):
        pass
    return model.sent


async def handoffs(recorder: Recorder, path: str) -> list[Sent]:
    # Two agents of one graph; the first hands the conversation to the second with a
    # tool that jumps to it (LangGraph's handoff: a Command to the parent graph).
    @tool
    def transfer_to_expert(
        state: Annotated[dict[str, Any], InjectedState],
        tool_call_id: Annotated[str, InjectedToolCallId],
    ) -> Command[Any]:
        """Hand the conversation to the expert."""
        done = ToolMessage("Transferred to expert", tool_call_id=tool_call_id)
        return Command(
            goto="expert",
            graph=Command.PARENT,
            update={"messages": [*state["messages"], done]},
        )

    sent: list[Sent] = []
    front = Scripted(
        answer=lambda m, n: AIMessage(
            content="", tool_calls=[call("transfer_to_expert", {}, "h1")]
        ),
        sent=sent,
    )
    expert = Scripted(answer=_tool_then_text, sent=sent)
    graph = StateGraph(MessagesState)
    graph.add_node(
        "front",
        create_react_agent(front, [transfer_to_expert], prompt="You triage.", name="front"),
        destinations=("expert",),
    )
    graph.add_node("expert", create_react_agent(expert, [lookup], prompt=SYSTEM, name="expert"))
    graph.add_edge(START, "front")
    await graph.compile().ainvoke({"messages": [("user", "Lisbon?")]}, _handler(recorder, path))
    return sent


async def agents_as_tools(recorder: Recorder, path: str) -> list[Sent]:
    sent: list[Sent] = []
    helper = _react(Scripted(answer=_tool_then_text, sent=sent), [lookup])

    @tool
    async def ask_expert(question: str) -> str:
        """Ask the expert agent."""
        out = await helper.ainvoke({"messages": [("user", question)]})
        return str(out["messages"][-1].content)

    def answer(messages: list[BaseMessage], calls: int) -> AIMessage:
        if calls == 1:
            return AIMessage(
                content="", tool_calls=[call("ask_expert", {"question": "Lisbon?"}, "q")]
            )
        return AIMessage(content="The expert says sunny.")

    boss = _react(Scripted(answer=answer, sent=sent), [ask_expert])
    await boss.ainvoke({"messages": [("user", "Ask the expert.")]}, _handler(recorder, path))
    return sent


async def cancellation(recorder: Recorder, path: str) -> list[Sent]:
    # A run cancelled in a tool, after a run of the thread that was not, and a run after.
    started = anyio.Event()

    @tool
    async def wait(city: str) -> str:
        """Wait for the weather."""
        started.set()
        await anyio.sleep_forever()
        return "never"

    sent: list[Sent] = []
    graph = _react(Scripted(answer=_tool_then_text, sent=sent), [lookup])
    config = _handler(recorder, path)
    first = await graph.ainvoke({"messages": [("user", "Lisbon?")]}, config)
    waiting = _react(
        Scripted(
            answer=lambda m, n: AIMessage(
                content="", tool_calls=[call("wait", {"city": "x"}, "w")]
            ),
            sent=sent,
        ),
        [wait],
    )
    async with anyio.create_task_group() as group:
        group.start_soon(
            lambda: waiting.ainvoke({"messages": [*first["messages"], ("user", "Wait.")]}, config)
        )
        await started.wait()
        group.cancel_scope.cancel()
    await graph.ainvoke({"messages": [*first["messages"], ("user", "And Porto?")]}, config)
    return sent


async def conversation(recorder: Recorder, path: str) -> list[Sent]:
    model = Scripted(answer=_tool_then_text, sent=[])
    graph = _react(model, [lookup], checkpointer=InMemorySaver())
    config = {**_handler(recorder, path), "configurable": {"thread_id": "t-1"}}
    for question in ("Lisbon?", "And tomorrow?", "And Porto?"):
        await graph.ainvoke({"messages": [("user", question)]}, config)
    return model.sent


async def multimodal(recorder: Recorder, path: str) -> list[Sent]:
    # Images, files and audio in every shape LangChain takes: OpenAI's image_url (a
    # data URL, a URL), its input_audio and file parts, the standard blocks (by URL,
    # base64, file id; the older source_type shape and the current one).
    model = Scripted(answer=_tool_then_text, sent=[])
    question = HumanMessage(
        content=[
            {"type": "text", "text": "What is the weather in these?"},
            {
                "type": "image_url",
                "image_url": {"url": f"data:image/png;base64,{PNG64}", "detail": "low"},
            },
            {"type": "image_url", "image_url": {"url": "https://example.com/sky.jpg"}},
            {"type": "image", "source_type": "url", "url": "https://example.com/sea.png"},
            {"type": "image", "base64": PNG64, "mime_type": "image/png"},
            {
                "type": "file",
                "source_type": "base64",
                "data": PDF64,
                "mime_type": "application/pdf",
                "filename": "forecast.pdf",
            },
            {"type": "file", "source_type": "id", "id": "file-123"},
            {"type": "file", "file_id": "file-456"},
            {"type": "audio", "source_type": "base64", "data": WAV64, "mime_type": "audio/wav"},
            {"type": "input_audio", "input_audio": {"data": WAV64, "format": "wav"}},
            {
                "type": "file",
                "file": {"file_data": f"data:application/pdf;base64,{PDF64}", "filename": "x.pdf"},
            },
        ]
    )
    await _react(model, [lookup]).ainvoke({"messages": [question]}, _handler(recorder, path))
    return model.sent


async def system_midway(recorder: Recorder, path: str) -> list[Sent]:
    # A system message in the conversation's course (not leading), in a thread's
    # second run: the model is sent it in place.
    model = Scripted(answer=_tool_then_text, sent=[])
    graph = _react(model, [lookup], checkpointer=InMemorySaver())
    config = {**_handler(recorder, path), "configurable": {"thread_id": "t-1"}}
    await graph.ainvoke({"messages": [("user", "Lisbon?")]}, config)
    later = [SystemMessage("Answer in French from now on."), HumanMessage("And Porto?")]
    await graph.ainvoke({"messages": later}, config)
    return model.sent


async def interrupt(recorder: Recorder, path: str) -> list[Sent]:
    # A tool that asks a person (interrupt()), the thread resumed with the answer.
    from langgraph.types import interrupt as ask

    @tool
    def delete(path: str) -> str:
        """Delete a file, once a person approves."""
        return f"deleted {path}" if ask({"delete": path}) == "yes" else "refused"

    def answer(messages: list[BaseMessage], calls: int) -> AIMessage:
        if calls == 1:
            return AIMessage(content="", tool_calls=[call("delete", {"path": "notes.txt"}, "d1")])
        return AIMessage(content="done")

    model = Scripted(answer=answer, sent=[])
    graph = _react(model, [delete], checkpointer=InMemorySaver())
    config = {**_handler(recorder, path), "configurable": {"thread_id": "t-1"}}
    await graph.ainvoke({"messages": [("user", "Delete notes.txt.")]}, config)
    await graph.ainvoke(Command(resume="yes"), config)
    return model.sent


SCENARIOS: dict[str, Scenario] = {
    "parallel_tools": parallel_tools,
    "retries": retries,
    "fallback": fallback,
    "structured_output": structured_output,
    "streaming": streaming,
    "handoffs": handoffs,
    "agents_as_tools": agents_as_tools,
    "cancellation": cancellation,
    "conversation": conversation,
    "multimodal": multimodal,
    "system_midway": system_midway,
    "interrupt": interrupt,
}
