"""Constructor arguments checked once, at construction, each error naming the argument,
the value it got and the range it accepts (a late TypeError deep in NumPy names none)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Collection
from numbers import Integral, Real
from typing import Any

import numpy as np

SEED_LIMIT = 2**64  # seeds are 64-bit: [0, 2**64)
COUNT_LIMIT = 2**63  # counts a state holds (G, epoch, steps) are int64: [0, 2**63)


def _shown(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def integer(name: str, value: Any, low: int, high: int | None = None) -> int:
    """`value` as an int in [low, high) (high None: no upper bound), else ValueError/TypeError."""
    span = f"[{low}, {high})" if high is not None else f">= {low}"
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer {span}, got {_shown(value)}")
    number = int(value)
    if number < low or (high is not None and number >= high):
        raise ValueError(f"{name} must be an integer {span}, got {number}")
    return number


def optional_integer(name: str, value: Any, low: int, high: int | None = None) -> int | None:
    return None if value is None else integer(name, value, low, high)


def boolean(name: str, value: Any) -> bool:
    """A real bool (numpy's too): `shuffle="no"` would otherwise count as True."""
    if isinstance(value, bool | np.bool_):
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
