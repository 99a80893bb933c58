"""Cost in the CLI's views: each model call priced once, and how a price is shown.

Prices come from :func:`flightlog.sdk.price` (genai-prices, the ``cost`` extra).  Without
the extra no figure is shown and the views say how to get one; a model genai-prices does
not know, or a call that responded with no usage recorded, is ``cost unknown``, never
``$0`` (the rule is :mod:`flightlog.sdk._cost`'s), and a total that leaves one out is a lower
bound (``≥ $0.0042``).  Every figure comes with its source: the version of the table and
the model it matched, or why there is none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from flightlog.sdk import MissingExtra, Price, Total, price

if TYPE_CHECKING:
    from ._inspect import CallSummary

__all__ = ["INSTALL_NOTE", "Pricer", "can_price", "price_text", "sources_text"]

#: What the views say when genai-prices is not installed.
INSTALL_NOTE: Final = "cost: pip install 'flightlog-sdk[cost]' (genai-prices)"


def can_price() -> bool:
    """Whether genai-prices is installed: without it no call has a price, not even an
    unknown one."""
    try:
        import genai_prices  # noqa: F401
    except ImportError:
        return False
    return True


class Pricer:
    """Prices model calls; ``missing`` once genai-prices turned out not to be installed
    (then every price is None and nothing is looked up again)."""

    def __init__(self) -> None:
        self.missing = False
        self._checked = False

    def __call__(
        self, usage: Any, model: Any, provider: Any = None, *, response: bool = True
    ) -> Price | None:
        """The price of one model call's ``usage`` (``response``: whether it returned
        one, as :func:`flightlog.sdk.price` takes it); None when there is nothing to price
        or no table to price it with."""
        if not self._checked:  # before the first call, which may need no table
            self._checked, self.missing = True, not can_price()
        if self.missing:
            return None
        try:
            return price(
                usage if isinstance(usage, Mapping) else None,
                model if isinstance(model, str) else None,
                provider if isinstance(provider, str) else None,
                response=response,
            )
        except MissingExtra:
            self.missing = True
            return None

    def call(self, call: CallSummary) -> Price | None:
        """A call's price: a model call's, None for other calls."""
        if call.kind != "model":
            return None
        return self(call.usage, call.model, call.provider, response=call.responded)

    def total(self, calls: Iterable[CallSummary]) -> Total:
        return Total.of(self.call(call) for call in calls)


def price_text(found: Price) -> str:
    """``$0.0012``, or ``cost unknown`` for a price with no amount."""
    return Total.of([found]).text() if found.known else "cost unknown"


def sources_text(total: Total) -> str:
    """``genai-prices 0.2.3: openai/gpt-4o (3 calls) · unknown model 'demo-1' (1 call)``."""
    return " · ".join(
        f"{source} ({count} call{'' if count == 1 else 's'})"
        for source, count in total.sources.items()
    )
