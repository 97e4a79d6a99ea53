"""Benchmark: memory of an audit grows with the audited depth, not with the checkpoint.

Random Llama-style checkpoints at a 7B-class width (d = 4096, MLP 14336, 32 heads / 8 KV heads,
vocabulary 32000, Llama-3-8B's block) with a growing number of blocks are written in bfloat16, sharded
(1 GB shards and their index, the layout of ``save_pretrained``), under a scratch folder. For each:

- ``audit DIR -w pretrained --layers 0`` (embedding and block 0; tokens computed in float32) in a
  fresh process: its peak resident memory (``ru_maxrss``) and wall time;
- the whole-model baseline in a fresh process: ``LlamaModel.from_pretrained(DIR)`` cast to float32 (as
  a hook library or the auditor's ViT/BERT/GPT-2 path does) and one forward over the same batch
  size, with its peak memory and wall time;

against the checkpoint's size on disk. Each checkpoint is deleted once measured.

    python benchmarks/bench_memory.py [--blocks 1,2,4,6] [--scratch /tmp/bench-memory] [--samples 64]

Writes reports/benchmarks-memory.md (unless --no-report).

With ``--device cuda`` the audit runs with ``--device cuda`` (the embedding and block 0 placed on the GPU)
and the baseline moves the whole model to the GPU in float32; beside the peak RSS, the peak GPU memory in
use while each command runs is read from NVML every 10 ms (the CUDA context included, the memory in use
before the command subtracted), and the table is printed (``--table FILE`` also writes it) instead of
replacing the CPU report.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
GIB = 2**30
SHARD_BYTES = 1 << 30

BASELINE = r"""
import resource, sys, time, torch, transformers
torch.set_num_threads(int(sys.argv[3]))
device = torch.device(sys.argv[4])
begin = time.perf_counter()
model = transformers.LlamaModel.from_pretrained(sys.argv[1]).to(device, torch.float32).eval()
ids = torch.randint(0, 32000, (int(sys.argv[2]), 32), device=device)
with torch.inference_mode():
    model(input_ids=ids[:32], use_cache=False)
if device.type == "cuda":
    torch.cuda.synchronize()
print(time.perf_counter() - begin, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def llama_7b_width(blocks: int):
    import transformers

    return transformers.LlamaConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=blocks,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096, dtype="bfloat16",
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, bos_token_id=1, eos_token_id=2,
    )


def write_checkpoint(folder: Path, blocks: int, seed: int = 0) -> tuple[int, int]:
    """A random bfloat16 checkpoint of ``blocks`` blocks in 1 GB shards with its index;
    (parameters, bytes)."""
    import torch
    import transformers
    from safetensors.torch import save_file

    from auditor.models.partial import parameters_on_meta

    config = llama_7b_width(blocks)
    with parameters_on_meta():
        shapes = {name: tuple(p.shape) for name, p in transformers.LlamaModel(config).named_parameters()}
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    gen = torch.Generator().manual_seed(seed)
    shard: dict[str, torch.Tensor] = {}
    parts: list[tuple[Path, list[str]]] = []  # written shards (temporary names) and the tensors they hold

    def flush() -> None:
        path = folder / f"part-{len(parts):05d}.tmp"
        save_file(shard, path, metadata={"format": "pt"})
        parts.append((path, list(shard)))
        shard.clear()

    size = total = 0
    for name, shape in shapes.items():
        tensor = torch.ones(shape, dtype=torch.bfloat16) if name.endswith("norm.weight") else (
            torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
        if shard and size + tensor.numel() * 2 > SHARD_BYTES:
            flush()
            size = 0
        shard[name] = tensor
        size += tensor.numel() * 2
        total += tensor.numel()
    flush()
    weight_map: dict[str, str] = {}
    written = 0
    for index, (path, names) in enumerate(parts, start=1):
        filename = f"model-{index:05d}-of-{len(parts):05d}.safetensors"
        path.rename(folder / filename)
        weight_map.update({name: filename for name in names})
        written += (folder / filename).stat().st_size
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total * 2}, "weight_map": weight_map}, indent=1))
    return total, written


def measure(command: list[str], gpu: bool = False) -> tuple[float, float, float]:
    """(wall seconds, peak RSS in GiB, peak GPU memory in GiB or NaN) of ``command`` run in a fresh process
    (through :data:`_ONE`, which reports the peak of that one child: ``ru_maxrss`` of children is a maximum
    over all of them; with ``gpu`` it also polls NVML while the child runs)."""
    begin = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _ONE, "1" if gpu else "0", *command], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - begin
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    peak = [line for line in done.stdout.splitlines() if line.startswith("PEAK ")][-1].split()
    return wall, int(peak[1]) * 1024 / GIB, int(peak[2]) / GIB if gpu else float("nan")


class Row(NamedTuple):
    """The measurements of one checkpoint (sizes and memory in GiB, times in seconds; NaN: not measured)."""

    blocks: int
    params: int
    disk: float
    peak: float
    wall: float
    base_peak: float
    base_wall: float
    load: float  # the machine's 1-minute load when the measurements ended
    gpu_peak: float
    base_gpu: float


# the columns of the CPU report and of the GPU table (headers of :func:`cells`)
CPU_COLUMNS = ("blocks", "parameters", "on disk (GiB)", "audit peak RSS (GiB)", "audit / disk",
               "audit wall (s)", "whole model peak RSS (GiB)", "whole model wall (s)", "load (1 min)")
GPU_COLUMNS = ("blocks", "parameters", "on disk (GiB)", "audit GPU peak (GiB)", "audit GPU / disk",
               "audit peak RSS (GiB)", "audit wall (s)", "whole model GPU peak (GiB)",
               "whole model peak RSS (GiB)", "whole model wall (s)", "load (1 min)")
BASELINE_COLUMNS = ("whole model GPU peak (GiB)", "whole model peak RSS (GiB)", "whole model wall (s)")


def cells(row: Row, baseline_run: bool = True) -> dict[str, str]:
    """Every column's text for ``row``, by header; the baseline's read "not run" unless ``baseline_run``."""
    text = {
        "blocks": f"{row.blocks}",
        "parameters": f"{row.params / 1e9:.2f}B",
        "on disk (GiB)": f"{row.disk:.2f}",
        "audit GPU peak (GiB)": f"{row.gpu_peak:.2f}",
        "audit GPU / disk": f"{row.gpu_peak / row.disk:.2f}",
        "audit peak RSS (GiB)": f"{row.peak:.2f}",
        "audit / disk": f"{row.peak / row.disk:.2f}",
        "audit wall (s)": f"{row.wall:.0f}",
        "whole model GPU peak (GiB)": f"{row.base_gpu:.2f}",
        "whole model peak RSS (GiB)": f"{row.base_peak:.2f}",
        "whole model wall (s)": f"{row.base_wall:.0f}",
        "load (1 min)": f"{row.load:.1f}",
    }
    if not baseline_run:
        text.update(dict.fromkeys(BASELINE_COLUMNS, "not run"))
    return text


def table(rows: list[Row], columns: tuple[str, ...], baseline_run: bool = True) -> list[str]:
    """The markdown table of ``rows`` in ``columns`` (headers of :func:`cells`), all right-aligned."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---:|" * len(columns)]
    for row in rows:
        text = cells(row, baseline_run)
        lines.append("| " + " | ".join(text[column] for column in columns) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", default="1,2,4,6")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/bench-memory"))
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: audit and baseline on the GPU, GPU memory read from NVML (default cpu)")
    parser.add_argument("--table", type=Path, help="--device cuda: also write the table to this file")
    parser.add_argument("--no-baseline", action="store_true", help="skip the whole-model forward")
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()
    depths = [int(b) for b in args.blocks.split(",")]
    gpu = args.device == "cuda"
    rows: list[Row] = []
    audit = [sys.executable, "-m", "auditor.cli"]
    for blocks in depths:
        folder = args.scratch / f"llama-d4096-{blocks}blocks"
        shutil.rmtree(folder, ignore_errors=True)
        written = time.perf_counter()
        params, on_disk = write_checkpoint(folder, blocks)
        written = time.perf_counter() - written
        # ru_maxrss of children is a running maximum: each measurement runs in its own helper process
        wall, peak, gpu_peak = measure(
            [*audit, str(folder), "-w", "pretrained", "--layers", "0", "--samples", str(args.samples),
             "--subsets", "200", "--no-robustness", "-q", "--threads", str(args.threads),
             "--device", args.device, "--out", str(args.scratch / f"report-{blocks}")],
            gpu,
        )
        base_wall = base_peak = base_gpu = float("nan")
        if not args.no_baseline:
            base_wall, base_peak, base_gpu = measure(
                [sys.executable, "-c", BASELINE, str(folder), str(args.samples), str(args.threads),
                 args.device],
                gpu,
            )
        load = os.getloadavg()[0]
        rows.append(
            Row(blocks, params, on_disk / GIB, peak, wall, base_peak, base_wall, load, gpu_peak, base_gpu))
        print(
            f"{blocks} blocks, {params / 1e9:.2f}B params, {on_disk / GIB:.2f} GiB on disk (written in "
            f"{written:.0f} s): audit peak RSS {peak:.2f} GiB, GPU {gpu_peak:.2f} GiB, in {wall:.0f} s; "
            f"whole model RSS {base_peak:.2f} GiB, GPU {base_gpu:.2f} GiB, in {base_wall:.0f} s; "
            f"load {load:.1f}",
            flush=True,
        )
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(args.scratch / f"report-{blocks}", ignore_errors=True)
        if gpu:  # the table so far, so that a run stopped early keeps its rows
            table = gpu_table(rows, args)
            print("\n".join(table), flush=True)
            if args.table:
                args.table.write_text("\n".join(table) + "\n")
    if not args.no_report and not gpu:
        write_report(rows, args)


def gpu_table(rows: list[Row], args) -> list[str]:
    """The markdown table of a ``--device cuda`` run."""
    import torch

    from auditor.core.provenance import provenance

    stamp = provenance()
    return [
        f"GPU: {torch.cuda.get_device_name(0)}; `python benchmarks/bench_memory.py --device cuda --blocks "
        f"{args.blocks} --samples {args.samples} --threads {args.threads}`; git "
        f"{stamp.get('git_commit', '')[:12]}; {stamp.get('versions', '')}",
        "",
        *table(rows, GPU_COLUMNS),
    ]


# A helper that runs one command and prints the peak RSS of that command alone (its only child).
_ONE = r"""
import resource, subprocess, sys, threading
gpu = sys.argv[1] == "1"
peak = [0]
if gpu:
    import pynvml
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    before = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    stop = threading.Event()
    def poll():
        while not stop.wait(0.01):
            peak[0] = max(peak[0], pynvml.nvmlDeviceGetMemoryInfo(handle).used - before)
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
done = subprocess.run(sys.argv[2:])
if gpu:
    stop.set()
    poller.join()
print("PEAK", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, peak[0], flush=True)
sys.exit(done.returncode)
"""


def write_report(rows: list[Row], args) -> None:
    from auditor.core.provenance import provenance

    stamp = provenance()
    lines = [
        "# Benchmark: memory of an audit against the checkpoint's size",
        "",
        "Random Llama-style checkpoints at a 7B-class width (d = 4096, MLP 14336, 32 heads / 8 KV heads,",
        "vocabulary 32000), bfloat16, in 1 GB safetensors shards with their index. `audit DIR -w pretrained",
        f"--layers 0 --samples {args.samples} --subsets 200 --no-robustness` reads the embedding "
        "and block 0 and",
        "computes the tokens in float32; the whole-model baseline is "
        "`LlamaModel.from_pretrained(DIR)` cast to",
        "float32 and one forward. Peak resident memory of each fresh process (`ru_maxrss`).",
        "",
        *table(rows, CPU_COLUMNS, baseline_run=not args.no_baseline),
        "",
        f"Command: `python benchmarks/bench_memory.py --blocks {args.blocks} --samples {args.samples} "
        f"--threads {args.threads}{' --no-baseline' if args.no_baseline else ''}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} logical CPUs; "
        f"git {stamp.get('git_commit', '')[:12]}; "
        f"{stamp.get('versions', '')}",
        "",
        "Wall times depend on the machine's load (shared by several jobs here); the memory figures do not.",
    ]
    path = REPO / "reports" / "benchmarks-memory.md"
    # the file holds other sections too (streaming against N): only the table and its context are replaced,
    # up to the "Reading the figures" notes, which are written by hand and kept
    old = path.read_text() if path.is_file() else ""
    keep = old[old.index("\n## Reading the figures"):] if "\n## Reading the figures" in old else ""
    path.write_text("\n".join(lines) + "\n" + keep)


if __name__ == "__main__":
    main()
