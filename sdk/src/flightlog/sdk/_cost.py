"""What a model call cost: its tokens priced with a maintained price table.

flightlog keeps no prices of its own.  It asks pydantic's ``genai-prices`` (the
``cost`` extra), which knows the providers' current and past prices, cache reads and
writes and tiered prices included, and says which model and provider it matched.  A
model it does not know is *unknown*, never free: :class:`Price` says so, and every
total that holds an unknown call says it is a lower bound.

Tokens are read as genai-prices reads them: ``input_tokens`` counts every input token,
the cached ones included; ``cache_read_tokens`` and ``cache_write_tokens`` are the parts
of it that were read from or written to the provider's cache.  A cost the provider itself
reported (``usage.cost``) is kept beside the computed price, not replaced by it.

A call is priced by what its ``model_exec_end`` says (:func:`responded`).  A call that
returned a response (its ``message``, a partial one on failure included, or no ``error``)
but recorded no usage (none, or every count zero) was billed for tokens nobody counted:
its price is unknown (``no usage recorded``), never $0.  A call that failed with no
response and no usage is not priced: nothing the record holds says it was billed.  A
call with usage is priced, whether it succeeded or not.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from ._exceptions import MissingExtra

__all__ = ["Price", "Total", "price", "responded"]

_TOKENS: Final = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")

#: The source of the price of a call that responded and recorded no usage.
NO_USAGE: Final = "no usage recorded"


@dataclass(frozen=True)
class Price:
    """The price of one model call.

    ``amount`` is in ``currency`` (USD), None when the model is unknown; ``source`` says
    where it comes from (``genai-prices 0.2.3: anthropic/claude-sonnet-4-5``) or why
    there is none (``unknown model 'demo-1'``).
    """

    amount: Decimal | None
    source: str
    currency: str = "USD"

    @property
    def known(self) -> bool:
        return self.amount is not None


@dataclass
class Total:
    """The sum of several prices: ``amount`` over the known ones, and how many were not.

    ``sources`` counts the prices by :attr:`Price.source`: where each came from, or why
    there is none.
    """

    amount: Decimal = Decimal(0)
    priced: int = 0
    unknown: int = 0
    currency: str = "USD"
    sources: dict[str, int] = field(default_factory=dict)

    def add(self, price: Price | None) -> None:
        if price is None:
            return
        self.sources[price.source] = self.sources.get(price.source, 0) + 1
        if price.amount is None:
            self.unknown += 1
        else:
            self.amount += price.amount
            self.priced += 1

    def text(self) -> str:
        """``$0.0042``, ``≥ $0.0042`` when some calls are unknown, ``unknown`` when all are."""
        if not self.priced:
            return "unknown" if self.unknown else "$0"
        figure = f"${self.amount:.4f}" if self.amount < 1 else f"${self.amount:,.2f}"
        return f"≥ {figure}" if self.unknown else figure

    def as_json(self) -> dict[str, Any]:
        return {
            "amount": float(self.amount) if self.priced else None,
            "currency": self.currency,
            "priced_calls": self.priced,
            "unknown_calls": self.unknown,
            "sources": self.sources,
        }

    @classmethod
    def of(cls, prices: Iterable[Price | None]) -> Total:
        total = cls()
        for item in prices:
            total.add(item)
        return total


def _genai_prices() -> Any:
    try:
        import genai_prices
    except ImportError:
        raise MissingExtra("cost", "genai-prices") from None
    return genai_prices


@functools.lru_cache(maxsize=65536)
def _priced(model: str, provider: str | None, tokens: tuple[int, int, int, int]) -> Price:
    genai_prices = _genai_prices()
    usage = genai_prices.Usage(**dict(zip(_TOKENS, tokens, strict=True)))
    try:
        found = genai_prices.calc_price(usage, model_ref=model, provider_id=provider)
    except LookupError:
        if provider is not None:
            return _priced(model, None, tokens)  # a provider name genai-prices spells otherwise
        return Price(None, f"unknown model {model!r}")
    except ValueError as exc:  # tokens it cannot price (cached more than sent, say)
        return Price(None, f"cannot price {model!r}: {exc}")
    version = getattr(genai_prices, "__version__", "")
    return Price(found.total_price, f"genai-prices {version}: {found.provider.id}/{found.model.id}")


def responded(end: Mapping[str, Any]) -> bool:
    """Whether a model call's ``model_exec_end`` data says a response came back: a
    ``message`` (on failure the partial one), or no ``error`` (the call succeeded)."""
    return end.get("message") is not None or end.get("error") is None


def price(
    usage: Mapping[str, Any] | None,
    model: str | None,
    provider: str | None = None,
    *,
    response: bool = True,
) -> Price | None:
    """The price of a model call that used ``usage`` (a recorded ``Usage``) on ``model``.

    ``response`` says whether the call returned one (:func:`responded` reads it from its
    ``model_exec_end``).  Without usage (None, or no token counted) the price is unknown
    (``no usage recorded``) when it did, and None (nothing to price) when it did not; a
    :class:`Price` with no amount as well when the model is unknown.  Raises
    :class:`MissingExtra` when genai-prices is not installed (``pip install
    'flightlog-sdk[cost]'``).
    """
    counts = usage if isinstance(usage, Mapping) else {}
    tokens = tuple(_count(counts.get(name)) for name in _TOKENS)
    if not any(tokens):
        return Price(None, NO_USAGE) if response else None
    if not model:
        return Price(None, "no model named")
    return _priced(model, provider or None, tokens)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
