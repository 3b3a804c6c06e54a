"""A small TOML writer for job specs given as dicts (the API takes the spec's TOML text).

What it writes: strings, ints, floats, bools, lists of those (nested too), tables (dicts)
and arrays of tables (lists of dicts), so `tomllib.loads(dumps(d)) == d` for any such `d`.
None values are left out (TOML has no null). Anything else raises TypeError.
"""

import json
import math
import re
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: object) -> str:
    if not isinstance(k, str):
        raise TypeError(f"a TOML key must be a string, not {type(k).__name__}: {k!r}")
    return k if _BARE_KEY.match(k) else _string(k)


def _string(s: str) -> str:
    # JSON's escapes (\" \\ \n \t \uXXXX …) are TOML basic-string escapes too.
    return json.dumps(s, ensure_ascii=False)


def _is_table_array(v: object) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(isinstance(x, dict) for x in v)


def _value(v: object, where: list[object]) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x, where) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        items = [f"{_key(k)} = {_value(x, where + [k])}" for k, x in v.items() if x is not None]
        return "{" + ", ".join(items) + "}"
    if hasattr(v, "to_spec"):
        raise TypeError(f"{'.'.join(map(str, where))}: a distribution belongs in search.params")
    raise TypeError(f"{'.'.join(map(str, where))}: no TOML for {type(v).__name__} {v!r}")


def _table(d: dict[str, Any], path: list[object], out: list[str]) -> None:
    plain = [(k, v) for k, v in d.items() if v is not None and not isinstance(v, dict)
             and not _is_table_array(v)]
    for k, v in plain:
        out.append(f"{_key(k)} = {_value(v, path + [k])}")
    for k, v in d.items():
        if isinstance(v, dict):
            out.append("")
            out.append("[" + ".".join(_key(p) for p in path + [k]) + "]")
            _table(v, path + [k], out)
        elif _is_table_array(v):
            for item in v:
                out.append("")
                out.append("[[" + ".".join(_key(p) for p in path + [k]) + "]]")
                # Inside an array of tables, sub-tables are written inline.
                for ik, iv in item.items():
                    if iv is not None:
                        out.append(f"{_key(ik)} = {_value(iv, path + [k, ik])}")


def dumps(d: dict[str, Any]) -> str:
    """`d` (a dict) as TOML text."""
    if not isinstance(d, dict):
        raise TypeError(f"a spec is a dict, not {type(d).__name__}")
    out: list[str] = []
    _table(d, [], out)
    return "\n".join(out).lstrip("\n") + "\n"
