"""Formulas as text: ``"4NC² + 2N²C"`` shown with its symbol values, and evaluated to a number
(tests check that each backend's text evaluates to its ``flops()``)."""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Optional

_SUPERSCRIPTS = {"²": 2, "³": 3, "⁴": 4}
_FUNCTIONS = {"log₂": math.log2, "log2": math.log2, "log": math.log2, "ln": math.log, "sqrt": math.sqrt, "√": math.sqrt,
              "ceil": math.ceil, "floor": math.floor, "min": min, "max": max}


def with_symbols(formula: str, symbols: Mapping[str, Any]) -> str:
    """``"4NC² + 2N²C"`` -> ``"4NC² + 2N²C  (N=197, C=384, h=6)"``."""
    values = ", ".join(f"{k}={v}" for k, v in symbols.items())
    return f"{formula}  ({values})" if values else formula


def evaluate_formula(formula: str, symbols: Mapping[str, Any]) -> Optional[float]:
    """Best-effort numeric value of a formula text such as ``"4NC² + 2M²NC"`` or ``"5/2·NC·log₂(NC)"``.

    Juxtaposition is multiplication; names are matched longest first against ``symbols`` (so
    ``"NC"`` is ``N·C`` and a symbol named ``"w²"`` or ``"n_b"`` is one name); ``log``/``log₂`` is
    base 2. Returns None when the text uses a name ``symbols`` does not define or does not parse.
    """
    text = formula.replace("·", "*").replace("×", "*").replace("−", "-").replace("⌈", "ceil(").replace("⌉", ")")
    text = text.replace("⌊", "floor(").replace("⌋", ")")
    names = sorted((str(k) for k in symbols), key=len, reverse=True)
    functions = sorted(_FUNCTIONS, key=len, reverse=True)
    tokens: list[tuple[str, str]] = []  # (kind, python text)
    pos = 0
    while pos < len(text):
        rest = text[pos:]
        if rest[0].isspace():
            pos += 1
            continue
        fn = next((f for f in functions if rest.startswith(f) and rest[len(f):].lstrip().startswith("(")), None)
        name = next((n for n in names if rest.startswith(n)), None)
        number = re.match(r"\d+(\.\d+)?", rest)
        if fn:
            tokens.append(("fn", f"F[{fn!r}]"))
            pos += len(fn)
        elif name:
            tokens.append(("value", f"S[{name!r}]"))
            pos += len(name)
        elif number:
            tokens.append(("value", number.group(0)))
            pos += number.end()
        elif rest[0] in _SUPERSCRIPTS:
            tokens.append(("power", f"**{_SUPERSCRIPTS[rest[0]]}"))
            pos += 1
        elif rest.startswith("**") or rest.startswith("^"):
            tokens.append(("op", "**"))
            pos += 2 if rest.startswith("**") else 1
        elif rest[0] in "+-*/,":
            tokens.append(("op", rest[0]))
            pos += 1
        elif rest[0] in "([":
            tokens.append(("open", "("))
            pos += 1
        elif rest[0] in ")]":
            tokens.append(("close", ")"))
            pos += 1
        else:
            return None
    expr: list[str] = []
    previous = ""
    for kind, tok in tokens:  # implicit multiplication: "2N²C", "N(a + b)", "(a)(b)", "2log(N)"
        if previous in ("value", "close", "power") and kind in ("value", "fn", "open"):
            expr.append("*")
        expr.append(tok)
        previous = kind
    try:
        return float(eval("".join(expr), {"__builtins__": {}}, {"S": dict(symbols), "F": _FUNCTIONS}))  # noqa: S307
    except Exception:  # noqa: BLE001 - best effort: the text is written for humans
        return None
