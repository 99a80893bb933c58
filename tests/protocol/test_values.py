"""The codec's framework values: pydantic, numpy, pandas and the standard library's others.

Each is written as its own library writes it for JSON, never refused, and none of the
libraries is imported by the codec for a value that is not theirs.
"""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any

import msgspec
import numpy as np
import pandas as pd
import pydantic
import pydantic.dataclasses
import pydantic_core
import pytest

from flightlog.protocol import (
    Execution,
    decode_value,
    encode_event,
    encode_value,
)
from flightlog.protocol._values import complex_text
from flightlog.protocol.events import (
    ToolExecEnd,
)

TOOL = Execution(id="t1", kind="tool")


def written(value: Any) -> Any:
    """What a tool_exec_end's details hold once ``value`` is recorded there."""
    encoded = encode_event(ToolExecEnd(execution=TOOL, tool_call_id="c", name="x", details=value))
    assert encoded is not None
    assert encoded.markers == ()  # nothing refused, nothing marked
    return msgspec.json.decode(encoded.data)["details"]


# --- the standard library's values, as pydantic writes them, without pydantic --------------


@pytest.mark.parametrize(
    "value",
    [
        ipaddress.IPv4Address("192.0.2.1"),
        ipaddress.IPv6Address("2001:db8::1"),
        ipaddress.IPv4Network("10.0.0.0/8"),
        ipaddress.IPv6Network("2001:db8::/32"),
        ipaddress.IPv4Interface("192.0.2.1/24"),
        ipaddress.IPv6Interface("2001:db8::1/64"),
        re.compile(r"^a+\d$"),
        Fraction(1, 3),
        Fraction(-7, 2),
        Decimal("1.50"),
        complex(1, 2),
        complex(0, 1),
        complex(1, 0),
        complex(1.5, -2),
        complex(-0.0, 0.0),
        complex(1e20, 1e-7),
        complex(float("nan"), float("inf")),
        complex(2, float("-inf")),
    ],
    ids=repr,
)
def test_standard_values_are_written_as_pydantic_writes_them(value: Any) -> None:
    assert written({"v": value}) == {"v": pydantic_core.to_jsonable_python(value)}
    assert decode_value(encode_value(value)) == pydantic_core.to_jsonable_python(value)


@pytest.mark.parametrize("z", [complex(3.25, -0.5), complex(-1, 1e-300), complex(123456789.0, 0)])
def test_complex_text_matches_pydantic(z: complex) -> None:
    assert complex_text(z) == pydantic_core.to_jsonable_python(z)


def test_a_subclass_is_written_as_its_base() -> None:
    class Address(ipaddress.IPv4Address):
        pass

    assert written(Address("192.0.2.7")) == "192.0.2.7"


# --- pydantic -----------------------------------------------------------------------------


class Host(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(serialize_by_alias=True)

    ip: ipaddress.IPv4Address
    network: ipaddress.IPv4Network
    display_name: str = pydantic.Field(serialization_alias="displayName")
    password: pydantic.SecretStr
    key: pydantic.SecretBytes
    url: pydantic.HttpUrl
    home: pydantic.AnyUrl
    pattern: re.Pattern[str]
    ratio: Fraction
    seen: datetime

    @pydantic.computed_field  # type: ignore[prop-decorator]
    @property
    def label(self) -> str:
        return f"{self.display_name}@{self.ip}"

    @pydantic.field_serializer("ratio")
    def _ratio(self, value: Fraction) -> float:
        return float(value)


class Plain(pydantic.BaseModel):
    # No serialize_by_alias: pydantic's JSON dump writes the field's name.
    display_name: str = pydantic.Field(serialization_alias="displayName")


def host() -> Host:
    return Host(
        ip="192.0.2.1",
        network="192.0.2.0/24",
        display_name="db",
        password="hunter2",
        key=b"k3y",
        url="https://example.com/a",
        home="ftp://files.example.com",
        pattern="^db-\\d+$",
        ratio=Fraction(1, 4),
        seen=datetime(2026, 12, 3, 9, 0, tzinfo=UTC),
    )


def test_a_pydantic_model_is_written_as_pydantic_dumps_it_for_json() -> None:
    model = host()
    assert written(model) == {
        "$class": f"{__name__}.Host",
        **json.loads(model.model_dump_json()),
    }
    assert written(model) == {
        "$class": f"{__name__}.Host",
        "ip": "192.0.2.1",
        "network": "192.0.2.0/24",
        "displayName": "db",
        "password": "**********",
        "key": "**********",
        "url": "https://example.com/a",
        "home": "ftp://files.example.com/",
        "pattern": "^db-\\d+$",
        "ratio": 0.25,
        "seen": "2026-12-03T09:00:00Z",
        "label": "db@192.0.2.1",
    }


def test_aliases_follow_the_model_config_as_pydantic_json_does() -> None:
    model = Plain(display_name="x")
    assert written(model) == {"$class": f"{__name__}.Plain", **json.loads(model.model_dump_json())}
    assert written(model)["display_name"] == "x"


@pydantic.dataclasses.dataclass
class Point:
    x: int
    secret: pydantic.SecretStr
    where: ipaddress.IPv4Address

    @pydantic.computed_field  # type: ignore[prop-decorator]
    @property
    def double(self) -> int:
        return 2 * self.x


def test_a_pydantic_dataclass_is_written_as_pydantic_dumps_it() -> None:
    point = Point(x=2, secret=pydantic.SecretStr("s"), where=ipaddress.IPv4Address("192.0.2.5"))
    assert written(point) == {
        "$class": f"{__name__}.Point",
        **json.loads(pydantic.TypeAdapter(Point).dump_json(point)),
    }
    assert written(point)["double"] == 4 and written(point)["secret"] == "**********"


def test_pydantic_values_alone_and_nested_in_plain_containers() -> None:
    secret = pydantic.SecretStr("s3cret")
    url = pydantic.HttpUrl("https://example.com")
    assert written({"s": secret, "u": [url], "m": (host(),)}) == {
        "s": "**********",
        "u": ["https://example.com/"],
        "m": [{"$class": f"{__name__}.Host", **json.loads(host().model_dump_json())}],
    }


class WithArray(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)

    values: np.ndarray  # type: ignore[type-arg]
    other: Any = None


def test_values_pydantic_does_not_know_come_back_to_the_codec() -> None:
    model = WithArray(values=np.arange(3), other={"ts": pd.Timestamp("2026-01-01")})
    assert written(model) == {
        "$class": f"{__name__}.WithArray",
        "values": [0, 1, 2],
        "other": {"ts": "2026-01-01T00:00:00"},
    }


class Failing(pydantic.BaseModel):
    x: int

    @pydantic.model_serializer
    def _boom(self) -> dict[str, Any]:
        raise ValueError("refuses to serialize")


def test_a_model_pydantic_cannot_serialize_is_marked() -> None:
    encoded = encode_event(
        ToolExecEnd(execution=TOOL, tool_call_id="c", name="x", details=Failing(x=1))
    )
    assert encoded is not None
    details = msgspec.json.decode(encoded.data)["details"]
    assert details["$flightlog"] == "unencodable"
    assert details["class"] == f"{__name__}.Failing"
    assert "refuses to serialize" in details["error"]
    assert encoded.markers[0].startswith(f"details: {__name__}.Failing (")


def test_an_unencodable_value_inside_a_model_is_marked_in_place() -> None:
    thing = object()
    encoded = encode_event(
        ToolExecEnd(
            execution=TOOL,
            tool_call_id="c",
            name="x",
            details=WithArray(values=np.zeros(1), other=thing),
        )
    )
    assert encoded is not None
    details = msgspec.json.decode(encoded.data)["details"]
    assert details["values"] == [0.0]
    assert details["other"]["$flightlog"] == "unencodable"
    assert details["other"]["class"] == "builtins.object"


# --- numpy ----------------------------------------------------------------------------------


def test_numpy_arrays_are_nested_lists_and_scalars_numbers() -> None:
    assert written(
        {
            "ints": np.arange(4).reshape(2, 2),
            "floats": np.array([1.5, np.nan, np.inf]),
            "bools": np.array([True, False]),
            "complex": np.array([1 + 2j]),
            "objects": np.array([{"a": 1}, None], dtype=object),
            "strings": np.array(["a", "b"]),
            "int64": np.int64(7),
            "float32": np.float32(0.5),
            "bool": np.bool_(True),
            "dates": np.array(["2026-01-01", "NaT"], dtype="datetime64[D]"),
            "stamp": np.datetime64("2026-01-01T00:00:00.000000001"),
            "span": np.timedelta64(90, "s"),
        }
    ) == {
        "ints": [[0, 1], [2, 3]],
        "floats": [1.5, None, None],
        "bools": [True, False],
        "complex": ["1+2j"],
        "objects": [{"a": 1}, None],
        "strings": ["a", "b"],
        "int64": 7,
        "float32": 0.5,
        "bool": True,
        "dates": ["2026-01-01", "NaT"],
        "stamp": "2026-01-01T00:00:00.000000001",
        "span": "90 seconds",
    }


# --- pandas ---------------------------------------------------------------------------------


def test_a_dataframe_is_written_with_its_columns_index_and_rows() -> None:
    frame = pd.DataFrame(
        {
            "city": ["Oslo", "Lima"],
            "temp": [-3.5, np.nan],
            "when": [pd.Timestamp("2026-01-01"), pd.NaT],
            "n": np.array([1, 2], dtype="int64"),
        },
        index=["a", "b"],
    )
    assert written(frame) == {
        "$class": f"{type(frame).__module__}.DataFrame",
        "columns": ["city", "temp", "when", "n"],
        "index": ["a", "b"],
        "data": [["Oslo", -3.5, "2026-01-01T00:00:00", 1], ["Lima", None, None, 2]],
    }
    # It is pandas' "split" orientation: pandas rebuilds the frame from it.
    split = {k: v for k, v in written(frame).items() if k != "$class"}
    rebuilt = pd.DataFrame(**split)
    assert rebuilt.shape == frame.shape and list(rebuilt.columns) == list(frame.columns)


def test_series_index_and_scalars() -> None:
    series = pd.Series([1.5, None], index=pd.Index([10, 20]), name="x")
    assert written(
        {
            "series": series,
            "index": pd.date_range("2026-01-01", periods=2, tz="UTC"),
            "naive": pd.Timestamp("2026-01-01T12:00:00"),
            "aware": pd.Timestamp("2026-01-01T12:00:00", tz="UTC"),
            "nanos": pd.Timestamp("2026-01-01T12:00:00.000000001"),
            "span": pd.Timedelta(seconds=90),
            "span_nanos": pd.Timedelta(nanoseconds=1),
            "nat": pd.NaT,
            "na": pd.NA,
            "categories": pd.Categorical(["a", "b", "a"]),
            "period": pd.Period("2026-01", freq="M"),
            "interval": pd.Interval(0, 1),
        }
    ) == {
        "series": {
            "$class": f"{type(series).__module__}.Series",
            "name": "x",
            "index": [10, 20],
            "data": [1.5, None],
        },
        "index": ["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"],
        "naive": "2026-01-01T12:00:00",
        "aware": "2026-01-01T12:00:00Z",
        "nanos": "2026-01-01T12:00:00.000000001",
        "span": "PT90S",
        "span_nanos": pd.Timedelta(nanoseconds=1).isoformat(),
        "nat": None,
        "na": None,
        "categories": ["a", "b", "a"],
        "period": "2026-01",
        "interval": "(0, 1]",
    }
    # Like a datetime and a timedelta.
    assert written(pd.Timestamp("2026-01-01", tz="UTC")) == written(
        datetime(2026, 1, 1, tzinfo=UTC)
    )
    assert written(pd.Timedelta(seconds=90)) == written(timedelta(seconds=90))


# --- never imported for values that are not theirs -------------------------------------------


def test_the_codec_imports_no_framework_for_other_values() -> None:
    script = textwrap.dedent(
        """
        import fractions, ipaddress, re, sys
        from flightlog.protocol import Execution, encode_event, encode_value
        from flightlog.protocol.events import ToolExecEnd

        class Thing:
            pass

        value = {
            "ip": ipaddress.ip_address("192.0.2.1"),
            "pattern": re.compile("a+"),
            "ratio": fractions.Fraction(1, 3),
            "complex": 1 + 2j,
            "thing": Thing(),
            "plain": [1, "x", None],
        }
        execution = Execution(id="t", kind="tool")
        encoded = encode_event(
            ToolExecEnd(execution=execution, tool_call_id="c", name="x", details=value)
        )
        assert encoded is not None and len(encoded.markers) == 1, encoded
        encode_value(value["ip"])
        loaded = sorted(
            name for name in ("pydantic", "pydantic_core", "numpy", "pandas")
            if name in sys.modules
        )
        print(loaded)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_a_pandas_object_without_data_of_its_own_is_marked() -> None:
    grouped = pd.DataFrame({"a": [1]}).groupby("a")
    encoded = encode_event(ToolExecEnd(execution=TOOL, tool_call_id="c", name="x", details=grouped))
    assert encoded is not None
    details = msgspec.json.decode(encoded.data)["details"]
    assert details["$flightlog"] == "unencodable"
    assert details["class"].endswith("DataFrameGroupBy")
    assert "has no JSON form" in details["error"]
