"""Arguments of the public surface checked in one place, each error naming the argument,
the value it got and the range it accepts (a late TypeError deep in NumPy names none).

One rule everywhere: an integer is any `numbers.Integral` (numpy's int64 too) but never a
bool (`rank=True` is not rank 1) nor a float (`rank=1.5` is not rank 1); a number (a
weight) is any finite real (numpy's float32 too) but never a bool. Standard library only
(numpy's types are told by their registration in `numbers` and their dtype), so the
layout formulas the dashboard shares check their arguments here too.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Collection
from fractions import Fraction
from numbers import Integral, Real
from typing import Any

SEED_LIMIT = 2**64  # seeds are 64-bit: [0, 2**64)
COUNT_LIMIT = 2**63  # counts a state holds (G, epoch, steps) are int64: [0, 2**63)
# A global step a user names (a schedule's, set_weights's, a skipped range's) lies below
# 2**40 (~1.1e12 steps, beyond any run): refused where it is given, before a step no run
# reaches can make a count walk towards it or overflow the kernels' int64 step arithmetic.
STEP_LIMIT = 2**40


def _is_bool(value: Any) -> bool:
    """A bool, Python's or numpy's (np.bool_ is no `numbers` type; its dtype kind is "b")."""
    return isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", None) == "b"


def is_integer(value: Any) -> bool:
    """An integer by the one rule: `numbers.Integral` (numpy's too), never a bool."""
    return isinstance(value, Integral) and not _is_bool(value)


def _shown(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def integer(name: str, value: Any, low: int, high: int | None = None) -> int:
    """`value` as an int in [low, high) (high None: no upper bound), else ValueError/TypeError."""
    span = f"[{low}, {high})" if high is not None else f">= {low}"
    if not is_integer(value):
        raise TypeError(f"{name} must be an integer {span}, got {_shown(value)}")
    number = int(value)
    if number < low or (high is not None and number >= high):
        raise ValueError(f"{name} must be an integer {span}, got {number}")
    return number


def step(name: str, value: Any, low: int) -> int:
    """`value` as a global step in [low, STEP_LIMIT), else ValueError/TypeError."""
    number = integer(name, value, low)
    if number >= STEP_LIMIT:
        raise ValueError(
            f"{name} must be a global step in [{low}, 2**40 = {STEP_LIMIT}), got {number}: "
            "no run reaches it, and steps that far would overflow the int64 step arithmetic"
        )
    return number


def fraction(name: str, value: Any, float_denominator: int = 10**6) -> Fraction:
    """`value` >= 0 as an exact Fraction: an integer or Fraction as given, a float (numpy's
    too) as the nearest fraction with a denominator up to `float_denominator` (0.7 -> 7/10)."""
    if _is_bool(value) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number >= 0, got {_shown(value)}")
    if isinstance(value, Integral | Fraction):
        out = Fraction(int(value)) if isinstance(value, Integral) else value
    else:
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        out = Fraction(number).limit_denominator(float_denominator)
        if number > 0 and out == 0:
            raise ValueError(
                f"{name}={value!r} is below {1 / float_denominator:g}; give the weights as integers"
            )
    if out < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return out


def optional_integer(name: str, value: Any, low: int, high: int | None = None) -> int | None:
    return None if value is None else integer(name, value, low, high)


def boolean(name: str, value: Any) -> bool:
    """A real bool (numpy's too): `shuffle="no"` would otherwise count as True."""
    if _is_bool(value) and not hasattr(value, "__len__"):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {_shown(value)}")


def seconds(name: str, value: Any) -> float | None:
    """A positive, finite number of seconds, or None (no limit)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise TypeError(f"{name} must be a positive number of seconds or None, got {_shown(value)}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value}")
    return float(value)


def callable_or_none(name: str, value: Any) -> Callable[..., Any] | None:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be a function or None, got {_shown(value)}")
    return value


def one_of(name: str, value: Any, choices: Collection[Any]) -> Any:
    if value not in choices:
        raise ValueError(f"{name}={value!r}; expected one of {list(choices)}")
    return value


def columns(value: Any) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not all(isinstance(c, str) for c in value):
        raise TypeError(f"columns must be a list of column names or None, got {_shown(value)}")
    return list(value)


def renamed(name: str, value: Any, old_name: str, kwargs: dict[str, Any]) -> tuple[str, Any]:
    """(the name the user wrote, its value) for an argument renamed from `old_name`, still
    accepted from `kwargs` with a warning: an error about its value must name the argument
    the user gave."""
    if old_name not in kwargs:
        return name, value
    old = kwargs.pop(old_name)
    if value is not None:
        raise ValueError(
            f"{old_name}={old!r} and {name}={value!r} were both given; {old_name} is the old "
            f"name of {name}: pass {name} only"
        )
    warnings.warn(f"{old_name} is now {name}", DeprecationWarning, stacklevel=3)
    return old_name, old
