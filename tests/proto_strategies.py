"""Hypothesis strategies built from protobuf message descriptors, for fuzzing the gRPC services.

:func:`messages` walks ``DESCRIPTOR.fields`` and draws a value for every field: integers over
the whole range of their type (negatives and huge values included) but biased towards small ones
(token ids, k, ...) so that requests also get past validation; doubles with nan, +-inf, -0.0,
subnormals and huge values; strings empty, unicode or very long; repeated fields of 0..N items
and now and then a long list; nested messages; enums including unknown numeric values (proto3
enums are open); optional fields present or absent; at most one member of each oneof.

:func:`malformed_payloads` draws raw request bytes that may not decode: garbage, a valid
message cut short, a valid message with flipped bytes, a string field holding invalid UTF-8.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
UINT32 = (0, 2**32 - 1)
UINT64 = (0, 2**64 - 1)
_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: INT32,
    FieldDescriptor.TYPE_SINT32: INT32,
    FieldDescriptor.TYPE_SFIXED32: INT32,
    FieldDescriptor.TYPE_INT64: INT64,
    FieldDescriptor.TYPE_SINT64: INT64,
    FieldDescriptor.TYPE_SFIXED64: INT64,
    FieldDescriptor.TYPE_UINT32: UINT32,
    FieldDescriptor.TYPE_FIXED32: UINT32,
    FieldDescriptor.TYPE_UINT64: UINT64,
    FieldDescriptor.TYPE_FIXED64: UINT64,
}
SPECIAL_DOUBLES = (
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    1e-3,
    math.nan,
    math.inf,
    -math.inf,
    5e-324,  # the smallest subnormal
    2.2250738585072014e-308,  # the smallest normal
    1e-300,
    1e300,
    1.7976931348623157e308,  # the largest finite double
    -1.7976931348623157e308,
    float(2**63),
)
SPECIAL_STRINGS = ("", " ", "a", "\x00", "\n\n\n", "é", "😀", "\ud7ff\ue000", "x" * 70_000)


def integers(field: FieldDescriptor, small_max: int = 600) -> st.SearchStrategy[int]:
    """The field's whole range, its edges, and (mostly) small values such as token ids."""
    lo, hi = _INT_RANGES[field.type]
    edges = [
        v for v in sorted({lo, hi, 0, 1, -1, lo + 1, hi - 1, 2**31 - 1, 2**31}) if lo <= v <= hi
    ]
    return st.one_of(
        st.integers(max(lo, 0), min(hi, small_max)),
        st.sampled_from(edges),
        st.integers(lo, hi),
    )


def doubles() -> st.SearchStrategy[float]:
    return st.one_of(
        st.floats(0.0, 2.0),
        st.sampled_from(SPECIAL_DOUBLES),
        st.floats(allow_nan=True, allow_infinity=True),
    )


def strings() -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=40),
        st.sampled_from(SPECIAL_STRINGS),
        st.text(st.characters(codec="utf-8"), min_size=200, max_size=3000),
    )


def scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    """A value for one (non-repeated) scalar, enum or message field."""
    t = field.type
    if t in _INT_RANGES:
        return integers(field)
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return doubles()
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_STRING:
        return strings()
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(*INT32))  # proto3 enums are open
    if t == FieldDescriptor.TYPE_MESSAGE:
        return st.deferred(lambda: messages(field.message_type))
    raise NotImplementedError(f"field type {t} of {field.full_name}")


def repeated(field: FieldDescriptor, max_items: int = 8, long_items: int = 3000):
    """0..max_items values, and now and then a long list (for scalar fields)."""
    item = scalar(field)
    short = st.lists(item, max_size=max_items)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return short
    if field.type in _INT_RANGES:
        # Long lists draw from a fast strategy: uniform small ints or one repeated value.
        lo, hi = _INT_RANGES[field.type]
        long_list = st.one_of(
            st.integers(0, long_items).flatmap(
                lambda n: st.integers(max(lo, 0), min(hi, 600)).map(lambda v: [v] * n)
            ),
            st.builds(
                lambda n, seed: [(seed * 7919 + i * 104729) % 600 for i in range(n)],
                st.integers(0, long_items),
                st.integers(0, 10**6),
            ),
        )
    else:  # short items: a long list of 70,000-character strings would be hundreds of MB
        short_item = st.text(max_size=20) if field.type == FieldDescriptor.TYPE_STRING else item
        long_list = st.builds(lambda n, v: [v] * n, st.integers(0, long_items), short_item)
    return st.one_of(short, short, short, long_list)


def _is_optional(field: FieldDescriptor) -> bool:
    return field.has_presence and field.containing_oneof is None


@st.composite
def messages(draw: st.DrawFn, descriptor: Descriptor, depth: int = 0) -> Message:
    """A message of `descriptor`'s type with random contents (see the module docstring)."""
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(descriptor)
    msg = cls()
    for field in descriptor.fields:
        if field.containing_oneof is not None:
            continue
        is_repeated = (
            field.is_repeated
            if hasattr(field, "is_repeated")
            else field.label == FieldDescriptor.LABEL_REPEATED
        )
        if is_repeated:
            values = draw(repeated(field) if depth < 2 else st.just([]))
            container = getattr(msg, field.name)
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                for value in values:
                    container.add().CopyFrom(value)
            else:
                container.extend(values)
            continue
        has_presence = _is_optional(field) or field.type == FieldDescriptor.TYPE_MESSAGE
        if has_presence and not draw(st.booleans()):
            continue  # presence off
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth >= 3:
                continue
            getattr(msg, field.name).CopyFrom(draw(messages(field.message_type, depth + 1)))
        else:
            setattr(msg, field.name, draw(scalar(field)))
    for oneof in descriptor.oneofs:
        choice = draw(st.sampled_from([None, *oneof.fields]))
        if choice is None:
            continue
        if choice.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(msg, choice.name).CopyFrom(draw(messages(choice.message_type, depth + 1)))
        else:
            setattr(msg, choice.name, draw(scalar(choice)))
    return msg


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _string_fields(descriptor: Descriptor) -> list[int]:
    return [f.number for f in descriptor.fields if f.type == FieldDescriptor.TYPE_STRING]


@st.composite
def malformed_payloads(draw: st.DrawFn, descriptor: Descriptor) -> bytes:
    """Raw request bytes for `descriptor`'s type, most of which do not decode."""
    valid = draw(messages(descriptor)).SerializeToString()
    kind = draw(st.sampled_from(["garbage", "truncated", "flipped", "bad_utf8", "bad_tag"]))
    if kind == "garbage":
        return draw(st.binary(min_size=1, max_size=256))
    if kind == "truncated" and len(valid) > 1:
        return valid[: draw(st.integers(1, len(valid) - 1))]
    if kind == "flipped" and valid:
        data = bytearray(valid)
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        return bytes(data)
    if kind == "bad_utf8":
        numbers = _string_fields(descriptor) or [1]
        number = draw(st.sampled_from(numbers))
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"ok\x80"]))
        return valid + _varint(number << 3 | 2) + _varint(len(bad)) + bad
    # A length-delimited field whose length runs past the end, or a field number of 0.
    return draw(
        st.sampled_from(
            [
                valid + _varint(1 << 3 | 2) + _varint(1000) + b"ab",
                valid + b"\x00\x01",
                valid + _varint(2 << 3 | 7),  # wire type 7 does not exist
                valid + struct.pack("<B", 0x80) * 11,  # a varint longer than 10 bytes
            ]
        )
    )
