"""Peak memory of an audit against N, split into reading the inputs and everything after.

``/usr/bin/time -v`` gives one peak for the whole run. Here the peak resident set (``VmHWM``) is read
once the inputs are decoded and then reset (Linux ``/proc/self/clear_refs``), so the second figure is
the peak of extraction and tests alone: what streaming bounds. Run with the options of ``audit``::

    python benchmarks/bench_streaming.py --samples 1000 --memory-budget 0.25 --data DIR -r embedding

``--repeat R`` reads every image of DIR R times (a temporary folder of R symlinks to each, read in order):
N = 10,000 from 1,000 images. It prints one JSON line: N, whether the contexts streamed, the two peaks
(MiB), the wall and CPU time, the load average before and after, and the rows' verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path


def _repeated(data: Path, repeat: int) -> Path:
    """A temporary folder holding ``repeat`` copies (symlinks) of every image under ``data``."""
    from auditor.data.images import list_image_files

    folder = Path(tempfile.mkdtemp(prefix="bench-streaming-"))
    for copy in range(repeat):
        for file in list_image_files(data):
            link = folder / f"copy{copy}" / file.relative_to(data)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(file.resolve())
    return folder


def _status(key: str) -> int:
    """A field of /proc/self/status in KiB (VmHWM: peak resident set; VmRSS: now)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vit-base")
    parser.add_argument("--data", required=True)
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("-r", "--representations", default="embedding")
    parser.add_argument("--tests", default="assumption2,assumption1,assumption3")
    parser.add_argument("--subsets", type=int, default=20)
    parser.add_argument("--memory-budget", type=float, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    parser.add_argument("--repeat", type=int, default=1, help="read every image this many times")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    data = _repeated(Path(args.data), args.repeat) if args.repeat > 1 else Path(args.data)

    import torch

    import auditor.audit.sources as sources
    from auditor.audit.config import AuditConfig
    from auditor.audit.runner import run

    torch.set_num_threads(args.threads)
    peaks: dict[str, float] = {}
    read_inputs = sources.load_inputs_for

    def timed_inputs(*a, **k):  # the inputs' peak, then a fresh peak for what follows
        found = read_inputs(*a, **k)
        peaks["inputs_peak_mib"] = _status("VmHWM") / 1024
        peaks["after_inputs_rss_mib"] = _status("VmRSS") / 1024
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
        return found

    sources.load_inputs_for = timed_inputs
    config = AuditConfig(
        model=args.model,
        data=str(data),
        samples=args.samples,
        first=True,
        weights=("random",),
        representations=tuple(args.representations.split(",")),
        tests=tuple(args.tests.split(",")),
        subsets=args.subsets,
        device="cpu",
        memory_budget=args.memory_budget,
        threads=args.threads,
    )
    begin = time.perf_counter()
    try:
        result = run(config, out=args.out, progress=False)
    finally:
        if data != Path(args.data):
            shutil.rmtree(data)
    wall = time.perf_counter() - begin
    usage = resource.getrusage(resource.RUSAGE_SELF)
    streamed = bool(result.out and "contexts" in json.loads((Path(result.out) / "config.json").read_text()))
    print(
        json.dumps(
            {
                "N": args.samples,
                "representations": args.representations,
                "streamed": streamed,
                "memory_budget_gib": args.memory_budget,
                **{k: round(v) for k, v in peaks.items()},
                "extract_and_test_peak_mib": round(_status("VmHWM") / 1024),
                "whole_run_peak_mib": round(usage.ru_maxrss / 1024),  # ru_maxrss: KiB on Linux
                "wall_s": round(wall, 1),
                "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
                "load_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                "verdicts": {f"{r.representation}/{r.test}": bool(r.share_meets_threshold)
                             for r in result.rows.itertuples()},
            }
        )
    )


if __name__ == "__main__":
    main()
