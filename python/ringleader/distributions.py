"""A search's parameter distributions as plain objects that write the search spec's
`[[search.params]]` tables (docs/book/src/guide/searches.md).

    ringleader.loguniform(1e-4, 1.0).to_spec("lr")
    # {'name': 'lr', 'type': 'double', 'min': 0.0001, 'max': 1.0, 'scale': 'log'}

`search_params({"lr": loguniform(1e-4, 1), "layers": [1, 2, 3]})` writes the whole list; a
plain list is a grid's values (`discrete` when every value is a number, else
`categorical`). `Client.submit` calls it when `search.params` is a dict.
"""

import numbers
from collections.abc import Iterable, Mapping
from typing import Any

SpecTable = dict[str, Any]
"""One `[[search.params]]` table."""


class Distribution:
    """A parameter's values; `to_spec(name)` is its `[[search.params]]` table."""

    def to_spec(self, name: str) -> SpecTable:
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)


class _Range(Distribution):
    _type = "double"
    _scale = "linear"

    def __init__(self, low: float, high: float) -> None:
        if not low < high:
            raise ValueError(f"{type(self).__name__}: low must be below high ({low} ≥ {high})")
        self.low, self.high = low, high

    def to_spec(self, name: str) -> SpecTable:
        return {"name": name, "type": self._type, "min": self.low, "max": self.high,
                "scale": self._scale}


class uniform(_Range):  # noqa: N801  (named like random.uniform and Ray Tune's)
    """A double drawn uniformly from [low, high]."""

    def __init__(self, low: float, high: float) -> None:
        super().__init__(float(low), float(high))


class loguniform(_Range):  # noqa: N801
    """A double drawn uniformly in log space from [low, high] (both > 0)."""

    _scale = "log"

    def __init__(self, low: float, high: float) -> None:
        if not low > 0:
            raise ValueError(f"loguniform: low must be > 0 (got {low})")
        super().__init__(float(low), float(high))


class randint(_Range):  # noqa: N801
    """An integer from low to high, both included (the search spec's `integer`)."""

    _type = "integer"

    def __init__(self, low: int, high: int) -> None:
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                   for v in (low, high)):
            raise TypeError(f"randint: low and high are integers (got {low!r}, {high!r})")
        super().__init__(int(low), int(high))


class choice(Distribution):  # noqa: N801
    """One of `values` (numbers, strings, lists): the search spec's `categorical`."""

    def __init__(self, values: Iterable[Any]) -> None:
        values = list(values)
        if not values:
            raise ValueError("choice: at least one value")
        self.values = values

    def to_spec(self, name: str) -> SpecTable:
        return {"name": name, "type": "categorical", "values": self.values}


def _is_number(v: object) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def search_params(params: Mapping[str, Any]) -> list[SpecTable]:
    """`{name: Distribution or list}` as the list of `[[search.params]]` tables; a list is a
    grid's values (`discrete` if all are numbers, else `categorical`)."""
    out: list[SpecTable] = []
    for name, p in params.items():
        if isinstance(p, Distribution):
            out.append(p.to_spec(name))
        elif isinstance(p, (list, tuple)):
            if not p:
                raise ValueError(f"search.params.{name}: no values")
            kind = "discrete" if all(_is_number(v) for v in p) else "categorical"
            out.append({"name": name, "type": kind, "values": list(p)})
        elif isinstance(p, dict):
            out.append({"name": name, **p})
        else:
            raise TypeError(f"search.params.{name}: a distribution or a list of values, "
                            f"not {type(p).__name__}")
    return out
