"""How a model request is written as continuing the agent's latest recorded one
(``model_request.continues``, docs/format.md section 4.6): each message once, in a run
and across the runs of a conversation, and never a ``continues`` naming a call the file
may not hold."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

__all__ = ["Continuation", "Split"]


class Split(NamedTuple):
    """How a model request is written: ``continues`` (the call it continues, or None),
    ``with_response`` (that call's response comes before the new messages) and the new
    messages to write."""

    continues: str | None
    with_response: bool
    new: list[Any]


class Continuation:
    """One agent's latest model request known to be in the file, so that the next one is
    written as continuing it.

    A request that starts with the messages the latest recorded one sent (the same
    objects, or equal ones) is recorded with ``model_request.continues`` naming that call
    and only the messages after them (docs/format.md): a run's requests then cost the size
    of the conversation once, not once per step.  When the integration said what that
    call got back (:meth:`respond`), its ``model_exec_end`` is recorded, and the request
    goes on with that response, the response is left out too (``with_response``): it is
    in that ``model_exec_end``.  Get one from :meth:`RecordedRun.continuation`: it lives as long
    as its session stays open in the recorder, so that a conversation's next run
    continues its previous run's last request.

    Only a request its :class:`RecordedRun` recorded without a problem is continued: a
    request is a candidate when split, and becomes the base when the recorder confirms
    it.  A dropped or failed record, or any problem the recorder met since the base was
    confirmed, makes the next request be written in full, so that no ``continues`` names
    a call the file may not hold.
    """

    #: Requests split and not yet confirmed, kept (the latest ones) for their confirmation.
    _PENDING: Final = 4

    def __init__(self, mark: Callable[[], object] = lambda: None) -> None:
        self._mark = mark
        self._lock = threading.Lock()
        self._sent: list[Any] = []
        self._sent_by: str | None = None
        self._sent_mark: object = None
        #: The base's response, as the framework holds it, once recorded (see respond),
        #: and one said but not yet recorded.
        self._response: tuple[str, Any] | None = None
        self._responding: tuple[str, Any] | None = None
        self._pending: OrderedDict[str, list[Any]] = OrderedDict()

    def request(
        self,
        execution_id: str,
        messages: Sequence[Any],
        *,
        answer: Callable[[Any], Any] | None = None,
    ) -> Split:
        """How the request ``execution_id`` sending ``messages`` is written: the
        response said with :meth:`respond` is left out when the next message is it (the
        same or an equal object), or ``answer`` (for a framework that sends responses
        back in another shape) makes it of that message."""
        sent = list(messages)
        with self._lock:
            known, by, response = self._sent, self._sent_by, self._response
            if by is not None and self._sent_mark != self._mark():
                by = None  # a problem since it was recorded: it may not be in the file
            self._pending[execution_id] = sent
            while len(self._pending) > self._PENDING:
                self._pending.popitem(last=False)
        if (
            by is None
            or len(sent) < len(known)
            or not all(a is b or a == b for a, b in zip(sent, known, strict=False))
        ):
            return Split(None, False, sent)
        rest = sent[len(known) :]
        if response is not None and response[0] == by and rest:
            said = response[1]
            if rest[0] is said or rest[0] == said or _converts_to(answer, rest[0], said):
                return Split(by, True, rest[1:])
        return Split(by, False, rest)

    def split(self, execution_id: str, messages: Sequence[Any]) -> tuple[str | None, list[Any]]:
        """``(continues, new messages)`` of the request ``execution_id`` sending
        ``messages``, never leaving a response out."""
        with self._lock:
            self._response = None
        continues, _, new = self.request(execution_id, messages)
        return continues, new

    def respond(self, execution_id: str, response: Any) -> None:
        """The call ``execution_id`` got ``response`` (as the framework holds it), which
        its ``model_exec_end`` records as its ``message``; once the recorder confirms
        that record, the next request may leave the response out."""
        with self._lock:
            self._responding = (execution_id, response)

    def answered(self, execution_id: str) -> None:
        """The ``model_exec_end`` of ``execution_id`` is recorded."""
        with self._lock:
            responding = self._responding
            if responding is not None and responding[0] == execution_id:
                self._response, self._responding = responding, None

    def confirm(self, execution_id: str) -> None:
        """The request ``execution_id`` is recorded: the next one may continue it."""
        with self._lock:
            sent = self._pending.pop(execution_id, None)
            if sent is not None:
                self._sent, self._sent_by, self._sent_mark = sent, execution_id, self._mark()
                # A response said before its request is confirmed (one send) is kept.
                if self._responding is not None and self._responding[0] != execution_id:
                    self._responding = None
                self._response = None

    def forget(self) -> None:
        """A record failed: the next request is written in full."""
        with self._lock:
            self._sent, self._sent_by, self._sent_mark = [], None, None
            self._response = self._responding = None
            self._pending.clear()


def _converts_to(convert: Callable[[Any], Any] | None, message: Any, said: Any) -> bool:
    try:
        return convert is not None and bool(convert(message) == said)
    except Exception:
        return False  # not a response: written as it is
