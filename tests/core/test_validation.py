"""One definition of an integer, a number and a choice for every parameter check."""

import math

import numpy as np
import pytest

from dtg_gpu.core.validation import check_bool, check_choice, check_int, check_number, is_int, is_number


@pytest.mark.parametrize("x", [0, 3, -2, np.int64(5), np.int32(1)])
def test_integers_are_integers(x):
    assert is_int(x) and is_number(x)


@pytest.mark.parametrize("x", [True, False, 1.0, "1", None, np.bool_(True)])
def test_bools_floats_and_text_are_not_integers(x):
    assert not is_int(x)


def test_numbers_include_nan_and_floats_but_not_bools():
    assert is_number(math.nan) and is_number(np.float32(0.5)) and not is_number(True) and not is_number("0.5")


def test_check_int_names_the_parameter_and_the_value():
    assert check_int("timesteps", np.int64(3)) == 3 and type(check_int("timesteps", np.int64(3))) is int
    with pytest.raises(ValueError, match=r"^timesteps must be a positive integer, got True$"):
        check_int("timesteps", True)
    with pytest.raises(ValueError, match=r"^chunk_size must be a positive integer, got 0$"):
        check_int("chunk_size", 0)
    with pytest.raises(ValueError, match=r"^k must be an integer in \[2, 5\], got 6$"):
        check_int("k", 6, minimum=2, maximum=5)


def test_check_number_bounds():
    assert check_number("alpha", 1, low=0, high=1) == 1.0
    for bad in (0, 1.5, math.nan, math.inf, True, "0.5"):
        with pytest.raises(ValueError, match="alpha must be a finite number"):
            check_number("alpha", bad, low=0, high=1)
    assert check_number("x", 0, low=0, open_low=False) == 0.0


def test_check_bool_and_choice():
    assert check_bool("strict", np.bool_(True)) is True
    with pytest.raises(ValueError, match="strict must be True or False, got 1"):
        check_bool("strict", 1)
    assert check_choice("method", "auto", ("auto", "lanczos")) == "auto"
    with pytest.raises(ValueError, match="method must be one of 'auto', 'lanczos', got 'power'"):
        check_choice("method", "power", ("auto", "lanczos"))
