"""Parameter checks for NURD's parts, with scikit-learn's wording but none of its private modules.

A part declares ``_parameter_constraints``, a name -> list of accepted forms, each an `Interval`, a
class (any instance of it), None, or ``BOOLEAN``; a value is accepted by any one form, and a refused
one raises `InvalidParameterError` saying "The 'name' parameter of Part must be ... Got ... instead.",
the message scikit-learn's ``validate_parameter_constraints`` gives for the same constraints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Literal

import numpy as np

BOOLEAN = "boolean"
"""The form that accepts ``bool`` and ``numpy.bool_`` (and not 0 or 1)."""


class InvalidParameterError(ValueError, TypeError):
    """A parameter of the wrong type or out of its range (a ValueError and a TypeError, as
    scikit-learn's error of that name)."""


@dataclass(frozen=True)
class Interval:
    """Numbers of ``kind`` (`numbers.Integral` or `numbers.Real`) between ``left`` and ``right`` (None:
    unbounded), ``closed`` on the "left", "right", "both" or "neither" side; NaN is never inside."""

    kind: type[Integral] | type[Real]
    left: float | None
    right: float | None
    closed: Literal["left", "right", "both", "neither"]

    def admits(self, value: Any) -> bool:
        if not isinstance(value, self.kind):
            return False
        number = float(value)
        if math.isnan(number):
            return False
        if self.left is not None:
            left_closed = self.closed in ("left", "both")
            if number < self.left or (number == self.left and not left_closed):
                return False
        if self.right is not None:
            right_closed = self.closed in ("right", "both")
            if number > self.right or (number == self.right and not right_closed):
                return False
        return True

    def __str__(self) -> str:
        integral = self.kind is Integral
        left: object = "-inf" if self.left is None else (self.left if integral else float(self.left))
        right: object = "inf" if self.right is None else (self.right if integral else float(self.right))
        opening = "[" if self.closed in ("left", "both") else "("
        closing = "]" if self.closed in ("right", "both") else ")"
        return f"{'an int' if integral else 'a float'} in the range {opening}{left}, {right}{closing}"


Constraint = Interval | type | str | None
"""One accepted form of a parameter (see the module docstring)."""


def _admits(form: Constraint, value: Any) -> bool:
    if form is None:
        return value is None
    if form == BOOLEAN:
        return isinstance(value, bool | np.bool_)
    if isinstance(form, Interval):
        return form.admits(value)
    assert isinstance(form, type), form
    return isinstance(value, form)


def _described(form: Constraint) -> str:
    if form is None:
        return "None"
    if form == BOOLEAN:
        return "an instance of 'bool' or an instance of 'numpy.bool'"
    if isinstance(form, Interval):
        return str(form)
    assert isinstance(form, type), form
    if form is Real:
        return "an instance of 'float'"
    if form is Integral:
        return "an instance of 'int'"
    if form.__module__ == "builtins":
        return f"an instance of {form.__qualname__!r}"
    return f"an instance of '{form.__module__}.{form.__qualname__}'"


def check_parameters(
    constraints: Mapping[str, Sequence[Constraint]], params: Mapping[str, Any], caller: str
) -> None:
    """Raise `InvalidParameterError` for the first of ``params`` that none of its forms in
    ``constraints`` accepts (a parameter without constraints is not checked)."""
    for name, value in params.items():
        forms = constraints.get(name)
        if forms is None or any(_admits(form, value) for form in forms):
            continue
        described = [_described(form) for form in forms]
        expected = described[0] if len(described) == 1 else f"{', '.join(described[:-1])} or {described[-1]}"
        raise InvalidParameterError(
            f"The {name!r} parameter of {caller} must be {expected}. Got {value!r} instead."
        )


def check_own_parameters(part: Any) -> None:
    """`check_parameters` on a scikit-learn style ``part``: its ``get_params(deep=False)`` against its
    class's ``_parameter_constraints``, named after its class."""
    check_parameters(type(part)._parameter_constraints, part.get_params(deep=False), type(part).__name__)
