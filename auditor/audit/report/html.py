"""``report.html``: an audit report (or an ``audit compare``) as one self-contained page, to open in a browser
or send as one file.

The page needs nothing but itself: no script, no network, no server. Figures are matplotlib's own SVG,
inlined (text kept as text, so a figure stays sharp at any zoom and its labels can be searched), drawn by the
same functions as the report's PNG and PDF figures. In reading order it holds:

1. the verdicts: for each representation and test, first the strict statement at the row's rank tolerance
   (Kruskal rank >= k for Assumptions 1, 3 and general position; every context of rank n for Assumption 2),
   ``refuted`` by a witness, ``proven`` by a certified bound or ``not decided``; then the measured share and
   its threshold ("99.6% of 5000 sampled 3-subsets full rank; threshold 0.99, met");
2. how far the rank tolerance can move before the share's verdict flips (critical tolerance and its proven
   bracket, as multiples of rtol);
3. for an audit across depth, the depth profiles (figures and the table of depth.csv);
4. the two-sided bounds on the Kruskal rank (certified lower, witnessed upper);
5. the other figures, the run's configuration and provenance, the time per stage, and relative links to
   the CSVs and figure files beside it.

Every number of the verdict table also sits in the cell's ``data-*`` attributes exactly as results.csv holds
it (``data-fraction``, ``data-statement``), so a test can hold the page to the CSV. A 32-block audit's page
stays well under :data:`PAGE_LIMIT`.
"""

from __future__ import annotations

import html
import io
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from auditor.audit.report.catalogue import RTOL_RULE, TEST_SPECS, TEST_TITLES
from auditor.audit.report.schema import parse_rank_counts, parse_witness, statement_of

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from auditor.audit.report.result import AuditResult

PAGE = "report.html"
PAGE_LIMIT = 5 * 2**20  # bytes: a page stays small enough to send as an attachment
REFUTED, PROVEN, NOT_DECIDED = "refuted", "proven", "not decided"
ROBUST_FACTOR = 3.0  # a share's verdict is robust when it survives this factor of change in rtol either way
FIGURE_SCALE = 1.4  # a figure's size on the page, relative to its size in print
WITNESS_SHOWN = 12  # indices of a witness printed in a cell (all of them are in results.csv)

# ---------------------------------------------------------------------------------------------------
# Reading a row
# ---------------------------------------------------------------------------------------------------


def _missing(value: Any) -> bool:
    if value is None or value is pd.NA:
        return True
    return isinstance(value, float) and math.isnan(value)


def _int(value: Any) -> int | None:
    return None if _missing(value) else int(value)


def _float(value: Any) -> float | None:
    return None if _missing(value) else float(value)


def _bool(value: Any) -> bool | None:
    if _missing(value):
        return None
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return bool(value)


def _kruskal(row: Mapping[str, Any]) -> bool:
    spec = TEST_SPECS.get(str(row.get("test")))
    return spec is None or spec.kruskal


def statement(row: Mapping[str, Any]) -> str | None:
    """The strict statement of a tested row: its ``statement`` column where the row has one, else derived
    from its evidence by the schema's rule (:func:`~auditor.audit.report.schema.statement_of`). None for a
    row with nothing measured."""
    given = row.get("statement")
    if isinstance(given, str) and given.strip() in (REFUTED, PROVEN, NOT_DECIDED):
        return given.strip()
    return statement_of(row)


def share_meets(row: Mapping[str, Any]) -> bool | None:
    """Whether the row's share reaches its threshold (``share_meets_threshold``, or ``holds`` in files
    written before it, else from the numbers)."""
    for key in ("share_meets_threshold", "holds"):
        if key in row and not _missing(row.get(key)):
            return _bool(row[key])
    fraction, threshold = _float(row.get("fraction")), _float(row.get("threshold"))
    return None if fraction is None or threshold is None else fraction >= threshold


def percent(fraction: float) -> str:
    """A share in percent, with as many decimals (1 to 4) as it takes not to print 100% for a share below 1
    or 0% for one above 0."""
    value = 100.0 * fraction
    if fraction in (0.0, 1.0):
        return f"{value:.0f}%"
    for digits in range(1, 5):
        text = f"{value:.{digits}f}"
        if float(text) not in (0.0, 100.0):
            return text + "%"
    return f"{value:.4g}%"


def _tested(row: Mapping[str, Any]) -> int | None:
    """How many subsets (contexts) the share was measured on: the rank histogram's total."""
    counts = parse_rank_counts(row.get("rank_counts"))
    return sum(counts.values()) if counts else None


def statement_words(row: Mapping[str, Any]) -> str:
    """The strict statement in words, with its evidence: ``proven: Kruskal rank >= 17 (certified,
    coherence)``, ``refuted: Kruskal rank < 17 (witness: examples 0 1 4 ...)``."""
    said = statement(row)
    k = _int(row.get("k"))
    if not _kruskal(row):
        n = _int(row.get("n"))
        what = f"every context has rank n = {n}" if n is not None else "every context has rank n"
        return {PROVEN: f"proven: {what}", REFUTED: f"refuted: not {what}",
                NOT_DECIDED: f"not decided: {what}"}.get(said or "", "")
    claim = f"Kruskal rank >= {k}"
    if said == REFUTED:
        witness = parse_witness(row.get("witness"))
        upper = _int(row.get("krank_upper"))
        if witness:
            more = " ..." if len(witness) > WITNESS_SHOWN else ""
            shown = " ".join(map(str, witness[:WITNESS_SHOWN])) + more
            evidence = f"witness: examples {shown}"
        elif _bool(row.get("spectrum_proof")):
            evidence = "every subset dependent, by the pool's spectrum"
        elif upper is not None and k is not None and upper < k:
            evidence = f"witnessed upper bound {upper}"
        else:
            evidence = "a sampled subset below full rank"
        return f"refuted: Kruskal rank < {k} ({evidence})"
    if said == PROVEN:
        lower, method = _int(row.get("krank_lower")), row.get("krank_lower_method")
        if lower is not None and k is not None and lower >= k:
            how = f"certified >= {lower}" + ("" if _missing(method) else f", {method}")
        else:
            how = "every subset enumerated"
        return f"proven: {claim} ({how})"
    if said == NOT_DECIDED:
        return f"not decided: {claim} (no dependent subset found; sampling cannot prove it)"
    return ""


def share_words(row: Mapping[str, Any]) -> str:
    """The measured share and its threshold: ``99.6% of 5000 sampled 3-subsets full rank; threshold 0.99,
    met`` (Assumption 2: ``19/20 contexts of rank n; threshold 1, not met``)."""
    fraction, threshold = _float(row.get("fraction")), _float(row.get("threshold"))
    if fraction is None:
        return ""
    met = share_meets(row)
    tail = "" if threshold is None else f"; threshold {threshold:g}" + (
        "" if met is None else (", met" if met else ", not met"))
    if not _kruskal(row):
        num = _int(row.get("N"))
        if num:
            return f"{round(fraction * num)}/{num} contexts of rank n{tail}"
        return f"{percent(fraction)} of contexts of rank n{tail}"
    k, tested = _int(row.get("k")), _tested(row)
    if _bool(row.get("exhaustive")):
        enumerated = f" ({tested} enumerated)" if tested else ""
        return f"{percent(fraction)} of all {k}-subsets full rank{enumerated}{tail}"
    count = f"{tested} " if tested else ""
    return f"{percent(fraction)} of {count}sampled {k}-subsets full rank{tail}"


def skipped_words(row: Mapping[str, Any]) -> str:
    """Why a row was not tested, in full (its note)."""
    note = "" if _missing(row.get("note")) else str(row.get("note"))
    return "skipped" + (f": {note}" if note else "")


def skipped_short(row: Mapping[str, Any]) -> str:
    """Why a row was not tested, in a few words for a table cell (the full note is listed under the table)."""
    note = "" if _missing(row.get("note")) else str(row.get("note"))
    if note.startswith("weights unavailable"):
        return "skipped: no weights"
    if note.startswith("N = "):
        return "skipped: N < k"
    return "skipped"


# ---------------------------------------------------------------------------------------------------
# Robustness in words
# ---------------------------------------------------------------------------------------------------


def _times(x: float) -> str:
    """A multiple of rtol for reading: ``0.45x``, ``283x``, ``8.5e+13x``."""
    if x == 0:
        return "0x"
    return f"{x:.2g}x" if x < 10 else f"{x:.0f}x" if x < 1e5 else f"{x:.2g}x"


def robustness_words(row: Mapping[str, Any]) -> tuple[str, str]:
    """(critical tolerance with its bracket, robust or not) of a row, as multiples of its rtol; ("", "")
    without one. The share is monotone in rtol: a share that meets its threshold keeps meeting it below the
    critical tolerance, one below it stays below above it."""
    rtol, critical = _float(row.get("rtol")), _float(row.get("critical_rtol"))
    low, high = _float(row.get("critical_rtol_low")), _float(row.get("critical_rtol_high"))
    met = share_meets(row)
    if rtol is None or not rtol > 0 or met is None or (critical is None and (low is None or high is None)):
        return "", ""
    low_x = (low if low is not None else critical) / rtol
    high_x = (high if high is not None else critical) / rtol
    capped = high_x == math.inf or high_x * rtol >= 1 - 1e-9  # no sigma ratio exceeds 1: no measurement
    exact = _bool(row.get("critical_rtol_exact"))
    if capped:
        where = f"flips at >= {_times(low_x)} rtol (no tolerance below 1 makes it flip)"
    elif low_x <= 0:
        where = f"flips at <= {_times(high_x)} rtol (no positive tolerance makes it flip)"
    elif high_x <= low_x * 1.1:
        where = (f"flips at {_times(math.sqrt(low_x * high_x))} rtol "
                 f"(bracket {_times(low_x)} - {_times(high_x)})")
    else:
        where = (f"flips between {_times(low_x)} and {_times(high_x)} rtol"
                 + (" (a bound: not narrowed further)" if exact is False else ""))
    if met:
        robust = low_x >= ROBUST_FACTOR
        words = f"share meets the threshold for every rtol up to {_times(low_x)} at least"
    else:
        robust = high_x <= 1 / ROBUST_FACTOR
        words = (f"share below the threshold for every rtol down to {_times(high_x)} at least" if high_x > 0
                 else "share below the threshold at every rtol float64 can resolve")
    label = ("robust" if robust else "hinges on the tolerance") + f": {words}"
    return where, label


# ---------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------

_ID = re.compile(r'\bid="([^"]+)"')


def figure_svg(fig: Figure, prefix: str) -> str:
    """One matplotlib figure as inline SVG: text kept as text, ids made unique to the page by ``prefix``
    (several figures on one page must not share a clip path or marker id), sized by the page's CSS."""
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": prefix}):
        fig.savefig(buffer, format="svg")
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    ids = set(_ID.findall(text))
    if ids:
        pattern = re.compile(r'(\bid="|url\(#|href="#)(' + "|".join(map(re.escape, sorted(ids, key=len,
                                                                                         reverse=True)))
                             + r')(?=[")])')
        text = pattern.sub(lambda m: f"{m.group(1)}{prefix}-{m.group(2)}", text)
    return re.sub(r'(<svg[^>]*?\s)width="([\d.]+)pt"\s+height="([\d.]+)pt"', _scaled, text, count=1)


def _scaled(match: re.Match) -> str:
    """The figure's size on the page: ``FIGURE_SCALE`` times its size in print (a one-column figure of a
    paper is small on a screen); the page's CSS keeps it within the window."""
    width, height = (float(match.group(i)) * FIGURE_SCALE for i in (2, 3))
    return f'{match.group(1)}width="{width:.1f}pt" height="{height:.1f}pt"'



def _figures(drawings: Iterable[tuple[str, Callable[[], Figure]]]) -> dict[str, str]:
    """``{name: inline svg}`` of each drawing, each drawn in the reports' figure style and closed."""
    import matplotlib.pyplot as plt

    from auditor.audit.report.style import figure_style

    out = {}
    for index, (name, draw) in enumerate(drawings):
        with figure_style():
            fig = draw()
        try:
            out[name] = figure_svg(fig, f"f{index}")
        finally:
            plt.close(fig)
    return out


def _figure_block(name: str, svg: str, caption: str) -> str:
    stem = Path(name).stem
    return (f'<figure class="plot" data-figure="{_e(stem)}"><div class="svg">{svg}</div>'
            f'<figcaption><b>{_e(stem)}</b>: {_e(caption)} (<a href="{_e(name)}">PNG</a>, '
            f'<a href="{_e(stem)}.pdf">PDF</a>)</figcaption></figure>')


def _figure_row(figures: Iterable[tuple[str, str]]) -> str:
    """Figures side by side where the window is wide enough ("" when there is none)."""
    blocks = "".join(_figure_block(name, svg, FIGURE_CAPTIONS.get(name, "")) for name, svg in figures)
    return f'<div class="figures">{blocks}</div>' if blocks else ""


FIGURE_CAPTIONS = {
    "kruskal_curve.png": "share of full-rank query k-subsets against k (the sweep)",
    "context_ranks.png": "how many contexts reached each rank (Assumption 2)",
    "margins.png": "per-context rank margins in decades above the tolerance",
    "rtol_sweep.png": "each test's share against a multiple of its rtol, with the critical tolerance",
    "depth_kruskal.png": "bounds on the Kruskal rank of the queries against depth",
    "depth_geometry.png": "token geometry against depth",
    "depth_fractions.png": "each test's share against depth",
    "compare_kruskal.png": "the Kruskal shares by test, across the reports",
    "compare_depth.png": "the depth profiles of the reports, overlaid",
}
DEPTH_FIGURES = ("depth_kruskal.png", "depth_fractions.png", "depth_geometry.png")

# ---------------------------------------------------------------------------------------------------
# Page pieces
# ---------------------------------------------------------------------------------------------------

CSS = """
:root { color-scheme: light; --refuted: #fbe3e1; --proven: #e3f4e1; --open: #eeeeee; --ink: #1f2328; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); margin: 0;
       background: #fff; }
main { max-width: 1200px; margin: 0 auto; padding: 1.2em 1.5em 3em; }
h1 { font-size: 1.5em; margin: .2em 0 .1em; } h2 { font-size: 1.2em; margin-top: 1.8em;
     border-bottom: 1px solid #d0d7de; padding-bottom: .2em; }
p.lead, p.note { color: #444; max-width: 75em; }
nav a { margin-right: 1em; }
.scroll { overflow: auto; max-height: 80vh; border: 1px solid #d0d7de; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: .3em .5em; vertical-align: top; text-align: left; }
thead th { position: sticky; top: 0; background: #f6f8fa; z-index: 1; }
tbody th { background: #fafbfc; white-space: nowrap; font-weight: 600; }
td.refuted { background: var(--refuted); } td.proven { background: var(--proven); }
td.not-decided { background: var(--open); } td.skipped { color: #666; font-style: italic; }
.statement { display: block; } .evidence { color: #333; font-size: 12px; }
.share { display: block; color: #333; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.figures { display: flex; flex-wrap: wrap; gap: 1em 2em; align-items: flex-start; }
figure.plot { margin: 1em 0; max-width: 100%; }
figure.plot .svg svg { max-width: 100%; height: auto; display: block; }
figcaption { color: #444; font-size: 13px; }
dl.kv { display: grid; grid-template-columns: max-content 1fr; gap: .2em 1em; }
dl.kv dt { font-weight: 600; } dl.kv dd { margin: 0; word-break: break-word; }
code { font-size: 12px; }
"""


def _e(value: Any) -> str:
    return html.escape("" if _missing(value) else str(value), quote=True)


def _num_attr(value: Any) -> str:
    """A number as results.csv holds it (``repr`` of the float: exact round trip), "" when missing."""
    number = _float(value)
    return "" if number is None else repr(number)


def _row_label(row: Mapping[str, Any]) -> str:
    return f"{row.get('representation')} @ {row.get('weights')}"


def _order(rows: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(_row_label(r) for r in rows.to_dict("records")))


def _tests(rows: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(rows["test"].astype(str)))
    return [t for t in TEST_TITLES if t in present] + [t for t in present if t not in TEST_TITLES]


def _verdict_cell(row: Mapping[str, Any], report: str = "") -> str:
    attrs = (f'data-report="{_e(report)}" data-representation="{_e(row.get("representation"))}" '
             f'data-weights="{_e(row.get("weights"))}" data-test="{_e(row.get("test"))}"')
    if row.get("status") != "ok" or _float(row.get("fraction")) is None:
        return (f'<td class="skipped" {attrs} data-statement="" title="{_e(skipped_words(row))}">'
                f"{_e(skipped_short(row))}</td>")
    said = statement(row) or ""
    css = said.replace(" ", "-")
    return (f'<td class="{css}" {attrs} data-statement="{_e(said)}"'
            f' data-fraction="{_num_attr(row.get("fraction"))}"'
            f' data-threshold="{_num_attr(row.get("threshold"))}" data-k="{_e(_int(row.get("k")))}">'
            f'<span class="statement">{_statement_html(statement_words(row))}</span>'
            f'<span class="share">{_e(share_words(row))}</span></td>')


def _statement_html(words: str) -> str:
    """The statement in bold, its evidence (in parentheses) in plain text."""
    claim, sep, evidence = words.partition(" (")
    return f"<b>{_e(claim)}</b>" + (f" <span class=\"evidence\">({_e(evidence)}</span>" if sep else "")


def verdict_table(rows: pd.DataFrame, report: str = "", label: Callable[[Mapping], str] = _row_label) -> str:
    """Representation @ weights x test: each cell the strict statement first, then the share."""
    tests = _tests(rows)
    cells: dict[str, dict[str, str]] = {}
    for row in rows.to_dict("records"):
        cells.setdefault(label(row), {})[str(row["test"])] = _verdict_cell(row, report)
    head = "".join(f"<th>{_e(TEST_TITLES.get(t, t))}</th>" for t in tests)
    body = "".join(
        f"<tr><th>{_e(name)}</th>" + "".join(by_test.get(t, "<td></td>") for t in tests) + "</tr>"
        for name, by_test in cells.items()
    )
    skipped = sorted({skipped_words(r) for r in rows.to_dict("records") if r.get("status") != "ok"})
    notes = (f'<p class="note">Not tested: {"; ".join(_e(n.removeprefix("skipped: ")) for n in skipped)}</p>'
             if skipped else "")
    return (f'<div class="scroll"><table class="verdicts" data-report="{_e(report)}"><thead><tr>'
            f"<th>representation @ weights</th>{head}</tr></thead><tbody>{body}</tbody></table></div>{notes}")


def robustness_table(rows: pd.DataFrame) -> str:
    """Representation @ weights x test: where each share's verdict flips, and whether it is robust."""
    tests = _tests(rows) if not rows.empty else []
    cells: dict[str, dict[str, str]] = {}
    for row in rows.to_dict("records"):
        where, label = robustness_words(row)
        if not where:
            continue
        attrs = "".join(f' data-{key.replace("_", "-")}="{_num_attr(row.get(key))}"'
                        for key in ("critical_rtol", "critical_rtol_low", "critical_rtol_high", "rtol"))
        cells.setdefault(_row_label(row), {})[str(row["test"])] = (
            f'<td data-representation="{_e(row["representation"])}" data-weights="{_e(row["weights"])}" '
            f'data-test="{_e(row["test"])}"{attrs}><span class="statement"><b>{_e(where)}</b></span>'
            f'<span class="share">{_e(label)}</span></td>')
    if not cells:
        return ""
    used = [t for t in tests if any(t in by_test for by_test in cells.values())]
    head = "".join(f"<th>{_e(TEST_TITLES.get(t, t))}</th>" for t in used)
    body = "".join(f"<tr><th>{_e(name)}</th>" + "".join(by_test.get(t, "<td></td>") for t in used) + "</tr>"
                   for name, by_test in cells.items())
    return ('<div class="scroll"><table class="robustness"><thead><tr><th>representation @ weights</th>'
            f"{head}</tr></thead><tbody>{body}</tbody></table></div>")


def bounds_table(rows: pd.DataFrame) -> str:
    lines = []
    keep = rows[(rows["status"] == "ok") & rows["test"].map(lambda t: _kruskal({"test": t}))]
    for row in keep.to_dict("records"):
        k, lower, upper = _int(row.get("k")), _int(row.get("krank_lower")), _int(row.get("krank_upper"))
        method = "" if _missing(row.get("krank_lower_method")) else f" ({row['krank_lower_method']})"
        known = "K = " + str(lower) if lower is not None and lower == upper else ""
        low, high = _float(row.get("fraction_low")), _float(row.get("fraction_high"))
        interval = "" if low is None or high is None else f" [{low:.4f}, {high:.4f}]"
        duplicates = ("" if _missing(row.get("duplicates")) else
                      f"{_int(row['duplicates'])} / {_int(row.get('near_duplicates')) or 0}")
        lines.append(
            f'<tr data-representation="{_e(row["representation"])}" data-test="{_e(row["test"])}">'
            f"<th>{_e(_row_label(row))}</th><td>{_e(row['test'])}</td><td class='num'>{_e(k)}</td>"
            f'<td class="num" data-lower="{_e(lower)}">{_e(lower)}{_e(method)}</td>'
            f'<td class="num" data-upper="{_e(upper)}">{_e("none found" if upper is None else upper)}</td>'
            f"<td>{_e(known)}</td><td class='num'>{_float(row['fraction']):.4f}{interval}</td>"
            f"<td class='num'>{_e(duplicates)}</td></tr>")
    if not lines:
        return ""
    return ('<div class="scroll"><table class="bounds"><thead><tr><th>representation @ weights</th>'
            "<th>test</th><th>k</th><th>Kruskal rank &gt;= (certified)</th>"
            "<th>Kruskal rank &lt;= (witness)</th>"
            "<th>known</th>"
            "<th>share [95% interval]</th><th>duplicates / near</th></tr></thead><tbody>"
            + "".join(lines) + "</tbody></table></div>")


def depth_table(depth: pd.DataFrame) -> str:
    if depth.empty or "depth" not in depth.columns:
        return ""
    tests = [c.removesuffix("_fraction") for c in depth.columns if c.endswith("_fraction")]
    head = "".join(f"<th>{_e(t)}: share, statement</th>" for t in tests)
    lines = []
    for row in depth.to_dict("records"):
        lower, upper = _int(row.get("krank_lower")), _int(row.get("krank_upper"))
        method = "" if _missing(row.get("krank_lower_method")) else f" ({row['krank_lower_method']})"
        sampled = "" if _missing(row.get("krank_sampled")) else str(row.get("krank_sampled"))
        lines.append(
            f"<tr><td class='num'>{_e(_int(row.get('depth')))}</td><th>{_e(row.get('representation'))}</th>"
            f"<td>{_e(row.get('weights'))}</td>"
            + "".join(_depth_cell(row, t) for t in tests)
            + f"<td class='num'>{_e(lower)}{_e(method)}</td><td class='num'>{_e(sampled)}</td>"
            f"<td class='num'>{_e(upper if upper is not None else 'none found')}</td></tr>")
    return ('<div class="scroll"><table class="depth"><thead><tr><th>depth</th><th>representation</th>'
            f"<th>weights</th>{head}<th>Kruskal rank &gt;= (certified)</th><th>sampled</th>"
            "<th>&lt;= (witness)</th></tr></thead><tbody>" + "".join(lines) + "</tbody></table></div>")


def _depth_cell(row: Mapping[str, Any], test: str) -> str:
    """One test's share at one depth, with its strict statement where depth.csv has it."""
    said = row.get(f"{test}_statement")
    said = said if isinstance(said, str) and said in (REFUTED, PROVEN, NOT_DECIDED) else ""
    css = f"num {said.replace(' ', '-')}" if said else "num"
    return f"<td class='{css}'>{_fmt(row.get(test + '_fraction'))}{' ' + _e(said) if said else ''}</td>"


def _fmt(value: Any) -> str:
    number = _float(value)
    return "" if number is None else f"{number:.4f}"


def _g(value: Any) -> str:
    number = _float(value)
    return "" if number is None else f"{number:.3g}"


def _key_values(pairs: Iterable[tuple[str, Any]]) -> str:
    return '<dl class="kv">' + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in pairs) + "</dl>"


def _links(names: Sequence[str]) -> str:
    present = [name for name in names if name]
    return "<ul>" + "".join(f'<li><a href="{_e(name)}">{_e(name)}</a></li>' for name in present) + "</ul>"


def _page(title: str, sections: Sequence[tuple[str, str, str]], lead: str) -> str:
    """The whole page: a title, a line under it, a table of contents and the sections (id, title, body)."""
    toc = "".join(f'<a href="#{sid}">{_e(name)}</a>' for sid, name, body in sections if body)
    body = "".join(f'<section id="{sid}"><h2>{_e(name)}</h2>{text}</section>'
                   for sid, name, text in sections if text)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body><main>"
            f"<h1>{_e(title)}</h1><p class=\"lead\">{lead} Page written {stamp}.</p><nav>{toc}</nav>"
            f"{body}</main></body></html>\n")


STATEMENT_NOTE = (
    "Each cell states first the strict statement at the row's rank tolerance: for Assumptions 1, 3 and "
    "general position <i>Kruskal rank &gt;= k</i>, for Assumption 2 <i>every context has rank n</i>. It is "
    "<b>refuted</b> when a witness disproves it (a dependent k-subset, whose example indices are the "
    "<code>witness</code> column of results.csv; a rank-deficient context), <b>proven</b> when a certified "
    "lower bound on the Kruskal rank reaches k (or every k-subset was enumerated full rank, every context "
    "has rank n), and <b>not decided</b> otherwise: sampling that finds no dependent subset cannot prove "
    "there is none. The second line is the measured share of full-rank subsets (rank-n contexts) and its "
    "threshold; a share can meet its threshold while a witness refutes the statement."
)
ROBUST_NOTE = (
    "The share of every test is monotone in the rank tolerance, so its verdict against the threshold flips "
    "at one critical tolerance, known within a proven bracket. Robust: the verdict survives a change of rtol "
    f"by {ROBUST_FACTOR:g}x either way; otherwise it hinges on the tolerance convention and should be quoted "
    "with it."
)
BOUNDS_NOTE = (
    "Certified: every subset of that size is full rank at this tolerance (the method says how it was "
    "proven). Witness: a dependent subset of that size was found. The Kruskal rank K lies between the two; "
    "the 95% interval is Clopper-Pearson's on the sampled share."
)


# ---------------------------------------------------------------------------------------------------
# The audit's page
# ---------------------------------------------------------------------------------------------------


def report_html(result: AuditResult, config: Mapping[str, Any] | None = None, *,
                svgs: Mapping[str, str] | None = None) -> str:
    """The text of an audit report's ``report.html``, from its rows, depth profile, curves and configuration
    (``config``: what config.json holds; default the result's configuration). ``svgs``: the figures as
    inline SVG by file name, as :func:`auditor.audit.report.plots.write_plots` gives them (none: a page
    without figures)."""
    from auditor.audit.report.tables import stage_table

    rows = result.rows
    config = dict(config if config is not None else vars(result.config))
    svgs = dict(svgs or {})
    ok = rows[rows["status"] == "ok"] if not rows.empty else rows
    first = (ok if not ok.empty else rows).iloc[0].to_dict() if not rows.empty else {}
    depth_figures = _figure_row((n, svgs[n]) for n in DEPTH_FIGURES if n in svgs)
    other_figures = _figure_row((n, s) for n, s in svgs.items() if n not in DEPTH_FIGURES)
    counts = {said: int(sum(statement(r) == said for r in ok.to_dict("records")))
              for said in (REFUTED, PROVEN, NOT_DECIDED)} if not ok.empty else {}
    lead = (f"{len(rows)} rows ({len(ok)} tested): " + ", ".join(f"{v} {k}" for k, v in counts.items())
            + ". Statements first, shares second." if counts else "No tested rows.")
    rtol = config.get("rtol")
    provenance = [
        ("model", config.get("model")),
        ("data", first.get("data_source")),
        ("examples", "the first N of the source" if _bool(first.get("first")) else
         f"a random draw of N (seed {config.get('seed')})"),
        ("tokenizer / preprocessing", first.get("tokenizer")),
        ("N, n, d", ", ".join(str(_int(first.get(c))) for c in ("N", "n", "d"))),
        ("weights", ", ".join(dict.fromkeys(str(w) for w in rows["weights"])) if not rows.empty else ""),
        ("weights held in", first.get("weights_dtype")),
        ("tokens computed in", first.get("dtype")),
        ("tests ran on", first.get("device")),
        ("rank tolerance", f"sigma > sigma_max x rtol, rtol = {RTOL_RULE if rtol is None else f'{rtol:g}'}"),
        ("subsets per Kruskal test", config.get("subsets")),
        ("threshold of the share", config.get("threshold")),
        ("data fingerprint", first.get("data_fingerprint")),
        ("git commit", first.get("git_commit")),
        ("versions", first.get("versions")),
    ]
    stages = ("" if result.stages.empty else
              stage_table(result.stages).to_html(classes="stages", border=0, escape=True))
    files = ["results.csv", "sweep.csv" if not result.curves.empty else "",
             "depth.csv" if not result.depth.empty else "", "summary.md", "config.json",
             *(name for name in svgs)]
    sections = [
        ("verdicts", "Verdicts", f'<p class="note">{STATEMENT_NOTE}</p>' + verdict_table(rows)),
        ("robustness", "Robustness to the rank tolerance",
         (f'<p class="note">{ROBUST_NOTE}</p>' + robustness_table(ok)) if robustness_table(ok) else ""),
        ("depth", "Across depth",
         (depth_figures + depth_table(result.depth)) if not result.depth.empty else ""),
        ("bounds", "Kruskal rank: two-sided bounds",
         (f'<p class="note">{BOUNDS_NOTE}</p>' + bounds_table(ok)) if bounds_table(ok) else ""),
        ("figures", "Figures", other_figures),
        ("provenance", "Configuration and provenance",
         _key_values(provenance) + "<h3>config.json</h3>" + _key_values(sorted(config.items()))
         + (f"<h3>Time per stage</h3>{stages}" if stages else "")),
        ("files", "Files", "<p class=\"note\">Beside this page in the report folder:</p>"
         + _links(files)),
    ]
    return _page(f"Assumption audit: {config.get('model')}", sections, _e(lead))


# ---------------------------------------------------------------------------------------------------
# The comparison's page
# ---------------------------------------------------------------------------------------------------


def _read_depth(path: Path) -> pd.DataFrame:
    """A report's depth.csv as the compare figures read it."""
    try:
        from auditor.audit.report.depth import read_depth
    except ImportError:  # reports from before read_depth: the plain table
        return pd.read_csv(path)
    return read_depth(path)


def compare_html(table: pd.DataFrame, reports: Sequence[Any], out: Path, *, figures: bool = True) -> str:
    """The text of ``audit compare``'s ``report.html``: each report's verdicts (read from its results.csv),
    the comparison table's numbers, the overlay figures, and links to each report's own page and CSVs
    (relative to ``out``). ``reports``: the compared reports (``folder`` and ``label``)."""
    from auditor.audit.report.schema import read_rows

    parts, listing = [], []
    for report in reports:
        folder = Path(report.folder)
        rows = read_rows(folder / "results.csv")
        link = os.path.relpath(folder, out)
        ok = rows[rows["status"] == "ok"]
        skipped = rows[rows["status"] != "ok"]
        folded = ""
        if not skipped.empty:
            notes = sorted(set(skipped_words(r) for r in skipped.to_dict("records")))
            folded = f'<p class="note">{len(skipped)} rows skipped: {"; ".join(_e(n) for n in notes)}</p>'
        first = (ok if not ok.empty else rows).iloc[0].to_dict()
        shape = ", ".join(f"{c} = {_int(first.get(c))}" for c in ("N", "n", "d"))
        weights = ", ".join(dict.fromkeys(map(str, rows["weights"])))
        page = (f'<a href="{_e(link)}/report.html">its page</a>, ' if (folder / PAGE).is_file()
                else "")  # a report written before report.html has none
        parts.append(
            f'<h3 id="r{len(parts)}">{_e(report.label)}</h3><p class="note">{_e(shape)}; data: '
            f"{_e(first.get('data_source'))}; weights: {_e(weights)} ({page}"
            f'<a href="{_e(link)}/results.csv">results.csv</a>)</p>'
            + (verdict_table(ok, report.label) if not ok.empty else "") + folded)
        listing.append((report.label, str(folder)))
    svgs: dict[str, str] = {}
    if figures:
        from auditor.audit.report.compare_plots import depth_overlay, kruskal_by_test

        labels = {str(r.folder): r.label for r in reports}
        drawings: list[tuple[str, Callable[[], Figure]]] = []
        if table["fraction"].notna().any():  # as compare.py draws them
            drawings.append(("compare_kruskal.png", lambda: kruskal_by_test(table, labels)))
        depths = {r.label: _read_depth(Path(r.folder) / "depth.csv") for r in reports
                  if (Path(r.folder) / "depth.csv").is_file()}
        depths = {k: v for k, v in depths.items() if not v.empty and "depth" in v.columns}
        if depths:
            drawings.append(("compare_depth.png", lambda: depth_overlay(depths)))
        svgs = _figures(drawings)
    sections = [
        ("verdicts", "Verdicts per report", f'<p class="note">{STATEMENT_NOTE}</p>' + "".join(parts)),
        ("figures", "Figures", _figure_row(svgs.items())),
        ("reports", "Reports compared", _key_values(listing)),
        ("files", "Files", "<p class=\"note\">Beside this page:</p>"
         + _links(["compare.csv", "compare.md", *svgs])),
    ]
    return _page("Comparison of audit reports", sections,
                 _e(f"{len(reports)} reports: " + ", ".join(r.label for r in reports) + "."))

