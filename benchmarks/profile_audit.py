"""Profile: one audit, stage by stage: wall and CPU seconds, aten ops dispatched (each a kernel launch on
a GPU) and host reads of device values (what would stall a GPU), per stage of the audit's own clock,
with the certified Kruskal lower bounds (``probes.kruskal_lower_bound``) counted apart from the tests
that ask for them (issue 44).

Runs ``audit`` in this process (the arguments after ``--`` are the audit's; default: README command 1,
``audit vit-base``, on one thread, so that every op runs in the counting thread). ``--gpu-route`` (before
``--``) runs the probes on the CPU by the route they take off the CPU (see ``profile_probes.py``).
Host reads: ``.item()`` and ``bool``/``int``/``float`` of a tensor, ``nonzero``, ``unique``, boolean
indexing, ``.tolist()``, ``.cpu()`` of a device tensor (on the CPU some of these read host tensors: an
upper bound there).

    python benchmarks/profile_audit.py                                   # audit vit-base --threads 1
    python benchmarks/profile_audit.py --gpu-route
    python benchmarks/profile_audit.py -- vit-base --device cuda --no-robustness   # on a GPU machine
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import probes.bounds  # noqa: E402
from auditor import cli  # noqa: E402
from auditor.audit import verdicts  # noqa: E402

READ_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
            "unique_consecutive", "is_nonzero", "equal", "repeat_interleave"}
BOUNDS = "certified lower bounds (inside the tests)"


class PerStage(TorchDispatchMode):
    """aten ops and host reads, by the stage running when they were dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.stage = ["setup"]
        self.ops: collections.Counter[str] = collections.Counter()
        self.reads: collections.Counter[str] = collections.Counter()
        self.cpu: collections.Counter[str] = collections.Counter()
        self.wall: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        stage = self.stage[-1]
        self.ops[stage] += 1
        if name in READ_OPS or (name in ("index", "index_put", "index_put_") and any(
                i is not None and i.dtype == torch.bool for i in args[1])):
            self.reads[stage] += 1
        return func(*args, **(kwargs or {}))

    def enter(self, stage: str):
        mode = self

        class _Stage:
            def __enter__(self):
                mode.stage.append(stage)
                self.t = (time.process_time(), time.perf_counter())
                return self

            def __exit__(self, *exc):
                mode.cpu[stage] += time.process_time() - self.t[0]
                mode.wall[stage] += time.perf_counter() - self.t[1]
                mode.stage.pop()
                return False

        return _Stage()


def main() -> None:
    argv = sys.argv[1:]
    route = bool(argv) and argv[0] == "--gpu-route"
    argv = argv[1:] if route else argv
    if argv and argv[0] == "--":
        argv = argv[1:]
    if route:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from profile_probes import gpu_route

        gpu_route(small_chunks=False)
    out = tempfile.mkdtemp(prefix="profile-audit-")
    argv = argv or ["vit-base", "--threads", "1"]
    if "--out" not in argv:  # (a fresh folder: no finished tests to reuse)
        argv += ["--out", out]
    mode = PerStage()
    plain_stage = verdicts.StageClock.stage

    def stage(self, name):  # the audit's clock, and the counts of the same stage
        import contextlib

        @contextlib.contextmanager
        def both():
            with plain_stage(self, name), mode.enter(name):
                yield

        return both()

    verdicts.StageClock.stage = stage
    plain_bound = probes.bounds.kruskal_lower_bound

    def bound(*args, **kwargs):
        with mode.enter(BOUNDS):
            return plain_bound(*args, **kwargs)

    probes.bounds.kruskal_lower_bound = bound
    for name in ("tolist", "cpu"):
        plain = getattr(torch.Tensor, name)

        def counted(self, *a, _plain=plain, _name=name, **kw):
            if _name != "cpu" or self.device.type != "cpu":
                mode.reads[mode.stage[-1]] += 1
            return _plain(self, *a, **kw)

        setattr(torch.Tensor, name, counted)
    try:
        with open("/proc/loadavg") as fh:
            load = fh.read().split()[0]
    except OSError:
        load = "?"
    start_cpu, start = time.process_time(), time.perf_counter()
    with mode:
        code = cli.main(argv)
    cpu, wall = time.process_time() - start_cpu, time.perf_counter() - start
    print(f"\n# audit {' '.join(argv)}: exit {code}, wall {wall:.1f} s, CPU {cpu:.1f} s, load at the start "
          f"{load}, torch {torch.__version__}, {torch.get_num_threads()} torch thread(s)")
    print("| stage | wall s | CPU s | aten ops (launches) | host reads |")
    print("|---|---:|---:|---:|---:|")
    stages = sorted(set(mode.ops) | set(mode.wall), key=lambda s: -mode.wall.get(s, 0.0))
    for s in stages:
        print(f"| {s} | {mode.wall.get(s, 0.0):.1f} | {mode.cpu.get(s, 0.0):.1f} | {mode.ops.get(s, 0)} "
              f"| {mode.reads.get(s, 0)} |")
    print(f"\n(the test stages include the {BOUNDS} row's seconds; its ops and reads are counted in its own "
          f"row only; 'setup' holds what ran outside the audit's named stages)")


if __name__ == "__main__":
    main()
