"""accel._base.parse: the validators shared by the command line, config files, ACCEL_* and the API."""

from __future__ import annotations

import pytest

from accel._base.parse import (
    FALSE_WORDS,
    TRUE_WORDS,
    is_true,
    parse_bool,
    parse_choice,
    parse_float,
    parse_gpu_ids,
    parse_int,
)


@pytest.mark.parametrize("value,kwargs,expected", [
    ("4", {"minimum": 1}, 4), (" 8 ", {}, 8), (0, {"minimum": 0}, 0), ("-3", {}, -3),
    (65535, {"minimum": 0, "maximum": 65535}, 65535), (7, {"strict": True}, 7),
])
def test_parse_int_accepts(value: object, kwargs: dict[str, object], expected: int) -> None:
    assert parse_int(value, name="n", **kwargs) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("value,kwargs,message", [
    ("-2", {"minimum": 1}, "n must be an integer >= 1, got '-2'"),
    ("many", {"minimum": 1}, "n must be an integer >= 1, got 'many'"),
    ("2.0", {}, "n must be an integer, got '2.0'"),
    (2.0, {}, "n must be an integer, got 2.0"),
    (True, {}, "n must be an integer, got True"),  # a bool is not the 1 the user meant
    ("2", {"strict": True, "minimum": 1}, "n must be an integer >= 1, got '2'"),
    (70000, {"minimum": 0, "maximum": 65535}, "n must be an integer in [0, 65535], got 70000"),
    (11, {"maximum": 10}, "n must be an integer <= 10, got 11"),
    (None, {}, "n must be an integer, got None"),
])
def test_parse_int_refuses_with_what_was_found_and_expected(
        value: object, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_int(value, name="n", **kwargs)  # type: ignore[arg-type]
    assert str(err.value) == message


def test_messages_without_a_name_and_with_a_noun_and_a_hint() -> None:
    with pytest.raises(ValueError, match=r"^must be a port in \[0, 65535\], got '70000'$"):
        parse_int("70000", name="", minimum=0, maximum=65535, what="a port")
    with pytest.raises(ValueError, match="got 0; pass 1 or more$"):
        parse_int(0, name="steps", minimum=1, hint="pass 1 or more")
    with pytest.raises(ValueError, match=r"^t must be a number of seconds > 0, got 'soon'$"):
        parse_float("soon", name="t", above=0, what="a number of seconds")


@pytest.mark.parametrize("value,kwargs,ok", [
    ("2.5", {"above": 0}, 2.5), (3, {}, 3.0), ("0", {"minimum": 0}, 0.0),
    ("0", {"above": 0}, None), ("-1", {"minimum": 0}, None), ("nan", {}, None),
    ("inf", {}, None), (True, {}, None), ("1.5", {"strict": True}, None),
    (1.5, {"maximum": 1}, None),
])
def test_parse_float(value: object, kwargs: dict[str, object], ok: float | None) -> None:
    if ok is None:
        with pytest.raises(ValueError, match=f"got {value!r}"):
            parse_float(value, name="x", **kwargs)  # type: ignore[arg-type]
    else:
        assert parse_float(value, name="x", **kwargs) == ok  # type: ignore[arg-type]


def test_parse_bool_and_is_true() -> None:
    assert all(parse_bool(word.upper(), name="b") for word in TRUE_WORDS)
    assert not any(parse_bool(f" {word} ", name="b") for word in FALSE_WORDS)
    assert parse_bool(True, name="b", strict=True) is True
    assert parse_bool("", name="b", empty=False) is False
    for bad, kwargs in (("maybe", {}), ("", {}), (1, {}), ("yes", {"strict": True})):
        with pytest.raises(ValueError, match=r"b must be true or false .* got"):
            parse_bool(bad, name="b", **kwargs)  # type: ignore[arg-type]
    assert is_true(" On") and not is_true("maybe") and not is_true("")


def test_parse_choice() -> None:
    assert parse_choice(" BF16 ", name="mp", choices=("no", "fp16", "bf16")) == "bf16"
    assert parse_choice("gpu", name="device", choices=("cpu", "cuda"), aliases={"gpu": "cuda"}) == "cuda"
    with pytest.raises(ValueError, match=r"^device='tpu9' is not a device kind; expected one "
                                         r"of cpu, cuda$"):
        parse_choice("tpu9", name="device", choices=("cpu", "cuda"), what="a device kind")


def test_parse_gpu_ids() -> None:
    assert parse_gpu_ids(" 0, 2,", "ids") == "0,2"
    assert parse_gpu_ids(3, "ids") == "3"
    assert parse_gpu_ids("ALL", "ids") is None
    for bad in ("", "0,x", "-1", "GPU-8f1c"):
        with pytest.raises(ValueError, match="ids must be comma-separated GPU indices"):
            parse_gpu_ids(bad, "ids")


