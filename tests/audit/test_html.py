"""``report.html`` of an audit and of ``audit compare``, opened in a real browser.

The pages come from a real audit of a tiny random 32-block ViT (d = 32, n = 17) on the first 20 shared
ImageNet images, ``--layers all`` (34 representations, so the page of a deep model is what is checked),
and from ``audit compare`` of that report with a report of tensors. Headless Chromium (Debian's
``chromium``) opens each page through its DevTools protocol over a pipe (``--remote-debugging-pipe``, no
port, no extra package): no console error, the verdict tables and every figure of the folder present and
drawn within the window, no horizontal overflow, every link pointing at a file beside the page; a screenshot
is saved as a test artifact (in the test's tmp folder; ``AUDITOR_SCREENSHOTS=<folder>`` copies it there).
Without a browser the browser tests skip with the reason, unless ``CI`` is set: then they fail.

The page's numbers are held to results.csv's: every verdict cell carries the row's fraction as written
(``data-fraction``, a float's repr) and shows it in percent to the printed precision.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import fcntl
import json
import os
import queue
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import save_tiny_vit, shared_data

import auditor
from auditor.audit.compare import compare
from auditor.audit.report.html import PAGE_LIMIT, percent, share_words, statement, statement_words
from auditor.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")
BLOCKS = 32
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")
WIDTH, HEIGHT = 1280, 1000  # the window a page is checked in (CSS pixels)

# ---------------------------------------------------------------------------------------------------
# The pages
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def deep_report(tmp_path_factory) -> Path:
    """A report folder of a real audit of a 32-block tiny ViT across depth (both kinds of tests)."""
    root = tmp_path_factory.mktemp("html")
    model = save_tiny_vit(root / "vit32", num_hidden_layers=BLOCKS)
    out = root / "vit32-report"
    code = main([model, "--data", str(shared_data("imagenet-sample")), "--samples", "20", "--first", "-w",
                 "random", "--layers", "all", "--tests", "assumption2,assumption1", "--subsets", "40",
                 "--device", "cpu", "-q", "--out", str(out)])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def compare_page(deep_report, tmp_path_factory) -> Path:
    """``audit compare`` of the deep report and a report of random tensors (every test, skipped rows none)."""
    root = tmp_path_factory.mktemp("html-compare")
    gen = torch.Generator().manual_seed(0)
    contexts = torch.randn(16, 3, 6, generator=gen, dtype=torch.float64)  # (N, n, d)
    auditor.audit_tokens(contexts, contexts[:, 0].clone(), subsets=20, out=root / "tensors", progress=False)
    compare([root / "tensors", deep_report], root / "cmp")
    return root / "cmp"


def _csv_rows(folder: Path) -> list[dict[str, str]]:
    with open(folder / "results.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _cells(page: str) -> list[dict[str, str]]:
    """The verdict cells of a page: their data attributes and their text."""
    out = []
    for match in re.finditer(r"<td ([^>]*data-test=[^>]*)>(.*?)</td>", page):
        if 'data-statement="' not in match.group(1):
            continue  # a robustness cell
        attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', match.group(1)))
        attrs["text"] = re.sub(r"<[^>]+>", " ", match.group(2))
        out.append(attrs)
    return out


def _printed_percent_agrees(text: str, fraction: float) -> bool:
    """The first percentage of ``text`` equals 100 x fraction to within half a unit of its last digit."""
    match = re.search(r"(\d+(?:\.(\d+))?)%", text)
    assert match, text
    decimals = len(match.group(2) or "")
    return abs(float(match.group(1)) - 100 * fraction) <= 0.5 * 10.0**-decimals * (1 + 1e-9)


def _check_numbers(page: str, folder: Path, report: str | None = None) -> int:
    """Every row of ``folder``'s results.csv has its cell on ``page`` with the same fraction, statement and
    k; returns how many cells were checked."""
    cells = {(c.get("report", ""), c["representation"], c["weights"], c["test"]): c for c in _cells(page)}
    checked = 0
    for row in _csv_rows(folder):
        key = (report if report is not None else "", row["representation"], row["weights"], row["test"])
        if report is not None and row["status"] != "ok":
            continue  # compare folds skipped rows into one line
        cell = cells[key]
        if row["status"] != "ok":
            assert cell["statement"] == "" and "skipped" in cell["text"]
            continue
        assert float(cell["fraction"]) == float(row["fraction"])  # the repr round trip: the same float
        assert int(cell["k"]) == int(float(row["k"]))
        if "statement" in row:
            assert cell["statement"] == row["statement"]
        assert cell["statement"] in ("refuted", "proven", "not decided")
        fraction = float(row["fraction"])
        if row["test"] == "assumption2":  # every context counted: x/N
            full, num = map(int, re.search(r"(\d+)/(\d+) contexts", cell["text"]).groups())
            assert num == int(float(row["N"])) and full == round(fraction * num)
        else:
            assert _printed_percent_agrees(cell["text"], fraction)
        assert f"threshold {float(row['threshold']):g}" in cell["text"]
        if cell["statement"] == "refuted":
            assert "holds" not in cell["text"]
        checked += 1
    return checked


def test_the_audit_page_holds_the_numbers_of_results_csv(deep_report):
    page = (deep_report / "report.html").read_text()
    rows = _csv_rows(deep_report)
    assert len(rows) == (BLOCKS + 1) * 2  # the embedding and 32 blocks, two tests each
    assert _check_numbers(page, deep_report) == sum(r["status"] == "ok" for r in rows)
    assert (deep_report / "report.html").stat().st_size < PAGE_LIMIT
    sections = re.findall(r'<section id="([a-z]+)">', page)
    assert sections[0] == "verdicts" and sections.index("robustness") < sections.index("depth")
    assert {"bounds", "provenance", "files"} <= set(sections)
    for png in deep_report.glob("*.png"):  # every figure of the folder, inlined as SVG
        assert f'data-figure="{png.stem}"' in page
    assert "<script" not in page and not re.search(r'(src|href)="(https?:)?//', page)  # nothing to fetch
    for target in re.findall(r'href="([^"#][^"]*)"', page):
        assert (deep_report / target).is_file(), target
    robust = {(m.group(1), m.group(2)): m.group(0) for m in re.finditer(
        r'<td data-representation="([^"]*)" data-weights="[^"]*" data-test="([^"]*)"[^>]*>', page)}
    bounds = {(m.group(1), m.group(2)): (m.group(3), m.group(4)) for m in re.finditer(
        r'<tr data-representation="([^"]*)" data-test="([^"]*)">'
        r'.*?data-lower="([^"]*)".*?data-upper="([^"]*)"', page)}
    for row in rows:  # the critical tolerances and the two-sided bounds, as results.csv holds them
        key = (row["representation"], row["test"])
        for column in ("critical_rtol", "critical_rtol_low", "critical_rtol_high"):
            if key not in robust:  # no tolerance analysis for this row
                assert row[column] == "", (key, column)
                continue
            shown = re.search(f'data-{column.replace("_", "-")}="([^"]*)"', robust[key]).group(1)
            assert (shown == "" and row[column] == "") or float(shown) == float(row[column]), (key, column)
        if row["test"] == "assumption1":
            assert bounds[key] == tuple(str(int(float(row[c]))) if row[c] else "" for c in
                                        ("krank_lower", "krank_upper")), key
    depth = pd.read_csv(deep_report / "depth.csv")
    for row in depth.to_dict("records"):  # the depth table: every depth with its certified lower bound
        assert f"<th>{row['representation']}</th>" in page


def test_the_compare_page_holds_each_reports_numbers(compare_page, deep_report):
    page = (compare_page / "report.html").read_text()
    reports = re.findall(r'<table class="verdicts" data-report="([^"]*)"', page)
    assert len(reports) == 2
    labels = dict(zip(("tensors", "vit32"), reports, strict=True))
    assert _check_numbers(page, compare_page.parent / "tensors", labels["tensors"]) == 4
    assert _check_numbers(page, deep_report, labels["vit32"]) == (BLOCKS + 1) * 2
    for png in compare_page.glob("*.png"):
        assert f'data-figure="{png.stem}"' in page
    for target in re.findall(r'href="([^"#][^"]*)"', page):
        assert (compare_page / target).is_file(), target
    assert (compare_page / "report.html").stat().st_size < PAGE_LIMIT


def test_a_committed_report_from_before_the_page_compares_without_a_dead_link(tmp_path):
    """A reference report written before report.html (and before the statement column) gets a compare page
    whose statements are derived from its rows and whose links all resolve."""
    reference = Path(__file__).resolve().parents[2] / "reports" / "gpt2-wikitext2"
    compare([reference], tmp_path / "cmp", plots=False)
    page = (tmp_path / "cmp" / "report.html").read_text()
    for target in re.findall(r'href="([^"#][^"]*)"', page):
        assert (tmp_path / "cmp" / target).is_file(), target
    label = re.search(r'<table class="verdicts" data-report="([^"]*)"', page).group(1)
    assert _check_numbers(page, reference, label) > 0
    assert "holds" not in page


# ---------------------------------------------------------------------------------------------------
# The wording, on rows made to contradict themselves
# ---------------------------------------------------------------------------------------------------


def test_a_share_that_meets_its_threshold_never_hides_its_witness():
    """12 vectors in d = 6 with one a sum of two others, tested at k = 3 (issue 39): the share meets the
    threshold, a witness refutes Kruskal rank >= 3; a file written before the ``statement`` and
    ``share_meets_threshold`` columns (``holds``) reads the same."""
    row = {"status": "ok", "test": "assumption1", "k": 3, "N": 12, "fraction": 219 / 220, "threshold": 0.99,
           "holds": True, "witness": "1 2 5", "krank_lower": 2, "krank_upper": 2, "rank_counts": "2:1;3:219",
           "exhaustive": True}
    assert statement(row) == "refuted"
    words = statement_words(row)
    assert words.startswith("refuted: Kruskal rank < 3") and "1 2 5" in words and "holds" not in words
    assert share_words(row) == "99.5% of all 3-subsets full rank (220 enumerated); threshold 0.99, met"
    proven = {**row, "holds": None, "share_meets_threshold": True, "fraction": 1.0, "witness": None,
              "krank_lower": 4, "krank_upper": None, "rank_counts": "3:5000", "exhaustive": False}
    assert statement(proven) == "proven" and "certified >= 4" in statement_words(proven)
    assert share_words(proven) == "100% of 5000 sampled 3-subsets full rank; threshold 0.99, met"
    open_row = {**proven, "krank_lower": 2}
    assert statement(open_row) == "not decided"
    assert statement({**open_row, "statement": "refuted"}) == "refuted"  # the column, where a row has it


@pytest.mark.parametrize(("fraction", "text"), [(219 / 220, "99.5%"), (0.99996, "99.996%"), (1.0, "100%"),
                                                (0.00004, "0.004%"), (0.0, "0%"), (0.5, "50.0%")])
def test_a_share_below_one_is_never_printed_as_100_percent(fraction, text):
    assert percent(fraction) == text
    assert _printed_percent_agrees(text, fraction)


# ---------------------------------------------------------------------------------------------------
# In a real browser
# ---------------------------------------------------------------------------------------------------


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    reason = "no Chromium browser on PATH (Debian: apt-get install chromium; .ci/run installs it)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI is set, so the page must be tested in a browser")
    pytest.skip(reason)


class DevTools:
    """Headless Chromium driven through its DevTools protocol over a pipe: fd 3 carries our commands, fd 4
    its answers and events, each a JSON message ended by a NUL byte."""

    def __init__(self, executable: str, profile: Path) -> None:
        to_browser, self._to_browser = os.pipe()
        self._from_browser, from_browser = os.pipe()
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in (to_browser, from_browser)]
        for fd in (to_browser, from_browser):
            os.close(fd)

        def child_fds() -> None:  # in the child, before exec: its fds 3 and 4 are the pipes' ends
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.process = subprocess.Popen(
            [executable, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe",
             f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            pass_fds=(3, 4), preexec_fn=child_fds)
        for fd in high:
            os.close(fd)
        self._messages: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._next = 0
        self.events: list[dict] = []
        self.session: str | None = None

    def _read(self) -> None:
        buffer = b""
        while True:
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                self._messages.put(None)
                return
            buffer += chunk
            while b"\0" in buffer:
                message, buffer = buffer.split(b"\0", 1)
                self._messages.put(json.loads(message))

    def call(self, method: str, timeout: float = 60, **params) -> dict:
        """Send one command (to the attached page, once there is one) and return its result; the events
        that arrive meanwhile are kept in ``events``."""
        self._next += 1
        message = {"id": self._next, "method": method, "params": params}
        if self.session is not None and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._messages.get(timeout=timeout)
            assert answer is not None, "Chromium closed the DevTools pipe"
            if answer.get("id") == self._next:
                assert "error" not in answer, f"{method}: {answer['error']}"
                return answer["result"]
            self.events.append(answer)

    def wait_for(self, event: str, timeout: float = 60) -> None:
        while not any(e.get("method") == event for e in self.events):
            answer = self._messages.get(timeout=timeout)
            assert answer is not None, "Chromium closed the DevTools pipe"
            self.events.append(answer)

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
            self.call(domain)
        self.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1,
                  mobile=False)
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and the browser's own error log entries (failed loads)."""
        out = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(str(params.get("exceptionDetails")))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(str(params.get("args")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.append(str(params["entry"]))
        return out

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"]["value"]

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        with contextlib.suppress(AssertionError, queue.Empty, OSError):
            self.call("Browser.close", timeout=10)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)


PAGE_FACTS = """(() => {
  const svgBox = f => { const s = f.querySelector('svg'); const r = s ? s.getBoundingClientRect() : null;
    return {name: f.dataset.figure, width: r ? r.width : 0, height: r ? r.height : 0,
            marks: s ? s.querySelectorAll('path, use, text').length : 0}; };
  return {
    verdictTables: document.querySelectorAll('table.verdicts').length,
    verdictCells: document.querySelectorAll('table.verdicts td[data-statement]').length,
    figures: [...document.querySelectorAll('figure.plot')].map(svgBox),
    scrollWidth: document.documentElement.scrollWidth,
    clientWidth: document.documentElement.clientWidth,
    firstCell: (document.querySelector('table.verdicts td[data-statement]') || {}).innerText,
    resources: performance.getEntriesByType('resource').map(e => e.name),
  };
})()"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    executable = _chromium()
    tools = DevTools(executable, tmp_path_factory.mktemp("chromium-profile"))
    yield tools
    tools.close()


def _open_and_check(browser: DevTools, folder: Path, screenshot: Path) -> dict:
    browser.open((folder / "report.html").as_uri())
    facts = browser.evaluate(PAGE_FACTS)
    assert browser.errors() == []
    assert facts["verdictTables"] >= 1 and facts["verdictCells"] > 0
    assert facts["resources"] == []  # nothing fetched: no image, font, style or script outside the page
    assert facts["scrollWidth"] <= facts["clientWidth"]  # nothing wider than the window
    drawn = {f["name"]: f for f in facts["figures"]}
    assert set(drawn) == {png.stem for png in folder.glob("*.png")}
    for figure in drawn.values():  # each figure drawn, of a readable size, inside the window
        assert 200 <= figure["width"] <= facts["clientWidth"] and figure["height"] >= 100, figure
        assert figure["marks"] > 20, figure
    browser.screenshot(screenshot)
    assert screenshot.stat().st_size > 10_000
    copy_to = os.environ.get("AUDITOR_SCREENSHOTS")
    if copy_to:
        Path(copy_to).mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, Path(copy_to) / screenshot.name)
    return facts


def test_the_audit_page_renders_in_chromium(browser, deep_report, tmp_path):
    facts = _open_and_check(browser, deep_report, tmp_path / "report-html-audit.png")
    assert facts["verdictCells"] == (BLOCKS + 1) * 2
    assert facts["firstCell"].startswith(("proven", "refuted", "not decided"))  # the statement comes first
    assert {"depth_kruskal", "depth_fractions", "depth_geometry", "rtol_sweep"} <= {
        f["name"] for f in facts["figures"]}


def test_the_compare_page_renders_in_chromium(browser, compare_page, tmp_path):
    facts = _open_and_check(browser, compare_page, tmp_path / "report-html-compare.png")
    assert facts["verdictTables"] == 2
    assert {f["name"] for f in facts["figures"]} == {"compare_kruskal", "compare_depth"}
