"""An audit's plan: its configuration split into what each stage uses, checked against the model.

:meth:`AuditPlan.of` turns an :class:`~auditor.audit.config.AuditConfig` (the options, each checked on
its own) into the rows to test (representation x weights) and one small frozen part per stage:

- :class:`Sampling`: which examples are read (``auditor.data.load_inputs``);
- :class:`Loading`: how each weights source's model is built (``auditor.models.load_model``);
- :class:`Extraction`: how tokens are made and held (batches, memory budget, workers);
- :class:`~auditor.audit.assumptions.RunOptions`: the tests and what they share;
- :class:`Sweep`: the Kruskal curve of ``--sweep``.

A text model's context length n, when ``--context-length`` is not given, follows one cost rule
(:func:`default_context_length`): the family's default n, halved while a default audit would cost more
than :data:`DEFAULT_COST` allows.

The ``check_*`` methods validate the plan against a model's architecture read from its configuration
alone: nothing there loads weights or touches the report folder, so a mistake costs nothing and never
disturbs an earlier run's files.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import probes
from auditor.audit.assumptions import ASSUMPTION_TESTS, RunOptions
from auditor.audit.config import (
    DEFAULT_REPRESENTATIONS,
    DEFAULT_SUBSETS,
    MAX_DEFAULT_SAMPLES,
    AuditConfig,
    parse_layers,
)
from auditor.audit.report.catalogue import block_name, representation_depth
from auditor.core.errors import AuditError
from auditor.core.execution import check_executor
from auditor.core.slurm import SlurmOptions

if TYPE_CHECKING:
    from auditor.models.base import LoadedModel, ModelSpec

EMBEDDING = "embedding"
# Options that mean nothing when token files are tested again: the tokens are extracted already.
_EXTRACTION_OPTIONS = ("data", "samples", "first", "context_length", "save_tokens", "representations",
                       "weights", "trust_remote_code", "layers")


@dataclass(frozen=True)
class DefaultCost:
    """What an audit with no options may cost, in estimated FLOPs (:func:`audit_flops`), so that
    ``audit <name>`` ends within a few minutes on two CPU cores; a text model's default n is halved until
    its default audit fits."""

    # gpt2's default audit (n 256, N 512) is 6.5e12 by audit_flops and took 150 s on the quiet 2-core machine
    # (issue #22); at that rate 1.2e13 is about 280 s. The costliest default kept unchanged by it,
    # llama-3.2-1b's (n 128), is 1.1e13 with its block's 61M weights (271 s measured with --threads 1 at
    # load 1-4); the decoders' larger blocks halve gemma-2-2b and phi-3-mini to 64, mistral-7b and
    # llama-3.1-8b to 32.
    flops: float = 1.2e13
    smallest_n: int = 16  # never halved below


DEFAULT_COST = DefaultCost()


def audit_flops(num: int, n: int, d: int, *, subsets: int = DEFAULT_SUBSETS,
                representations: int = len(DEFAULT_REPRESENTATIONS), block: int | None = None) -> float:
    """Estimated FLOPs of an audit of one weights source: block 0's forward over N x n tokens (2 x its
    weights per token; ``block`` None: 12 d^2, attention 4 d^2 and MLP 8 d^2, exact for BERT and GPT-2)
    and, per representation, one n x n Gram matrix (2 n^2 d) per context (Assumption 2) and per subset of
    each of the three Kruskal tests."""
    weights = 12 * d * d if block is None else block
    return 2 * weights * num * n + representations * (num + 3 * subsets) * 2 * n * n * d


def default_context_length(n: int, d: int, cost: DefaultCost | None = None, *,
                           block: int | None = None) -> int:
    """A text model's n when none is asked for: the model's own ``n`` (what its adapter reports,
    ``auditor.models.base.ContextLimits.own``) halved while the audit with no options (the bundled sample's
    N for that n, :func:`auditor.data.default_samples`; ``block``: the weights of one of its blocks) is
    estimated above ``cost.flops``. This is the only rule that chooses a default n; it depends on the model
    only, so ``--data`` and ``--samples`` leave it as it is."""
    from auditor.data import default_samples

    cost = cost if cost is not None else DEFAULT_COST
    def over(n: int) -> bool:
        return audit_flops(default_samples(n, None, MAX_DEFAULT_SAMPLES), n, d, block=block) > cost.flops

    while n > cost.smallest_n and over(n):
        n //= 2
    return n


@dataclass(frozen=True)
class Row:
    """A planned report row: a representation under one weights source."""

    representation: str
    weights: str


@dataclass(frozen=True)
class Sampling:
    """Which examples an audit reads."""

    data: str | None  # image folder, .txt file or folder, hf:<dataset>; None: the bundled sample
    samples: int | None  # None: the default N (:meth:`count`)
    first: bool  # the first N examples instead of a seeded random draw
    seed: int
    sweep_k: int | None = None  # the largest k asked of --sweep: fewer examples are refused

    def count(self, n: int) -> int:
        """N for a model of context length ``n``: ``samples``, else :func:`auditor.data.default_samples`."""
        from auditor.data import default_samples

        return self.samples or default_samples(n, self.data, MAX_DEFAULT_SAMPLES)


@dataclass(frozen=True)
class Loading:
    """How each weights source's model is built (the arguments of ``auditor.models.load_model``)."""

    device: str
    seed: int
    context_length: int | None
    trust_remote_code: bool
    dtype: str
    query: str | None
    bos: bool | None


@dataclass(frozen=True)
class Sharding:
    """Extraction shared across worker processes (``workers > 1``); each rebuilds the model."""

    workers: int
    executor: str  # "local" | "ray" | "slurm"
    address: str | None  # Ray cluster address
    slurm: SlurmOptions  # the Slurm jobs' resources (logs in <out>/.slurm)
    loading: Loading  # how a worker builds the model again


@dataclass(frozen=True)
class Extraction:
    """How tokens are made and held."""

    batch_size: int
    seed: int  # of random-attention's weights
    device: str  # where streamed contexts are reduced
    memory_budget: float | None  # GiB of tokens held at once; None: half the available memory
    save_tokens: bool
    sharding: Sharding | None = None  # None: extracted in this process


@dataclass(frozen=True)
class Sweep:
    """The Kruskal curve of ``--sweep``: the full-rank share against k."""

    ks: tuple[int, ...] | None  # None: 16 steps up to min(N, d)
    subsets: int
    refine: int
    seed: int
    rtol: float | None


@dataclass(frozen=True)
class AuditPlan:
    """The rows of an audit and what each stage needs to make them (see the module's docstring)."""

    model: str
    rows: tuple[Row, ...]
    layers: str | None  # blocks added at every depth once the model's block count is known
    sampling: Sampling
    loading: Loading
    extraction: Extraction
    testing: RunOptions
    sweep: Sweep | None
    tokens: tuple[str, ...] | None  # token files tested again instead of extracting
    threads: int | None

    @classmethod
    def of(cls, config: AuditConfig) -> AuditPlan:
        """The plan of ``config``; raises AuditError for options that cannot go together."""
        if config.tokens is not None:
            unused = [name for name in _EXTRACTION_OPTIONS if getattr(config, name) != _DEFAULTS[name]]
            unused += ["workers"] if config.workers > 1 else []
            if unused:
                raise AuditError(f"option(s) {', '.join(unused)} do not apply when re-testing token files "
                                 "(the tokens are extracted already; each file names its representation and "
                                 "weights)")
        loading = Loading(device=config.device, seed=config.seed, context_length=config.context_length,
                          trust_remote_code=config.trust_remote_code, dtype=config.dtype, query=config.query,
                          bos=config.bos)
        sharding = None if config.workers == 1 else Sharding(
            workers=config.workers, executor=config.executor, address=config.address,
            slurm=config.slurm or SlurmOptions(), loading=loading)
        sweep = None if not config.sweep else Sweep(
            ks=config.sweep_ks, subsets=config.sweep_subsets, refine=config.sweep_refine, seed=config.seed,
            rtol=config.rtol)
        return cls(
            model=config.model,
            rows=tuple(_rows(config.representations, config.weights, config.layers,
                             folder=model_folder(config.model))),
            layers=config.layers,
            sampling=Sampling(data=config.data, samples=config.samples, first=config.first, seed=config.seed,
                              sweep_k=max(config.sweep_ks) if config.sweep and config.sweep_ks else None),
            loading=loading,
            extraction=Extraction(batch_size=config.batch_size, seed=config.seed, device=config.device,
                                  memory_budget=config.memory_budget, save_tokens=config.save_tokens,
                                  sharding=sharding),
            testing=RunOptions(subsets=config.subsets, seed=config.seed, rtol=config.rtol,
                               threshold=config.threshold, tests=config.tests,
                               robustness="exact" if config.exact_brackets else config.robustness),
            sweep=sweep,
            tokens=config.tokens,
            threads=config.threads,
        )

    def context_length(self, spec: ModelSpec, weights: str) -> int | None:
        """The n to build ``spec`` with under ``weights``: ``--context-length``, else for a text model whose
        shape its configuration gives, :func:`default_context_length`; None: the model's own."""
        from auditor.models.base import weights_kind

        if self.loading.context_length is not None or spec.modality != "text":
            return self.loading.context_length
        config = architecture_config(spec, weights, weights_kind(weights))
        if config is None:
            return None
        own = spec.adapter.context_length(config, None)  # the model's own n, checked against its limits
        block = spec.adapter.context_limits(config).block_weights
        return default_context_length(own, spec.adapter.width(config), block=block)

    def by_weights(self) -> dict[str, list[str]]:
        """The planned representations grouped by weights source (one model load each)."""
        groups: dict[str, list[str]] = {}
        for row in self.rows:
            groups.setdefault(row.weights, []).append(row.representation)
        return groups

    def representations(self, planned: list[str], num_layers: int) -> list[str]:
        """``planned`` representations of one weights source with the blocks of :attr:`layers` added, for a
        model of ``num_layers`` blocks: ``embedding``, then ``block.L`` for each chosen L, then the others."""
        if self.layers is None:
            return list(planned)
        blocks = [block_name(index) for index in parse_layers(self.layers, num_layers)]
        return list(dict.fromkeys([EMBEDDING, *blocks, *planned]))

    @property
    def across_depth(self) -> bool:
        """An audit across depth: ``layers`` given, or two or more ``block.L`` representations planned. Its
        time per stage names each layer's tests, and it returns (and writes) the depth profile."""
        blocks = {row.representation for row in self.rows if representation_depth(row.representation)}
        return self.layers is not None or len(blocks) >= 2

    # -----------------------------------------------------------------------------------------------
    # Checks before any work: nothing here loads a model or touches the report folder
    # -----------------------------------------------------------------------------------------------

    def check_common(self) -> None:
        """The device, the data path and the sweep's k against --samples (any model source)."""
        from auditor.data import HF_PREFIX
        from auditor.models import resolve_device

        resolve_device(self.loading.device)
        data, samples, sweep_k = self.sampling.data, self.sampling.samples, self.sampling.sweep_k
        if data is not None and not data.startswith(HF_PREFIX) and not Path(data).expanduser().exists():
            raise AuditError(f"data {data!r} does not exist; give an image folder, a .txt file or a "
                             "folder of them, or hf:<dataset>")
        if sweep_k is not None and samples is not None and sweep_k > samples:
            raise AuditError(f"sweep k = {sweep_k} exceeds the N = {samples} examples asked for; "
                             f"valid: 1 <= k <= {samples} (or load more with --samples)")

    def check_model(self, spec: ModelSpec) -> None:
        """Device, data, executor, weights and representations of a model named by string."""
        from auditor.models.base import folder_model_type, weights_kind

        self.check_common()
        if self.extraction.sharding is not None:
            check_executor(self.extraction.sharding.executor)  # Ray importable when it is asked for
        for weights, reps in self.by_weights().items():
            kind = weights_kind(weights)
            if kind == "folder" and spec.adapter.model_types:
                found = folder_model_type(Path(weights).expanduser())
                if found not in spec.adapter.model_types:
                    raise AuditError(f"{weights} holds a {found or 'unknown'} model, "
                                     f"not a {spec.family} model")
            shape = architecture(spec, weights, kind, self.context_length(spec, weights))
            if shape is not None:
                n, d, layers = shape
                self.check_shape(n=n, d=d, layers=layers, reps=self.representations(reps, layers),
                                 n_set_by=spec.modality)

    def check_object(self, loaded: LoadedModel) -> None:
        """As :meth:`check_model`, for a model object (its own weights only)."""
        self.check_common()
        if self.extraction.sharding is not None:
            raise AuditError("workers > 1 rebuilds the model in each worker; a model object is audited in "
                             "this process")
        planned = self.by_weights()
        if set(planned) != {loaded.weights}:
            other = sorted(set(planned) - {loaded.weights})
            raise AuditError(f"a model object has only its own weights; drop the @{other[0]} pin")
        reps = self.representations(planned[loaded.weights], loaded.num_layers)
        self.check_shape(n=loaded.n, d=loaded.d, layers=loaded.num_layers, reps=reps,
                         n_set_by=loaded.modality)

    def check_shape(self, *, n: int, d: int, layers: int | None = None, reps: list[str] | None = None,
                    num: int | None = None, n_set_by: str = "text") -> None:
        """Representations in range, n <= d, and subsets that fit in memory, for a model of this shape
        (``num``: the examples, default ``--samples`` or the largest default). ``n_set_by``: what sets n,
        so that a refusal advises only what the command then accepts (:data:`N_ADVICE`)."""
        if reps:
            from auditor.audit.extract import parse_representation

            for rep in reps:
                parse_representation(rep, layers)
        from auditor.models.devices import check_precision

        check_precision(self.loading.dtype, self.testing.rtol, d)
        if n > d:
            raise AuditError(f"context length n = {n} exceeds the width d = {d} of {self.model}: "
                             f"Assumption 2 (rank n) is impossible; {N_ADVICE[n_set_by].format(d=d)}")
        limit = probes.max_subsets_in_memory
        num = num if num is not None else self.sampling.samples or MAX_DEFAULT_SAMPLES
        checks = [("subsets", self.testing.subsets, ASSUMPTION_TESTS[t].k(num, n, d))
                  for t in self.testing.tests if ASSUMPTION_TESTS[t].kruskal]
        if self.sweep is not None:
            checks.append(("sweep_subsets", self.sweep.subsets, min(num, d)))
        for name, count, k in checks:
            if k <= num and count > limit(k) and math.comb(num, k) > limit(k):
                raise AuditError(f"{name} = {count:,} subsets of size k = {k} do not fit in memory; valid: "
                                 f"1 <= {name} <= {limit(k):,} at k = {k}")


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(AuditConfig)}
# What a user can do when n > d, by what sets n (each is accepted by the command it names; tests follow each)
N_ADVICE = {
    "text": "use --context-length <= {d} (context_length= in Python)",
    "image": "n is fixed by the image and patch size, and no option changes it: audit a model whose width "
             "d is at least its n",
    "tokens": "the token files fix n: extract them again with --context-length <= {d} and --save-tokens",
    "tensors": "the contexts you gave fix n: give contexts of at most {d} tokens",
}


def model_folder(model: str) -> str | None:
    """The model as given when it names a local ``save_pretrained`` folder (not a registered name, not
    ``timm:``), else None; read from the registry's snapshot, so nothing heavy is imported."""
    from auditor.audit.model_list import MODELS

    if model in {line.name for line in MODELS} or model.startswith("timm:"):
        return None
    return model if Path(model).expanduser().is_dir() else None


def _rows(representations: tuple[str, ...], weights: tuple[str, ...], layers: str | None,
          folder: str | None = None) -> list[Row]:
    """Representation x weights rows. ``block.0@pretrained`` pins one representation to one source.

    With ``layers`` every weights source starts with ``embedding`` (its blocks are added once the model's
    block count is known, see :meth:`AuditPlan.representations`) and representations left at their default
    add nothing. ``folder``: the model is this local folder, whose weights are what ``pretrained`` reads;
    its rows name the folder (the weights it holds may be random: a folder is not "pretrained").
    """
    def named(w: str) -> str:
        w = w.strip()
        return folder if folder is not None and w == "pretrained" else w

    weights = tuple(dict.fromkeys(named(w) for w in weights))
    rows: list[Row] = [Row(EMBEDDING, w) for w in weights] if layers is not None else []
    given = () if layers is not None and representations == DEFAULT_REPRESENTATIONS else representations
    for item in given:
        name, _, pinned = item.partition("@")
        for w in [named(pinned)] if pinned else weights:
            row = Row(name.strip(), w)
            if row not in rows:
                rows.append(row)
    return rows


def architecture(spec: ModelSpec, weights: str, kind: str,
                 context_length: int | None) -> tuple[int, int, int] | None:
    """(n, d, blocks) of the model ``load_model`` would build, read from its configuration alone (no
    weights); None when that needs the model itself (e.g. timm)."""
    hf_config = architecture_config(spec, weights, kind)
    if hf_config is None:
        return None
    adapter = spec.adapter
    n = adapter.context_length(hf_config, context_length)  # a bad context length is an AuditError here
    return n, adapter.width(hf_config), adapter.depth(hf_config)


def architecture_config(spec: ModelSpec, weights: str, kind: str) -> Any:
    """The configuration ``load_model`` would build ``spec`` with under ``weights``, read without any
    weights (a folder's is checked as data); None when that needs the model itself (e.g. timm)."""
    from auditor.models.base import HFAdapter

    if not isinstance(spec.adapter, HFAdapter):
        return None
    try:
        if kind == "folder":
            from transformers import AutoConfig

            hf_config = AutoConfig.from_pretrained(str(Path(weights).expanduser()), local_files_only=True,
                                                   trust_remote_code=False)  # never runs or asks
        elif spec.config is not None:
            hf_config = spec.config()
        else:
            return None
    except Exception:  # noqa: BLE001 - unreadable or invalid here (StrictDataclassError too): the load says why
        return None
    if kind == "folder":  # a weights folder's config is data: its sizes checked before they are used
        from auditor.models.limits import check_config

        check_config(hf_config, str(Path(weights).expanduser() / "config.json"))
    return hf_config
