"""Where the division by N goes in an fp16 average: overflow against underflow (lesson 07)."""

import math

import pytest

from syncedu.compress.cast import fp16_sum_average


def test_sum_first_overflows_divide_first_underflows_sqrt_split_keeps_both():
    n = 64
    assert math.isinf(fp16_sum_average([2000.0] * n, 1.0))        # 128,000 > 65,504
    assert fp16_sum_average([1e-6] * n, float(n)) == 0.0           # 1.6e-8 < 6e-8 / 2
    for v in (2000.0, 1e-6):
        assert abs(fp16_sum_average([v] * n, math.sqrt(n)) - v) < 0.1 * v


def test_exact_where_fp16_is_exact():
    assert fp16_sum_average([1.0, 3.0], 1.0) == fp16_sum_average([1.0, 3.0], 2.0) == 2.0


@pytest.mark.parametrize("values, pre, word", [([], 1.0, "values"), ([1.0], 0.0, "predivide")])
def test_bad_input_names_the_parameter(values, pre, word):
    with pytest.raises(ValueError, match=word):
        fp16_sum_average(values, pre)
