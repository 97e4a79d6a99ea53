"""The rows of an audit: their columns, their types in Python and their text form in ``results.csv``.

:class:`Row` declares the columns, in order, with their types; the lists below are generated from it.

In memory (the DataFrame ``auditor.audit_model`` returns) a row is typed: counts are nullable integers
(``Int64``: ``k``, ``N``, ``n``, ``d``, ``subsets``, ``seed``), flags nullable booleans
(``share_meets_threshold``, ``exhaustive``, ``first``), ``rank_counts`` a ``{rank: count}`` dict and
``witness`` a list of example indices (None when no subset was found dependent). Skipped rows hold ``<NA>``
where nothing was measured.

Each tested row says two things, in this order. ``statement``: the strict statement of the assumption at the
row's rtol (for a Kruskal test "Kruskal rank >= k", for Assumption 2 "every context has rank n") is
``refuted`` (a witness disproves it: a dependent k-subset, a certified upper bound below k, a rank-deficient
context), ``proven`` (the certified lower bound ``krank_lower`` >= k, every k-subset enumerated full rank,
every context of rank n) or ``not decided`` (sampling found no dependent subset, and nothing proves there is
none). ``share_meets_threshold``: whether the share of full-rank subsets (rank-n contexts), ``fraction``,
reaches ``threshold``; a share can meet its threshold while a witness refutes the statement.
Files written before these columns had ``holds`` (the same flag as ``share_meets_threshold``):
:func:`read_rows` maps it and derives ``statement`` from the row (:func:`statement_of`).

In ``results.csv`` the histogram is written ``rank:count;rank:count`` and the witness as space-separated
indices, so a report stays readable as text; :func:`read_rows` turns such a file back into typed rows.
``rtol`` is the relative rank tolerance a row was judged at (a singular value counts when it exceeds
``rtol x sigma_max``).

``critical_rtol_exact`` says whether ``critical_rtol`` is known to within its bracket
``[critical_rtol_low, critical_rtol_high]`` (True) or only bounded by it (False); files written before the
column read it from the bracket (:func:`probes.robust.critical_is_exact`). ``exhaustive``: every subset
was enumerated and tested; ``spectrum_proof``: every subset is proven dependent at once by the spectrum of
the whole pool (only a sample was decomposed). Geometry columns come raw and mean-centred (``*_centred``).
``dtype`` is the dtype the tokens were computed in, ``weights_dtype`` the dtype the weights were held in
before they were cast to it (a checkpoint's stored dtype; for random weights the dtype they were initialised
in, float32); files written before ``weights_dtype`` read it as missing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import pandas as pd

from auditor.audit.report.catalogue import TEST_COLUMNS, TEST_SPECS

_GEOMETRY = {"geometry": True}  # the token geometry of a row's vectors, raw and mean-centred


@dataclass
class Row:
    """One row of ``results.csv``: its fields are the columns, in their order, with their types in memory
    (every one may be missing: None). The schema is generated from it: :data:`COLUMNS`, :data:`INT_COLUMNS`,
    :data:`BOOL_COLUMNS`, :data:`FLOAT_COLUMNS`, :data:`GEOMETRY_COLUMNS`; a column that an assumption test
    declares (:mod:`auditor.audit.report.catalogue`) and the row lacks joins after the bounds.

    :meth:`of` types one record; ``dataclasses.asdict`` gives it back as a record."""

    model: str | None = None
    representation: str | None = None
    layer: str | None = None
    weights: str | None = None
    test: str | None = None
    status: str | None = None
    k: int | None = None
    N: int | None = None
    n: int | None = None
    d: int | None = None
    statement: str | None = None
    fraction: float | None = None
    fraction_low: float | None = None
    fraction_high: float | None = None
    share_meets_threshold: bool | None = None
    threshold: float | None = None
    min_margin: float | None = None
    margin_bound: bool | None = None
    critical_rtol: float | None = None
    critical_rtol_low: float | None = None
    critical_rtol_high: float | None = None
    critical_rtol_exact: bool | None = None
    verdict_margin: float | None = None
    rtol_grid: dict[float, float] | None = None
    subsets: int | None = None
    exhaustive: bool | None = None
    spectrum_proof: bool | None = None
    rank_counts: dict[int, int] | None = None
    witness: list[int] | None = None
    krank_lower: int | None = None
    krank_lower_method: str | None = None
    krank_upper: int | None = None
    duplicates: int | None = None
    near_duplicates: int | None = None
    effective_rank: float | None = field(default=None, metadata=_GEOMETRY)
    stable_rank: float | None = field(default=None, metadata=_GEOMETRY)
    anisotropy: float | None = field(default=None, metadata=_GEOMETRY)
    collapse_residual: float | None = field(default=None, metadata=_GEOMETRY)
    effective_rank_centred: float | None = field(default=None, metadata=_GEOMETRY)
    stable_rank_centred: float | None = field(default=None, metadata=_GEOMETRY)
    anisotropy_centred: float | None = field(default=None, metadata=_GEOMETRY)
    rtol: float | None = None
    dtype: str | None = None
    weights_dtype: str | None = None
    device: str | None = None
    data_source: str | None = None
    data_counts: str | None = None
    first: bool | None = None
    data_fingerprint: str | None = None
    tokenizer: str | None = None
    seed: int | None = None
    seconds: float | None = None
    note: str | None = None
    git_commit: str | None = None
    versions: str | None = None

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> Row:
        """The typed row of a record (a dict the audit built, or a CSV line); columns it does not know are
        left out (:func:`rows_frame` keeps them after these), and an empty text is missing (None), as its CSV
        cell reads back."""
        typed = typed_record(record)
        return cls(**{name: typed[name] for name in _FIELDS
                      if name in typed and not _missing(typed[name]) and typed[name] != ""})


_FIELDS = {f.name: f for f in fields(Row)}
_KINDS = {name: str(f.type).removesuffix(" | None") for name, f in _FIELDS.items()}  # "int", "dict[int, int]"
GEOMETRY_COLUMNS = tuple(name for name, f in _FIELDS.items() if f.metadata.get("geometry"))
COLUMNS = list(_FIELDS)
# a column an assumption test declares (auditor.audit.report.catalogue) that the row does not have yet
# joins it after the bounds, so adding a test never needs an edit here
COLUMNS[COLUMNS.index("near_duplicates") + 1 : COLUMNS.index("near_duplicates") + 1] = [
    c for c in TEST_COLUMNS if c not in COLUMNS
]
INT_COLUMNS = tuple(name for name, kind in _KINDS.items() if kind == "int")
BOOL_COLUMNS = tuple(name for name, kind in _KINDS.items() if kind == "bool")
FLOAT_COLUMNS = tuple(name for name, kind in _KINDS.items() if kind == "float")
# read as text: a one-index witness is not a number; the grid is "multiplier:fraction;..."
TEXT_CELLS = {"rank_counts": str, "witness": str, "rtol_grid": str, "krank_lower_method": str,
              "statement": str}
# the strict statement of a row (Kruskal rank >= k; every context of rank n), in the ``statement`` column
REFUTED, PROVEN, NOT_DECIDED = "refuted", "proven", "not decided"
STATEMENTS = (REFUTED, PROVEN, NOT_DECIDED)
LEGACY_COLUMNS = {"holds": "share_meets_threshold"}  # a column of files written before -> its name now


def _missing(value: Any) -> bool:
    """None, NaN or pd.NA (never True for a list or dict)."""
    if value is None or value is pd.NA:
        return True
    return isinstance(value, float) and math.isnan(value)


def parse_rank_counts(value: Any) -> dict[int, int] | None:
    """``{rank: count}`` from a dict or from its CSV form ``"196:3;197:4997"``; None when missing."""
    if _missing(value):
        return None
    if isinstance(value, Mapping):
        return {int(r): int(c) for r, c in sorted(value.items())}
    pairs = [part.split(":") for part in str(value).split(";") if part.strip()]
    return {int(r): int(c) for r, c in sorted(pairs, key=lambda p: int(p[0]))}


def parse_witness(value: Any) -> list[int] | None:
    """Example indices from a list or from their CSV form ``"3 17 40"``; None when there is none."""
    if _missing(value):
        return None
    if isinstance(value, str):
        return [int(i) for i in value.split()] or None
    return [int(i) for i in value]


def parse_rtol_grid(value: Any) -> dict[float, float] | None:
    """``{multiplier of rtol: fraction}`` from a dict or from its CSV form ``"0.1:1.0;1:0.99;10:0.2"``;
    None when missing."""
    if _missing(value):
        return None
    if isinstance(value, Mapping):
        return {float(m): float(f) for m, f in sorted(value.items())}
    pairs = [part.split(":") for part in str(value).split(";") if part.strip()]
    return {float(m): float(f) for m, f in sorted(pairs, key=lambda p: float(p[0]))} or None


def format_rtol_grid(value: Any) -> str:
    """The CSV cell of a tolerance grid: ``"multiplier:fraction;..."`` in increasing multiplier."""
    grid = parse_rtol_grid(value)
    return "" if not grid else ";".join(f"{m:g}:{f:.6g}" for m, f in grid.items())


def format_rank_counts(value: Any) -> str:
    """The CSV cell of a rank histogram: ``"rank:count;..."`` in increasing rank ("" when missing)."""
    counts = parse_rank_counts(value)
    return "" if not counts else ";".join(f"{r}:{c}" for r, c in counts.items())


def format_witness(value: Any) -> str:
    """The CSV cell of a witness: space-separated indices ("" when there is none)."""
    witness = parse_witness(value)
    return "" if witness is None else " ".join(map(str, witness))


def _boolean(value: Any) -> bool | None:
    if _missing(value):
        return None
    if isinstance(value, str):
        return {"true": True, "false": False}[value.strip().lower()]
    return bool(value)


def statement_of(row: Mapping[str, Any]) -> str | None:
    """The strict statement of a tested row at its rtol: ``refuted``, ``proven`` or ``not decided``; None for
    a row with nothing measured (skipped).

    A Kruskal test (k-subsets of N vectors) states "Kruskal rank >= k". It is refuted by one dependent
    k-subset (a ``witness``, any sampled subset below full rank, every subset proven dependent by the pool's
    spectrum) or by a witnessed upper bound ``krank_upper`` < k; proven by the certified lower bound
    ``krank_lower`` >= k or by every k-subset enumerated and full rank; otherwise not decided (sampling
    cannot prove it). Assumption 2 states "every context has rank n"; every context is tested, so it is
    proven when all reached rank n and refuted by any that did not.
    """
    status = row.get("status")
    if _missing(row.get("fraction")) or (not _missing(status) and status != "ok"):
        return None
    fraction = float(row["fraction"])
    spec = TEST_SPECS.get(str(row.get("test")))
    if spec is not None and not spec.kruskal:
        return PROVEN if fraction >= 1.0 else REFUTED

    def count(key: str) -> int | None:
        value = row.get(key)
        return None if _missing(value) else int(value)

    k, lower, upper = count("k"), count("krank_lower"), count("krank_upper")
    if (parse_witness(row.get("witness")) is not None or fraction < 1.0 or _boolean(row.get("spectrum_proof"))
            or (k is not None and upper is not None and upper < k)):
        return REFUTED
    if k is not None and ((lower is not None and lower >= k) or _boolean(row.get("exhaustive"))):
        return PROVEN
    return NOT_DECIDED


def typed_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """One row with its structured fields typed (from a probes result or a CSV line); a row written before
    ``share_meets_threshold`` and ``statement`` gets them (from ``holds``; :func:`statement_of`)."""
    out = dict(record)
    for old, new in LEGACY_COLUMNS.items():
        if old in out:
            value = out.pop(old)
            if _missing(out.get(new)):
                out[new] = value
    if "rank_counts" in out:
        out["rank_counts"] = parse_rank_counts(out["rank_counts"])
    if "witness" in out:
        out["witness"] = parse_witness(out["witness"])
    if "rtol_grid" in out:
        out["rtol_grid"] = parse_rtol_grid(out["rtol_grid"])
    for key in INT_COLUMNS:
        if key in out:
            out[key] = None if _missing(out[key]) else int(out[key])
    for key in BOOL_COLUMNS:
        if key in out:
            out[key] = _boolean(out[key])
    if _missing(out.get("critical_rtol_exact")) and not _missing(out.get("critical_rtol")):
        out["critical_rtol_exact"] = critical_exact(out)  # a file written before the column
    if _missing(out.get("statement")):
        out["statement"] = statement_of(out)
    return out


def critical_exact(row: Mapping[str, Any]) -> bool | None:
    """Whether a row's critical tolerance is known to within its bracket (True) or only bounded by it
    (False); None without one (:func:`probes.robust.critical_is_exact`)."""
    from probes.robust import critical_is_exact

    def number(key: str) -> float:
        value = row.get(key)
        return math.nan if _missing(value) else float(value)

    return critical_is_exact(
        number("critical_rtol"), number("critical_rtol_low"), number("critical_rtol_high"), number("rtol")
    )


def rows_frame(records: Iterable[Mapping[str, Any]], stamp: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Typed rows in the column order of :data:`COLUMNS` (other columns after them).

    ``stamp``: provenance columns filled where a row has none of its own (a reused row keeps the commit
    and versions that computed it).
    """
    typed = [typed_record(r) for r in records]
    for row in typed:
        for key, value in (stamp or {}).items():
            if _missing(row.get(key)):
                row[key] = value
    frame = pd.DataFrame(typed)
    for key in COLUMNS:
        if key not in frame.columns:
            frame[key] = None
    frame = frame[COLUMNS + [c for c in frame.columns if c not in COLUMNS]]
    for key in INT_COLUMNS:
        frame[key] = pd.array([None if _missing(v) else int(v) for v in frame[key]], dtype="Int64")
    for key in BOOL_COLUMNS:
        frame[key] = pd.array([_boolean(v) for v in frame[key]], dtype="boolean")
    for key in FLOAT_COLUMNS:
        frame[key] = pd.to_numeric(frame[key], errors="coerce").astype("float64")
    frame["statement"] = pd.Series([None if _missing(v) else str(v) for v in frame["statement"]],
                                   index=frame.index, dtype=object)
    for key in ("rank_counts", "witness", "rtol_grid"):  # Python objects; None where nothing was measured
        frame[key] = pd.Series(
            [None if _missing(v) else v for v in frame[key]], index=frame.index, dtype=object
        )
    return frame


def csv_text(frame: pd.DataFrame) -> str:
    """``results.csv`` (or ``sweep.csv``) text of a frame: structured cells as compact strings."""
    out = frame.copy()
    if "rank_counts" in out.columns:
        out["rank_counts"] = [format_rank_counts(v) for v in out["rank_counts"]]
    if "witness" in out.columns:
        out["witness"] = [format_witness(v) for v in out["witness"]]
    if "rtol_grid" in out.columns:
        out["rtol_grid"] = [format_rtol_grid(v) for v in out["rtol_grid"]]
    for key in out.columns:  # any other dict or list cell (e.g. a sweep's ``stages``): one string
        if out[key].dtype == object and out[key].map(lambda v: isinstance(v, dict | list | tuple)).any():
            out[key] = [_cell(v) for v in out[key]]
    return out.to_csv(index=False)


def _cell(value: Any) -> Any:
    if isinstance(value, dict):
        return ";".join(f"{k}:{v}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return " ".join(map(str, value))
    return value


def read_rows(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Typed rows from a ``results.csv`` (or ``results.partial.csv``) written by :func:`csv_text`."""
    return rows_frame(pd.read_csv(path, dtype=TEXT_CELLS).to_dict("records"))
