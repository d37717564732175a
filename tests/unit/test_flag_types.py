"""The shared flag parsers: what each console script refuses, and how it says so."""

from __future__ import annotations

import argparse
import re

import pytest

from narwhal.core.flag_types import increasing_ints, number


@pytest.mark.parametrize(("text", "said"), [
    ("nan", "must be above 0 and at most 3600"), ("inf", "must be above 0 and at most 3600"),
    ("0", "must be above 0"), ("-1", "must be above 0"), ("3600.5", "at most 3600"),
    ("ten", "'ten' is not a number"), ("", "'' is not a number"),
])
def test_seconds_outside_the_range_or_not_numbers_are_refused_with_the_range(text: str, said: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=said):
        number(float, 0, 3600, above_low=True)(text)


def test_bounds_are_inclusive_unless_above_low() -> None:
    assert number(float, 0, 10)("0") == 0.0 and number(float, 0, 10)("10") == 10.0
    assert number(int, 8, 100)("8") == 8
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape("'1.5' is not a whole number")):
        number(int, 1, 10)("1.5")
    with pytest.raises(argparse.ArgumentTypeError, match="7 must be at least 8"):
        number(int, 8, 100)("7")


def test_increasing_lists_take_spaces_and_refuse_repeats_or_disorder() -> None:
    parse = increasing_ints()
    assert parse("64, 128,256") == (64, 128, 256)
    for bad, said in (("256,128", "strictly increasing"), ("64,64", "strictly increasing"),
                      (",", "at least one number"), ("0,2", "0 must be at least 1"),
                      ("1,x", "'x' is not a whole number")):
        with pytest.raises(argparse.ArgumentTypeError, match=said):
            parse(bad)
