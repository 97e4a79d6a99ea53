"""Benchmark: early-exit extraction vs a full forward with ``output_hidden_states=True``.

Both read ``embedding`` and ``block.0`` of a random-init ViT-base (the real 12-block config) on the
same ImageNet images, in the same process, with the same batches; the runs are interleaved (A, B, A,
B, ...) so background load hits both alike, and the median of each is reported with their ratio.
The tokens of both paths are checked equal first, so the speed-up is for the same result.

    python benchmarks/bench_extraction.py [--samples 64] [--batch-size 16] [--repeats 5] [--device cpu]

Writes reports/benchmarks-extraction.md (unless --no-report).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from auditor.audit.extract import extract
from auditor.core.provenance import provenance
from auditor.data import load_inputs
from auditor.models import load_model

REPO = Path(__file__).resolve().parent.parent
DATA_CANDIDATES = (
    Path("/work/shared/data/imagenet-sample"),
    REPO.parent / "shared" / "data" / "imagenet-sample",
)


def full_forward(loaded, inputs, batch_size: int) -> dict[str, torch.Tensor]:
    """The baseline: every block runs; hidden_states[0] and [1] are copied out like extraction does."""
    out = {
        name: torch.empty((inputs.N, loaded.n, loaded.d), dtype=loaded.dtype)
        for name in ("embedding", "block.0")
    }
    row = 0
    with torch.inference_mode():
        for batch in inputs.batches(batch_size):
            pixels = batch["pixel_values"].to(loaded.device, loaded.dtype)
            hidden = loaded.model(pixel_values=pixels, output_hidden_states=True).hidden_states
            size = pixels.shape[0]
            out["embedding"][row : row + size].copy_(hidden[0])
            out["block.0"][row : row + size].copy_(hidden[1])
            row += size
    return out


def _timed(fn) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=next((str(p) for p in DATA_CANDIDATES if p.is_dir()), None))
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--report", default=str(REPO / "reports" / "benchmarks-extraction.md"))
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()
    if args.data is None:
        raise SystemExit("no ImageNet sample found; pass --data <folder of images>")

    loaded = load_model("vit-base", "random", device=args.device, seed=0)
    inputs = load_inputs(loaded, args.data, args.samples, progress=False)
    reps = ["embedding", "block.0"]

    early = extract(loaded, inputs, reps, batch_size=args.batch_size, progress=False)  # warm-up + check
    full = full_forward(loaded, inputs, args.batch_size)
    for name in reps:
        torch.testing.assert_close(early[name].contexts, full[name], rtol=0, atol=0)

    t_early, t_full = [], []
    for _ in range(args.repeats):
        t_early.append(
            _timed(lambda: extract(loaded, inputs, reps, batch_size=args.batch_size, progress=False))
        )
        t_full.append(_timed(lambda: full_forward(loaded, inputs, args.batch_size)))
    early_s, full_s = statistics.median(t_early), statistics.median(t_full)
    ratio = full_s / early_s

    lines = [
        f"model: vit-base (random init, real config: {loaded.num_layers} blocks, d={loaded.d}, n={loaded.n})",
        f"data: {inputs.N} images from {args.data}, batch size {args.batch_size}, device {loaded.device}, "
        f"dtype {loaded.dtype_name}, torch threads {torch.get_num_threads()}",
        f"early-exit extract(embedding, block.0): median {early_s:.3f} s  (runs: {_fmt(t_early)})",
        f"full forward, output_hidden_states=True: median {full_s:.3f} s  (runs: {_fmt(t_full)})",
        f"speed-up (full / early-exit): {ratio:.1f}x",
    ]
    for line in lines:
        print(line)
    if not args.no_report:
        _write_report(Path(args.report), args, lines)


def _fmt(times: list[float]) -> str:
    return ", ".join(f"{t:.3f}" for t in times)


def _write_report(path: Path, args: argparse.Namespace, lines: list[str]) -> None:
    prov = provenance()
    cpu = f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs"
    body = [
        "# Benchmark: token extraction with early exit",
        "",
        "Reading `embedding` and `block.0` of ViT-base: hooks that stop the forward after block 0",
        "(`auditor.audit.extract.extract`) against a full forward with "
        "`output_hidden_states=True`, same images,",
        "same batches, same process, interleaved runs; both give bit-identical tokens (checked).",
        "",
        "```",
        *lines,
        "```",
        "",
        f"Command: `python benchmarks/bench_extraction.py --samples {args.samples} "
        f"--batch-size {args.batch_size} "
        f"--repeats {args.repeats} --device {args.device}`",
        "",
        f"Machine: {cpu}; git {prov['git_commit']}; {prov['versions']}",
        "",
        "Absolute times depend on the machine's load; the ratio is measured",
        "on interleaved runs and is the figure to read.",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(body))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
