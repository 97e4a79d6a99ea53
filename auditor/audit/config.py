"""The configuration of an audit: everything that decides its numbers, checked when it is made.

:class:`AuditConfig` has one field per option of ``audit MODEL`` (same names with ``-`` for ``_``, same
defaults) and is recorded in every report (``config.json``). Its checks need no model and no data, so a
bad value is refused before any work. :class:`auditor.audit.plan.AuditPlan` splits it into what each
stage uses and checks what depends on the model's shape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import probes
from auditor.audit.report.catalogue import TESTS
from auditor.core.errors import AuditError, did_you_mean
from auditor.core.execution import EXECUTORS
from auditor.core.options import MAX_SIZE
from auditor.core.slurm import SlurmOptions

DEFAULT_REPRESENTATIONS = ("embedding", "random-attention", "block.0")
DEFAULT_WEIGHTS = ("random", "pretrained")
DEFAULT_SUBSETS = 5000
MAX_SUBSETS = 10_000_000  # per test; the sampled share is then known to about +-0.0003
MAX_SWEEP_REFINE = 64  # bisection steps; log2(d) of any real model is far below
MAX_THREADS = 1024
MAX_DEFAULT_SAMPLES = 2000  # the paper's N: what an audit takes when --samples is not given
LAYERS_FORMS = (
    "all, block indices (0,3,-1), ranges in Python slice notation (0:6, -3:, ::2) or a mix (0:3,11)"
)
_LAYER_PART = re.compile(r"all|-?\d+|(-?\d+)?:(-?\d+)?(:\d*)?")  # one comma-separated part of a layers spec


@dataclass(frozen=True)
class AuditConfig:
    """Everything that decides an audit's numbers (recorded in every report).

    The ``audit`` command line has one option per field, with the same defaults.
    """

    model: str = "vit-base"
    data: str | None = None
    samples: int | None = None  # None: all available, at most MAX_DEFAULT_SAMPLES (the paper's N)
    first: bool = False  # take the first `samples` examples instead of a seeded random draw
    subsets: int = DEFAULT_SUBSETS
    representations: tuple[str, ...] = DEFAULT_REPRESENTATIONS
    weights: tuple[str, ...] = DEFAULT_WEIGHTS
    tests: tuple[str, ...] = TESTS
    threshold: float = probes.DEFAULT_THRESHOLD
    rtol: float | None = None  # relative rank tolerance; None: RTOL_RULE
    seed: int = 0
    device: str = "auto"
    batch_size: int = 32
    context_length: int | None = None
    sweep: bool = False
    sweep_ks: tuple[int, ...] | None = None
    sweep_subsets: int = 500
    sweep_refine: int = 6  # extra k placed by bisection where the curve leaves 1.0
    save_tokens: bool = False
    tokens: tuple[str, ...] | None = None  # token files to test again instead of extracting
    trust_remote_code: bool = False
    dtype: str = "float32"
    query: str | None = None
    bos: bool | None = (
        None  # decoder LLMs: BOS at position 0 (True) or not (False); None: as the tokenizer does
    )
    threads: int | None = None  # torch threads for the run (None: torch's default)
    workers: int = 1  # > 1: shard extraction across workers (see auditor.audit.shard)
    executor: str = "local"  # "local" (in this process) | "ray" | "slurm"
    address: str | None = None  # Ray cluster address for executor="ray"
    slurm: SlurmOptions | None = None  # Slurm jobs' resources for executor="slurm" (None: the defaults)
    # blocks audited at every depth, with the embedding (see parse_layers); None: the representations only.
    # Representations left at their default then add nothing: random-attention joins only when asked for.
    layers: str | None = None
    memory_budget: float | None = None  # GiB of tokens held at once (None: half the available memory)
    robustness: bool = True  # critical tolerance, tolerance grid and exact minimum margin of every verdict
    exact_brackets: bool = False  # ... without its work caps: every critical_rtol bracket closed (slower)

    def __post_init__(self) -> None:
        bounded("subsets", self.subsets, 1, MAX_SUBSETS)
        bounded("sweep_subsets", self.sweep_subsets, 1, MAX_SUBSETS)
        bounded("sweep_refine", self.sweep_refine, 0, MAX_SWEEP_REFINE)
        bounded("batch_size", self.batch_size, 1, MAX_SIZE)
        bounded("workers", self.workers, 1, MAX_THREADS)
        if self.threads is not None:
            bounded("threads", self.threads, 1, MAX_THREADS)
        if self.executor not in EXECUTORS:
            raise did_you_mean("executor", self.executor, EXECUTORS)
        if self.executor != "local" and self.workers == 1 and self.tokens is None:
            raise AuditError(f"--executor {self.executor} runs the shards of --workers, and workers is 1 "
                             "(the default): nothing would be distributed; add --workers N (N >= 2) or leave "
                             "out --executor")
        if self.slurm is not None:
            if not isinstance(self.slurm, SlurmOptions):
                raise AuditError(
                    f"slurm must be SlurmOptions (auditor.core.slurm); got {type(self.slurm).__name__}"
                )
            self.slurm.check_executor(self.executor)
        from auditor.models.devices import resolve_dtype

        resolve_dtype(self.dtype)  # an unknown dtype is refused here, before any work
        if self.query is not None and self.query not in ("mean", "first"):
            raise did_you_mean("query", str(self.query), ("mean", "first"))
        if self.bos is not None and not isinstance(self.bos, bool):
            raise AuditError(f"bos must be True, False or None (as the tokenizer does); got {self.bos!r}")
        if self.samples is not None:
            bounded("samples", self.samples, 1, MAX_SIZE)
        if self.context_length is not None:
            bounded("context_length", self.context_length, 1, MAX_SIZE)
        if self.exact_brackets is True and self.robustness is not True:
            raise AuditError("exact_brackets (--exact-brackets) needs robustness (--robustness), "
                             "whose brackets it closes")
        for name in ("first", "sweep", "save_tokens", "trust_remote_code", "robustness", "exact_brackets"):
            if not isinstance(getattr(self, name), bool):
                raise AuditError(f"{name} must be True or False; got {getattr(self, name)!r}")
        # threshold and rtol are checked by probes' own rules (the floor they go to), here before any work
        try:
            probes.check_threshold(self.threshold)
        except ValueError as err:
            raise AuditError(str(err)) from None
        try:
            probes.check_rtol(self.rtol)
        except ValueError:
            raise AuditError(
                f"rtol (the relative rank tolerance) must be a number in (0, 1); got {self.rtol!r}"
            ) from None
        lo, hi = probes.rank.SEED_RANGE
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not lo <= self.seed <= hi:
            raise AuditError(f"seed must be an integer in [-2**63, 2**63 - 1] (64 bits); got {self.seed!r}")
        for test in self.tests:
            if test not in TESTS:
                raise did_you_mean("test", test, TESTS)
        if not self.tests or not self.representations or not self.weights:
            raise AuditError("tests, representations and weights must each name at least one item")
        for w in self.weights:
            if not w:
                raise AuditError("empty weights name; valid: random, pretrained, or a save_pretrained folder")
        if self.sweep_ks is not None:
            for k in self.sweep_ks:
                bounded("sweep k", k, 1, MAX_SIZE)
        if self.tokens is not None and not self.tokens:
            raise AuditError("tokens lists no file; give at least one token file (written by --save-tokens)")
        if self.layers is not None:
            parse_layers(self.layers, None)  # the form now; the range once the model's block count is known
        if self.memory_budget is not None and (
            isinstance(self.memory_budget, bool) or not isinstance(self.memory_budget, int | float)
            or not 0 < self.memory_budget <= MAX_MEMORY_BUDGET_GIB
        ):
            raise AuditError(f"memory_budget (GiB of tokens held at once, --memory-budget) must be a number "
                             f"in (0, {MAX_MEMORY_BUDGET_GIB:,}] (1 PiB); got {self.memory_budget!r}")


MAX_MEMORY_BUDGET_GIB = 2**20  # 1 PiB: a larger budget is a typo (and overflows byte counts in numpy)


def parse_layers(spec: object, num_layers: int | None) -> list[int]:
    """Block indices chosen by a layers spec, sorted and without repeats, for a model of ``num_layers``
    blocks.

    ``all``; an index ``L`` (negatives count from the end, ``-1`` the last block); a range ``a:b`` or
    ``a:b:step`` with Python's slice semantics (``0:6`` is blocks 0 .. 5, ``-3:`` the last three); or a
    comma list of these (``0:3,11``). With ``num_layers`` None only the form is checked (returns []).
    Raises AuditError (one line, saying what is valid) for anything else.
    """
    text = str(spec).strip() if isinstance(spec, str) else None
    parts = [p.strip() for p in text.split(",")] if text else []
    steps = [p.split(":")[2] for p in parts if p.count(":") == 2]
    if not parts or any(not _LAYER_PART.fullmatch(p) for p in parts) or any(s and int(s) < 1 for s in steps):
        raise AuditError(f"layers takes {LAYERS_FORMS}; got {spec!r}")
    if num_layers is None:
        return []
    valid = f"valid: 0 .. {num_layers - 1}, or -{num_layers} .. -1 from the end"
    chosen: set[int] = set()
    for part in parts:
        if part == "all":
            chosen.update(range(num_layers))
        elif ":" in part:
            bounds = [int(b) if b else None for b in part.split(":")]
            picked = range(num_layers)[slice(*bounds)]
            if not picked:
                raise AuditError(
                    f"layers range {part!r} selects no block of the {num_layers} this model has; {valid}"
                )
            chosen.update(picked)
        else:
            index = int(part)
            if not -num_layers <= index < num_layers:
                raise AuditError(f"layer {index} is out of range: the model has {num_layers} blocks; {valid}")
            chosen.add(index % num_layers)
    return sorted(chosen)


def positive(name: str, value: object) -> None:
    """A positive integer (not a bool), else a one-line AuditError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AuditError(f"{name} must be a positive integer; got {value!r}")


def bounded(name: str, value: object, lo: int, hi: int) -> None:
    """An integer in ``lo .. hi`` (not a bool), else a one-line AuditError naming ``name`` and the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        word = "a positive integer" if lo == 1 else f"an integer >= {lo}"
        raise AuditError(f"{name} must be {word} (valid: {lo:,} .. {hi:,}); got {value!r}")
