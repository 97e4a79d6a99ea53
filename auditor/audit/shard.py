"""Sharded extraction for large audits: the examples split across Ray workers, tokens gathered in order.

:func:`extract_sharded` cuts the N examples of an :class:`~auditor.data.Inputs` into contiguous shards,
one per worker, rebuilds the same model in every worker from a :class:`ModelRecipe` (the arguments of
:func:`~auditor.models.load_model`: random weights are seeded, pretrained ones read from the same
source), runs :func:`~auditor.audit.extract.extract` on each shard and concatenates the tokens in example
order. The result is the ``{representation: Tokens}`` dict that ``extract`` returns in one process,
equal bit for bit when the workers compute like this process:

- shard boundaries fall on multiples of ``batch_size``, so every forward pass sees exactly the batch it
  would see in one process (CPU matrix kernels may round differently for other batch shapes);
- CPU workers use this process's number of torch threads (``threads``), reserved as Ray CPUs, because
  a kernel's split across threads can change the last bits too;
- GPU workers (``device`` ``auto`` on a cluster with GPUs, or ``cuda``) reserve one GPU each.

Executors: ``ray`` (each shard a Ray task on a local instance or the cluster at ``address``), ``slurm``
(each shard a task of one Slurm job array, with ``SlurmOptions.cpus_per_task`` torch threads per CPU
shard, so tokens equal one process's bit for bit when that matches ``--threads``) and ``local`` (the
shards one after the other in this process: the same path without Ray).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from auditor.audit.extract import extract, parse_representation
from auditor.audit.tokens import Tokens
from auditor.core.errors import AuditError
from auditor.core.execution import as_completed, check_executor, ray_session, run_each
from auditor.core.slurm import SlurmOptions
from auditor.data import Inputs
from auditor.models import LoadedModel, dtype_name, load_model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelRecipe:
    """How to build the same model in another process: the arguments of ``load_model``."""

    name: str
    weights: str = "random"
    device: str = "auto"
    dtype: str = "float32"
    seed: int = 0
    context_length: int | None = None
    trust_remote_code: bool = False
    config_overrides: Mapping[str, Any] | None = None  # architecture fields of a random model (tests)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise AuditError("ModelRecipe.name must be a model name; see `audit models`")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise AuditError(f"seed must be an integer; got {self.seed!r}")

    @classmethod
    def of(cls, loaded: LoadedModel, **load_args: Any) -> ModelRecipe:
        """The recipe of an already loaded model; ``load_args`` adds what ``loaded`` does not record
        (``context_length``, ``trust_remote_code``, ``config_overrides``, a ``device`` other than its own)."""
        base = {"name": loaded.name, "weights": loaded.weights, "device": str(loaded.device),
                "dtype": dtype_name(loaded.dtype), "seed": loaded.seed}
        return cls(**{**base, **load_args})

    def load(self, device: str | None = None) -> LoadedModel:
        """Build or load the model (on ``device`` if given, else on the recipe's)."""
        return load_model(
            self.name,
            self.weights,
            device=device or self.device,
            dtype=self.dtype,
            seed=self.seed,
            context_length=self.context_length,
            trust_remote_code=self.trust_remote_code,
            config_overrides=self.config_overrides,
        )


def shard_bounds(num: int, workers: int, batch_size: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` ranges covering ``range(num)``, cut on multiples of ``batch_size``.

    The batches are dealt out as evenly as possible: at most ``workers`` shards, fewer when there are
    fewer batches than workers; shard sizes differ by at most one batch.
    """
    for label, value in (("N", num), ("workers", workers), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise AuditError(f"{label} must be a positive integer; got {value!r}")
    batches = -(-num // batch_size)
    shards = min(workers, batches)
    per, extra = divmod(batches, shards)
    bounds, start = [], 0
    for i in range(shards):
        stop = min(num, start + (per + (i < extra)) * batch_size)
        bounds.append((start, stop))
        start = stop
    return bounds


def slice_inputs(inputs: Inputs, start: int, stop: int) -> Inputs:
    """Examples ``start .. stop-1`` of ``inputs`` as their own Inputs (held tensors copied, so a shard ships
    only its own rows; images made on demand ship as their files); the labels and counts stay those of the
    whole source."""
    return inputs.part(start, stop, copy=True)


def extract_shard(
    recipe: ModelRecipe,
    inputs: Inputs,
    representations: Sequence[str],
    batch_size: int,
    seed: int,
    threads: int | None,
    device: str | None = None,
) -> dict[str, Tokens]:
    """One worker's job: build the model from ``recipe`` and extract its shard (module level for Ray)."""
    if threads is not None:
        torch.set_num_threads(threads)
    loaded = recipe.load(device)
    return extract(loaded, inputs, representations, batch_size=batch_size, seed=seed, progress=False)


def _gather(
    parts: Iterable[tuple[int, dict[str, Tokens]]], bounds: list[tuple[int, int]]
) -> dict[str, Tokens]:
    """Copy each shard's tokens into place as it arrives (shard i fills ``bounds[i]``), then let it go.

    The shards' metadata must agree; only ``device`` may differ (the gathered value lists them).
    """
    num = bounds[-1][1]
    buffers: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    metas: dict[str, dict[str, str]] = {}
    devices: dict[str, list[str]] = {}
    for i, part in parts:
        start, stop = bounds[i]
        for name, tok in part.items():
            if name not in buffers:
                buffers[name] = (torch.empty((num, tok.n, tok.d), dtype=tok.contexts.dtype),  # (N, n, d)
                                 torch.empty((num, tok.d), dtype=tok.queries.dtype))  # (N, d)
                metas[name], devices[name] = tok.meta, []
            same = {k: v for k, v in metas[name].items() if k != "device"}
            if {k: v for k, v in tok.meta.items() if k != "device"} != same:
                raise RuntimeError(f"shards disagree on how {name} was made: {tok.meta} vs {metas[name]}")
            buffers[name][0][start:stop].copy_(tok.contexts)
            buffers[name][1][start:stop].copy_(tok.queries)
            devices[name].append(tok.meta.get("device", ""))
    return {
        name: Tokens(contexts=contexts, queries=queries,
                     meta={**metas[name], "device": ",".join(dict.fromkeys(devices[name]))})
        for name, (contexts, queries) in buffers.items()
    }


def _ray_device(device: str) -> tuple[str, float]:
    """The device every Ray worker uses, and the GPUs each reserves (Ray pins one GPU per task)."""
    import ray

    gpus = ray.cluster_resources().get("GPU", 0)
    if device == "cpu":
        return "cpu", 0
    if device == "auto":
        return ("cuda", 1) if gpus >= 1 else ("cpu", 0)
    if gpus < 1:
        raise AuditError(
            f"device {device!r} requested but the Ray cluster has no GPU; use --device cpu or auto"
        )
    return "cuda", 1  # each task sees only its own GPU, as cuda:0


def extract_sharded(
    recipe: ModelRecipe,
    inputs: Inputs,
    representations: Sequence[str],
    *,
    workers: int = 2,
    executor: str = "ray",
    address: str | None = None,
    batch_size: int = 32,
    seed: int = 0,
    threads: int | None = None,
    loaded: LoadedModel | None = None,
    progress: bool = True,
    slurm: SlurmOptions | None = None,
) -> dict[str, Tokens]:
    """Tokens of every requested representation, extracted in ``workers`` shards.

    Args:
        recipe: how each worker builds the model (must describe the model the inputs were made for).
        inputs: N examples; shard i gets a contiguous block of whole batches.
        representations: as for :func:`~auditor.audit.extract.extract` (``embedding``, ``block.L``, ...).
        workers: number of shards (Ray tasks); fewer when N has fewer batches.
        executor: ``ray``, ``slurm`` or ``local`` (the shards in turn, in this process, with ``loaded`` if
            given).
        address: Ray cluster address (``auto``, ``host:port``, ``ray://head:10001``); None: this
            process's instance, ``RAY_ADDRESS``, a ``ray start`` cluster on this machine, else a new local
            one (see :mod:`auditor.core.execution`).
        batch_size, seed: as for ``extract``; the same values give the same tokens.
        threads: torch threads per CPU worker (default: this process's count, for identical rounding).
        loaded: this process's copy of the model, used to validate up front and by ``local``.
        slurm: the resources of each Slurm job and the folder of their logs (``slurm`` only; a folder the
            nodes share, e.g. ``<report>/slurm``).
    Returns:
        ``{name: Tokens}`` with contexts (N, n, d) and queries (N, d) on the CPU, metadata as ``extract``
        writes it (``device`` lists the workers' devices if they differ).
    """
    bounds = shard_bounds(inputs.N, workers, batch_size)
    _check_sharded(recipe, inputs, representations, executor, threads, loaded, slurm)
    threads = threads or torch.get_num_threads()
    shards = [slice_inputs(inputs, start, stop) for start, stop in bounds]
    reps = list(representations)
    bar = tqdm(total=inputs.N, desc=f"extract {recipe.name} ({len(bounds)} shards)", unit="ex",
               disable=not progress)
    with bar:
        if executor == "local":
            model = loaded if loaded is not None else recipe.load()

            def local_parts() -> Iterator[tuple[int, dict[str, Tokens]]]:
                for i, shard in enumerate(shards):
                    yield i, extract(model, shard, reps, batch_size=batch_size, seed=seed, progress=False)
                    bar.update(shard.N)

            return _gather(local_parts(), bounds)
        if executor == "slurm":
            return _gather(_slurm_parts(recipe, shards, reps, batch_size, seed, slurm, bar), bounds)
        return _gather(_ray_parts(recipe, shards, reps, batch_size, seed, threads, address, bar), bounds)


def _check_sharded(recipe: ModelRecipe, inputs: Inputs, representations: Sequence[str], executor: str,
                   threads: int | None, loaded: LoadedModel | None, slurm: SlurmOptions | None) -> None:
    """The arguments of :func:`extract_sharded`, checked here rather than in every worker."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise AuditError(f"threads must be a positive integer; got {threads!r}")
    if not representations:
        raise AuditError("no representation requested; valid: embedding, random-attention, block.<L>")
    check_executor(executor)  # a known executor, and Ray (or submitit) importable when it is asked for
    if executor == "slurm":
        if slurm is None or slurm.folder is None:
            raise AuditError("--executor slurm needs a folder for the jobs' logs; give the audit an --out "
                             "folder")
        slurm_device(recipe.device, slurm)
    if loaded is not None:
        for rep in representations:
            parse_representation(rep, loaded.num_layers)  # fail here, not in every worker
        if inputs.n != loaded.n:
            raise AuditError(f"the inputs hold {inputs.n} tokens per example but {loaded.name} uses "
                             f"n = {loaded.n}")


def _ray_parts(recipe, shards, reps, batch_size, seed, threads, address, bar) -> Iterator[tuple[int, dict]]:
    """Run every shard as a Ray task; yield (shard index, tokens) in the order they finish. The first task
    that fails cancels the others and raises its own error (a user mistake stays one line)."""
    with ray_session(address) as ray:
        device, gpus = _ray_device(recipe.device)
        largest = max(
            (node["Resources"].get("CPU", 0) for node in ray.nodes() if node.get("Alive")), default=1
        )
        if not gpus and threads > largest:
            log.warning("no Ray node has %d CPUs; workers use %d threads (last bits may differ from this "
                        "process)", threads, int(largest))
            threads = max(1, int(largest))
        task = ray.remote(extract_shard).options(num_cpus=1 if gpus else threads, num_gpus=gpus)
        calls = [(recipe, shard, reps, batch_size, seed, threads, device) for shard in shards]
        for i, part in as_completed(task, calls, fail_fast=True):
            yield i, part
            bar.update(shards[i].N)


def slurm_device(device: str, options: SlurmOptions) -> str:
    """The device every Slurm job uses: ``cuda`` when the jobs get GPUs (``auto`` or ``cuda``), else the CPU;
    ``cuda`` without ``--slurm-gpus`` is a one-line AuditError."""
    if options.gpus_per_task:
        return "cpu" if device == "cpu" else "cuda"  # each job sees only its own GPUs, from cuda:0
    if device not in ("auto", "cpu"):
        raise AuditError(
            f"device {device!r} requested but the Slurm jobs get no GPU; add --slurm-gpus 1 or use "
            "--device cpu or auto"
        )
    return "cpu"


def _slurm_parts(recipe, shards, reps, batch_size, seed, options, bar) -> Iterator[tuple[int, dict]]:
    """Every shard as a task of one Slurm job array; yield (shard index, tokens) as they finish. The first
    task that fails cancels the others and raises its own error (a user mistake stays one line)."""
    device = slurm_device(recipe.device, options)
    calls = [(recipe, shard, reps, batch_size, seed, options.cpus_per_task, device) for shard in shards]
    for i, part in run_each(extract_shard, calls, executor="slurm", slurm=options, fail_fast=True,
                            name=f"extract {recipe.name}"):
        yield i, part
        bar.update(shards[i].N)
