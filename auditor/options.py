"""Parsing of command-line values shared by the `audit` subcommands."""

from __future__ import annotations

from auditor.errors import AuditError


def parse_ints(text: str, option: str) -> list[int]:
    """``"1,2,4"`` or inclusive ranges ``"1:8"`` / ``"0:60:10"`` -> ints, duplicates dropped in order.

    Raises AuditError (one line, naming ``option`` and what is valid) for anything else.
    """
    values: list[int] = []
    try:
        for part in (p.strip() for p in text.split(",")):
            if ":" in part:
                bits = [int(b) for b in part.split(":")]
                if len(bits) not in (2, 3) or (len(bits) == 3 and bits[2] < 1):
                    raise ValueError
                values.extend(range(bits[0], bits[1] + 1, bits[2] if len(bits) == 3 else 1))
            elif part:
                values.append(int(part))
    except ValueError:
        raise AuditError(f"{option} takes integers like 1,2,4 or ranges like 1:8 or 0:60:10; got {text!r}") from None
    if not values:
        raise AuditError(f"{option} lists no values; give e.g. 1,2,4")
    return list(dict.fromkeys(values))
