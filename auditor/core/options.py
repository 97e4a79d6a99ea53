"""Parsing of command-line values shared by the `audit` subcommands: integer and float lists with ranges
(``1:8``, ``0:60:10``), each bounded before it is expanded, with one-line errors naming what is valid."""

from __future__ import annotations

import math

from auditor.core.errors import AuditError

MAX_VALUES = 10_000  # longest list one option may expand to (a sweep of more units is a typo, not a plan)
MAX_SIZE = 1_000_000  # largest size (heads, context rows, widths, examples) a list option accepts
MAX_SEED = 2**63 - 1  # seeds are 64-bit: torch.manual_seed and int64 CSV columns hold them
MAX_STEPS = 10_000_000  # most optimisation steps (and steps between evaluations) a lab option accepts:
                        # 33x the paper's longest run


def _count(start: int, stop: int, step: int) -> int:
    """Length of ``range(start, stop + 1, step)`` without building it (``len`` overflows past 2**63)."""
    return max(0, (stop - start) // step + 1)


def parse_ints(
    text: str,
    option: str,
    *,
    low: int = -MAX_SEED,
    high: int = MAX_SEED,
    max_values: int = MAX_VALUES,
    unique: bool = True,
) -> list[int]:
    """``"1,2,4"`` or inclusive ranges ``"1:8"`` / ``"0:60:10"`` -> ints, duplicates dropped in order.

    Every value must lie in ``low .. high`` and the list may hold at most ``max_values`` values; both are
    checked before a range is expanded; ``unique=False`` keeps repeated values (a list with one value per
    item of another list). Raises AuditError (one line, naming ``option`` and what is
    valid) for anything else.
    """
    parts: list[tuple[int, int, int]] = []  # (start, stop, step), inclusive
    try:
        for part in (p.strip() for p in text.split(",")):
            if ":" in part:
                bits = [int(b) for b in part.split(":")]
                if len(bits) not in (2, 3) or (len(bits) == 3 and bits[2] < 1):
                    raise ValueError
                parts.append((bits[0], bits[1], bits[2] if len(bits) == 3 else 1))
            elif part:
                value = int(part)
                parts.append((value, value, 1))
    except ValueError:
        raise AuditError(
            f"{option} takes integers like 1,2,4 or ranges like 1:8 or 0:60:10; got {text!r}"
        ) from None
    total = 0
    for start, stop, step in parts:
        n = _count(start, stop, step)
        last = start + (n - 1) * step
        if n and (start < low or last > high):
            bad = start if start < low else last
            raise AuditError(f"{option} takes values in {low}..{high}; got {bad}")
        total += n
        if total > max_values:
            raise AuditError(
                f"{option} lists more than {max_values:,} values; give a shorter list or a coarser "
                f"range (e.g. 0:1000:10)"
            )
    values = [v for start, stop, step in parts for v in range(start, stop + 1, step)]
    if not values:
        raise AuditError(f"{option} lists no values; give e.g. 1,2,4")
    return list(dict.fromkeys(values)) if unique else values


def parse_sizes(text: str, option: str, *, unique: bool = True) -> list[int]:
    """A list of sizes (heads, context rows, widths, examples): integers in 1 .. MAX_SIZE."""
    return parse_ints(text, option, low=1, high=MAX_SIZE, unique=unique)


def parse_seeds(text: str, option: str, *, unique: bool = True) -> list[int]:
    """A list of seeds: integers in 0 .. 2**63 - 1."""
    return parse_ints(text, option, low=0, high=MAX_SEED, unique=unique)


def parse_steps(text: str, option: str, *, unique: bool = True) -> list[int]:
    """A list of step counts: integers in 1 .. MAX_STEPS."""
    return parse_ints(text, option, low=1, high=MAX_STEPS, unique=unique)


def parse_floats(
    text: str, option: str, *, positive: bool = False, max_values: int = MAX_VALUES, unique: bool = True
) -> list[float]:
    """``"1e-2,3e-2"`` -> finite floats (``positive``: each > 0), duplicates dropped in order (kept with
    ``unique=False``)."""
    try:
        values = [float(p) for p in (p.strip() for p in text.split(",")) if p]
    except ValueError:
        raise AuditError(f"{option} takes comma-separated numbers like 1e-2,3e-2; got {text!r}") from None
    if not values:
        raise AuditError(f"{option} lists no values; give e.g. 1e-2,3e-2")
    if len(values) > max_values:
        raise AuditError(f"{option} lists more than {max_values:,} values; give a shorter list")
    for value in values:
        if not math.isfinite(value) or (positive and value <= 0):
            raise AuditError(f"{option} takes {'positive ' if positive else ''}finite numbers; got {value}")
    return list(dict.fromkeys(values)) if unique else values
