"""Peak memory of an audit against N, split into reading the inputs and everything after.

``/usr/bin/time -v`` gives one peak for the whole run. Here the peak resident set (``VmHWM``) is read
once the inputs are decoded and then reset (Linux ``/proc/self/clear_refs``), so the second figure is
the peak of extraction and tests alone: what streaming bounds. Run with the options of ``audit``::

    python benchmarks/bench_streaming.py --samples 1000 --memory-budget 0.25 --data DIR -r embedding

It prints one JSON line: N, whether the contexts streamed, the two peaks (MiB), the wall time, and the
rows' verdicts.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


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
    args = parser.parse_args()

    import torch

    import auditor.audit.sources as sources
    from auditor.audit.config import AuditConfig
    from auditor.audit.runner import run

    torch.set_num_threads(args.threads)
    peaks: dict[str, float] = {}
    read_inputs = sources._inputs

    def timed_inputs(*a, **k):  # the inputs' peak, then a fresh peak for what follows
        found = read_inputs(*a, **k)
        peaks["inputs_peak_mib"] = _status("VmHWM") / 1024
        peaks["after_inputs_rss_mib"] = _status("VmRSS") / 1024
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
        return found

    sources._inputs = timed_inputs
    config = AuditConfig(
        model=args.model,
        data=args.data,
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
    result = run(config, out=args.out, progress=False)
    wall = time.perf_counter() - begin
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
                "wall_s": round(wall, 1),
                "verdicts": {f"{r.representation}/{r.test}": bool(r.holds) for r in result.rows.itertuples()},
            }
        )
    )


if __name__ == "__main__":
    main()
