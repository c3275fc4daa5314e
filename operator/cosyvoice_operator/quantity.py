"""Kubernetes resource quantities ("500m", "4Gi", "1e3") as exact decimals.

The API server rewrites quantities into canonical form ("1000m" → "1"), so comparing a desired
manifest with a live object needs numeric comparison, and counting allocatable devices needs numbers.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIX = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}
_RE = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")


def parse(value: int | float | str) -> Decimal:
    """Parse a quantity; raises ValueError for anything Kubernetes would reject."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    match = _RE.match(value.strip())
    if match is None:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number) * (Decimal(10) ** int(suffix[1:]))
        return Decimal(number) * _SUFFIX[suffix]
    except InvalidOperation as exc:  # pragma: no cover - the regex already guards this
        raise ValueError(f"not a quantity: {value!r}") from exc


def equal(a: object, b: object) -> bool:
    """Numeric equality for two quantities; plain equality when either is not a quantity."""
    if a == b:
        return True
    if isinstance(a, (int, float, str)) and isinstance(b, (int, float, str)):
        try:
            return parse(a) == parse(b)
        except ValueError:
            return False
    return False


def count(value: object) -> int:
    """Whole devices in an extended-resource quantity (allocatable ``nvidia.com/gpu`` etc.); 0 if unreadable."""
    if not isinstance(value, (int, float, str)):
        return 0
    try:
        return int(parse(value))
    except ValueError:
        return 0
