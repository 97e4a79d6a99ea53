"""The interface every backbone family implements, the one recipe that loads them, and what
:func:`load_model` returns.

A family (ViT, BERT, GPT-2, timm ViT, the decoder LLMs, ...) is one :class:`Adapter`. :meth:`Adapter.load`
is the same recipe for all of them (as timm's ``build_model_with_cfg``): read the architecture, check it,
build the network, make its inputs (a :class:`TextTokenizer` or an :class:`ImagePreprocessor`), find the
query; a family overrides the steps it does differently and names its blocks (the modules whose outputs
are ``block.0``, ``block.1``, ...) and its forward pass. :class:`HFAdapter` fills the steps for the Hugging
Face layouts read whole, :class:`~auditor.models.partial_adapter.PartialAdapter` for those read block by
block. A family reports what its configuration says of the context length (:class:`ContextLimits`);
which n an audit uses by default is decided by the audit's plan alone.

A registered model (``vit-base``, ``gpt2-large``, ...) is a :class:`ModelSpec`: a name, a family, where
its pretrained weights live, and its architecture kept in code so that random weights never need the
network. Everything downstream (extraction, the audit) talks to a :class:`LoadedModel` only, and the data
to the protocol it satisfies (:class:`auditor.data.feed.Fed`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from auditor.core.errors import AuditError
from auditor.data.feed import ImagePreprocessor, TextTokenizer  # noqa: F401  (how a family's inputs are made)
from auditor.models.devices import (  # noqa: F401
    dtype_name,
    resolve_device,
    resolve_dtype,
    valid_devices,
    weights_dtype,
)
from auditor.models.hub import (  # noqa: F401
    WEIGHTS_HELP,
    WeightsUnavailable,
    first_line,
    folder_model_type,
    hub_reachable,
    looks_like_path,
    quiet_transformers,
    weights_kind,
)

# ---------------------------------------------------------------------------------------------------
# Specs, loaded models and the adapter interface
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """A model the auditor knows: its name, family and where pretrained weights come from."""

    name: str  # registry name ("vit-base"), hub id, local folder or "timm:<name>"
    adapter: Adapter
    source: str  # hub id / timm name of the pretrained weights
    config: Callable[[], Any] | None = None  # the architecture, built offline (random weights)
    description: str = ""
    local_weights: Callable[[], Path | None] | None = None  # an installed copy of the weights, if any

    @property
    def family(self) -> str:
        return self.adapter.family

    @property
    def modality(self) -> str:
        return self.adapter.modality


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A network in eval mode on its device, with everything needed to feed it and read its tokens."""

    spec: ModelSpec
    model: nn.Module
    n: int  # context length: tokens per example
    d: int  # width of the residual stream
    num_layers: int
    query_index: int  # 0 for CLS (ViT, BERT), n - 1 for GPT-2's last token
    weights: str  # as given: "random" | "pretrained" | a folder
    tokenizer_name: str  # tokenizer or image preprocessing, named for reports
    device: torch.device
    dtype: torch.dtype
    seed: int
    tokenizer: TextTokenizer | None = None
    image_preprocessor: ImagePreprocessor | None = None
    details: Mapping[str, str] = field(default_factory=dict)  # e.g. where the weights were read from
    query: str = "index"  # "index": the query is row query_index; "mean": the mean of the n context tokens

    @property
    def family(self) -> str:
        return self.spec.family

    @property
    def modality(self) -> str:
        return self.spec.modality

    @property
    def adapter(self) -> Adapter:
        return self.spec.adapter

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.dtype)

    @property
    def text_layout(self) -> str | None:
        return self.spec.adapter.text_layout


@dataclass(frozen=True)
class ContextLimits:
    """What a model's configuration says about its context length n: facts, never a choice.

    A family reports them (:meth:`Adapter.context_limits`); :meth:`Adapter.context_length` checks a
    requested n against them, and with none requested gives the model's own n (its family's n within the
    position table and the width, :meth:`own`). Which n an audit uses by default, at what cost, is decided
    in one place: the audit's plan (``auditor.audit.plan.default_context_length``), from these facts.
    """

    what: str  # the family as errors name it ("BERT", "GPT-2", "llama", "ViT")
    positions: int | None = None  # the most tokens the position table holds (None: n is fixed)
    fixed: int | None = None  # n set by the image and patch size (image models); None: n is chosen
    preferred: int | None = None  # the family's own n (the paper's BERT 512, GPT-2 1024)
    minimum: int = 2  # the fewest tokens the input layout needs
    layout: str = ""  # that layout, named when a requested n is below the minimum
    block_weights: int | None = None  # weights of one block (multiply-adds per token); None: 12 d^2

    def own(self, d: int) -> int:
        """The model's own n: the preferred n within the position table, unless that exceeds the width d,
        where no context could have rank n (Assumption 2); then the largest power of two <= d / 2 (gpt2,
        d = 768: 256; minilm, d = 384: 128), which leaves room for k = n subsets in d dimensions."""
        if self.fixed is not None:
            return self.fixed
        if self.positions is None or self.preferred is None:
            raise TypeError(f"{self.what}: a context length that is not fixed needs positions and preferred")
        n = min(self.preferred, self.positions)
        if n > d:
            n = 1 << max(1, (d // 2).bit_length() - 1)
        return n

    def check(self, requested: int | None, d: int) -> int:
        """``requested`` when these limits allow it, else a one-line AuditError; None: :meth:`own`."""
        if self.fixed is not None:
            if requested is not None and requested != self.fixed:
                raise AuditError(f"context_length is fixed by the image size for {self.what}: "
                                 f"n = {self.fixed}, not {requested}")
            return self.fixed
        n = self.own(d) if requested is None else requested
        if isinstance(n, bool) or not isinstance(n, int):
            raise AuditError(f"context_length must be an integer; got {n!r}")
        top = self.positions if self.positions is not None else n
        if not 2 <= n <= top:
            raise AuditError(f"context_length {n} is out of range for {self.what}: valid 2..{top}")
        if n < self.minimum:
            raise AuditError(f"context_length {n} is too short for {self.layout}: {self.what} needs "
                             f"n >= {self.minimum}")
        return n


@dataclass
class LoadRequest:
    """One call of :meth:`Adapter.load`: what was asked, and what its steps hand on to each other."""

    spec: ModelSpec
    kind: str  # "random" | "pretrained" | "folder"
    source: str | None  # where the weights are read: a folder or a hub id (None: random weights)
    device: torch.device
    dtype: torch.dtype
    seed: int
    overrides: Mapping[str, Any] | None
    details: dict[str, str] = field(default_factory=dict)  # what the report says of the model, in order
    reader: Any = None  # the family's open checkpoint, from read_architecture to build (partial loading)


_KIND_WORDS = {"random": "weights='random'", "pretrained": "weights='pretrained'", "folder": "a folder"}


class Adapter(ABC):
    """One backbone family. Subclasses register themselves in one line (see ``registry``).

    :meth:`load` is one recipe for every family, as timm's ``build_model_with_cfg`` is; a family
    overrides its steps (the hooks below): read the architecture, build the network, report its
    context limits, make its inputs, and say where the query is and what a reader should know.
    """

    family: str
    modality: str
    text_layout: str | None = None  # "stream" | "pairs" for text families
    model_types: tuple[str, ...] = ()  # Hugging Face ``config.model_type`` values served by this family
    options: tuple[str, ...] = ()  # extra options of ``load`` this family accepts ("query", "bos")
    overrides_apply_to: tuple[str, ...] = ("random",)  # weights kinds whose architecture overrides change

    # -- the recipe ------------------------------------------------------------------------------------
    def load(
        self,
        spec: ModelSpec,
        weights: str,
        *,
        device: torch.device,
        dtype: torch.dtype,
        seed: int,
        context_length: int | None,
        trust_remote_code: bool,
        overrides: Mapping[str, Any] | None,
        **options: Any,
    ) -> LoadedModel:
        """Build (random) or load (pretrained / folder) the network and describe it.

        1. :meth:`read_architecture`: the configuration, checked as data before anything is built (None
           when only building tells); a requested context length is checked against it at once;
        2. :meth:`build`: the network on ``device`` in eval mode (or, loading block by block, the promise
           of it), the details of where its weights came from in ``request.details``;
        3. :meth:`context_length` from :meth:`context_limits`, :meth:`make_loaded_inputs` (tokenizer or
           image preprocessing) checked against the vocabulary;
        4. :meth:`query_for` (the query row), :meth:`notes` (report details), :meth:`keep_state`.
        """
        kind = weights_kind(weights)
        if overrides and kind not in self.overrides_apply_to:
            raise AuditError("config overrides apply to "
                             f"{' or '.join(_KIND_WORDS[k] for k in self.overrides_apply_to)} only")
        if kind == "random":
            source = None
        else:
            source = str(Path(weights).expanduser()) if kind == "folder" else self.pretrained_source(spec)
        request = LoadRequest(spec=spec, kind=kind, source=source, device=device, dtype=dtype, seed=seed,
                              overrides=overrides)
        config = self.read_architecture(request)
        if config is not None:
            self.context_length(config, context_length)  # a bad n fails before anything is built or read
        model, config = self.build(request, config)
        n = self.context_length(config, context_length)
        tower = self.tower(config)
        tokenizer, preprocessor, state = self.make_loaded_inputs(
            spec, kind, source, tower, {**options, "trust_remote_code": trust_remote_code})
        vocab = self.vocab_size(tower)
        if tokenizer is not None and vocab is not None and tokenizer.vocab_size > vocab:
            raise AuditError(
                f"{spec.name}: the tokenizer has {tokenizer.vocab_size} ids but the model only {vocab} "
                f"embeddings; keep vocab_size >= {tokenizer.vocab_size}"
            )
        rule, row = self.query_for(n, options)
        request.details.update(self.notes(tower, n, state))
        self.keep_state(model, state)
        return LoadedModel(
            spec=spec, model=model, n=n, d=self.width(config), num_layers=self.depth(config), query_index=row,
            weights=str(weights), tokenizer_name=(tokenizer or preprocessor).name, device=device, dtype=dtype,
            seed=seed, tokenizer=tokenizer, image_preprocessor=preprocessor, details=request.details,
            query=rule,
        )

    # -- the steps a family overrides ---------------------------------------------------------------------
    def read_architecture(self, request: LoadRequest) -> Any:
        """The configuration the weights will be built with, checked as data; None when only :meth:`build`
        can tell (a hub checkpoint read whole, timm)."""
        return None

    def build(self, request: LoadRequest, config: Any) -> tuple[nn.Module, Any]:
        """(the network on ``request.device`` in eval mode, its configuration); fills ``request.details``
        with ``weights_source``, ``architecture`` and ``weights_dtype``."""
        raise NotImplementedError

    def context_limits(self, config: Any) -> ContextLimits:
        """What ``config`` says about the context length (the position table, an n fixed by the image)."""
        raise NotImplementedError

    def make_loaded_inputs(self, spec: ModelSpec, kind: str, source: str | None, config: Any,
                           options: Mapping[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
        """(tokenizer, image preprocessor, state) for these weights; ``state`` (e.g. the BOS id used) is kept
        on the model (:meth:`keep_state`) and handed to :meth:`notes`. ``options`` holds the load options
        and ``trust_remote_code`` (whether a saved tokenizer may run code from the checkpoint)."""
        raise NotImplementedError

    def width(self, config: Any) -> int:
        """The width d of the residual stream."""
        return int(config.hidden_size)

    def depth(self, config: Any) -> int:
        """The number of blocks."""
        return int(config.num_hidden_layers)

    def tower(self, config: Any) -> Any:
        """The part of ``config`` audited (CLIP, SigLIP: the vision tower of a two-tower config)."""
        return config

    def vocab_size(self, config: Any) -> int | None:
        """The number of token embeddings (None: no text input)."""
        vocab = getattr(config, "vocab_size", None)
        return None if vocab is None else int(vocab)

    def query_for(self, n: int, options: Mapping[str, Any]) -> tuple[str, int]:
        """(query rule, query row): ``index`` and the row of the query token, or ``mean`` of the n tokens."""
        return "index", self.query_index(n)

    def query_index(self, n: int) -> int:
        """Row of the context that is the query: CLS (0) unless overridden."""
        return 0

    def notes(self, config: Any, n: int, state: Mapping[str, Any]) -> dict[str, str]:
        """What a reader needs to know about positions, attention and special tokens (report details)."""
        return {}

    def keep_state(self, model: nn.Module, state: Mapping[str, Any]) -> None:
        """Keep what :meth:`make_loaded_inputs` decided on the model, for :meth:`forward`."""
        return None

    def pretrained_source(self, spec: ModelSpec) -> str:
        """Where pretrained weights are read: an installed copy when there is one, else the hub id."""
        local = spec.local_weights() if spec.local_weights is not None else None
        return str(local) if local is not None else spec.source

    # -- what the context length follows -------------------------------------------------------------
    def context_length(self, config: Any, requested: int | None) -> int:
        """Tokens per example: ``requested`` checked against :meth:`context_limits`, or the model's own n."""
        return self.context_limits(config).check(requested, self.width(config))

    def planned_shape(
        self,
        spec: ModelSpec,
        weights: str,
        *,
        context_length: int | None,
        overrides: Mapping[str, Any] | None,
    ) -> tuple[int, int] | None:
        """(n, d) from the architecture alone, before any weights are read; None when only loading tells."""
        return None

    # -- what the extractor calls ----------------------------------------------------------------------
    @abstractmethod
    def blocks(self, model: nn.Module) -> Sequence[nn.Module]:
        """The transformer blocks in order; block L's output is representation ``block.L``."""

    @abstractmethod
    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> None:
        """Run the network on one batch (the extractor reads what it needs through hooks)."""

    def prepare(self, model: nn.Module, deepest: int) -> None:
        """Make blocks 0 .. ``deepest`` ready before a forward pass (-1: the embedding only); families that
        build the whole network at load time have nothing to do."""
        return None


# ---------------------------------------------------------------------------------------------------
# The width check
# ---------------------------------------------------------------------------------------------------


def check_width(name: str, n: int, d: int, fixed: bool = False) -> None:
    """Refuse a context length n above the width d: no context can have rank n (Assumption 2)."""
    if n > d:
        fix = (
            "n is fixed by the image and patch size, so audit a wider model"
            if fixed
            else f"choose a context length of at most {d} (--context-length)"
        )
        raise AuditError(f"context length n = {n} exceeds the width d = {d} of {name}: no context can have "
                         f"rank n (Assumption 2); {fix}")


# ---------------------------------------------------------------------------------------------------
# The shared implementation of the Hugging Face families (ViT, BERT, GPT-2)
# ---------------------------------------------------------------------------------------------------


def apply_overrides(config: Any, overrides: Mapping[str, Any] | None) -> Any:
    """Set fields of a Hugging Face config; an unknown field is a user error with close matches."""
    from auditor.core.errors import did_you_mean

    for key, value in (overrides or {}).items():
        if not hasattr(config, key):
            raise did_you_mean(f"{type(config).__name__} field", key, config.to_dict().keys())
        setattr(config, key, value)
    return config


class HFAdapter(Adapter):
    """A Hugging Face family: config class, model class, where the blocks are and how to call it."""

    config_class: Any
    model_class: Any
    block_paths: tuple[str, ...]  # attribute paths of the block list, newest transformers layout first
    model_kwargs: Mapping[str, Any] = {}
    optional_weights: tuple[str, ...] = ("pooler.",)

    # -- per-family hooks --------------------------------------------------------------------------
    def make_inputs(
        self, spec: ModelSpec, kind: str, folder: Path | None, config: Any, *, trust_remote_code: bool = False
    ) -> tuple[TextTokenizer | None, ImagePreprocessor | None]:
        """The tokenizer or image preprocessing matching the weights (``trust_remote_code``: a saved
        tokenizer may run code from the checkpoint)."""
        raise NotImplementedError

    # -- the steps of Adapter.load ---------------------------------------------------------------
    def read_architecture(self, request: LoadRequest) -> Any:
        if request.kind == "random":
            return self.random_config(request.spec, request.overrides, request.dtype)
        if request.kind == "folder":
            return self.folder_config(Path(request.source))
        return None  # a hub checkpoint: its config comes with the weights

    def build(self, request: LoadRequest, config: Any) -> tuple[nn.Module, Any]:
        if request.kind == "random":
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(request.seed)
                model = self.model_class(config, **self.model_kwargs)
            read_from = f"random init (torch.manual_seed({request.seed}))"
        else:
            from auditor.models.checkpoint import load_pretrained

            model = load_pretrained(self.model_class, request.source, model_kwargs=self.model_kwargs,
                                    optional=self.optional_weights)
            config = model.config
            read_from = request.source
        stored = weights_dtype(model.parameters())  # as initialised, or as the checkpoint holds them
        model = model.to(device=request.device, dtype=request.dtype).eval()
        request.details.update(weights_source=read_from, architecture=type(model).__name__,
                               weights_dtype=stored)
        return model, config

    def make_loaded_inputs(self, spec, kind, source, config, options):
        folder = Path(source) if kind == "folder" and source is not None else None
        tokenizer, preprocessor = self.make_inputs(spec, kind, folder, config,
                                                   trust_remote_code=bool(options.get("trust_remote_code")))
        return tokenizer, preprocessor, {}

    # -- the Adapter interface -------------------------------------------------------------------
    def blocks(self, model: nn.Module) -> Sequence[nn.Module]:
        for path in self.block_paths:
            obj: Any = model
            for attr in path.split("."):
                obj = getattr(obj, attr, None)
                if obj is None:
                    break
            if isinstance(obj, nn.ModuleList):
                return obj
        raise RuntimeError(f"{type(model).__name__}: no block list at {self.block_paths}")

    # -- configurations --------------------------------------------------------------------------
    def build_config(self, spec: ModelSpec, overrides: Mapping[str, Any] | None) -> Any:
        if spec.config is None:
            raise AuditError(f"{spec.name}: no architecture known offline; use weights='pretrained'")
        return apply_overrides(spec.config(), overrides)

    def random_config(self, spec: ModelSpec, overrides: Mapping[str, Any] | None,
                      dtype: torch.dtype = torch.float32) -> Any:
        """The registered architecture with ``overrides``, checked as data (its random weights within the
        machine's memory at ``dtype``, at least float32)."""
        from auditor.models.limits import check_config, config_error

        try:
            config = self.build_config(spec, overrides)
        except AuditError:
            raise
        except Exception as err:  # noqa: BLE001 - transformers' validation of an overridden field
            raise config_error(err, f"{spec.name} with config overrides {dict(overrides or {})}") from None
        check_config(self.tower(config), spec.name + (" with config overrides" if overrides else ""),
                     itemsize=max(4, dtype.itemsize))
        return config

    def check_folder(self, folder: Path) -> None:
        """Refuse a ``save_pretrained`` folder of another family."""
        found = folder_model_type(folder)
        if found not in self.model_types:
            raise AuditError(f"{folder} holds a {found or 'unknown'} model, not a {self.family} model")

    def folder_config(self, folder: Path) -> Any:
        """The config of a ``save_pretrained`` folder of this family, checked as data
        (:func:`auditor.models.limits.check_config`) before anything is built from it."""
        from auditor.models.checkpoint import check_not_quantized
        from auditor.models.limits import check_config, config_error

        self.check_folder(folder)
        check_not_quantized(folder)
        try:
            with quiet_transformers():
                config = self.config_class.from_pretrained(str(folder), local_files_only=True,
                                                           trust_remote_code=False)
        except Exception as err:  # noqa: BLE001 - transformers' validation raises StrictDataclassError & co
            raise config_error(err, str(folder / "config.json")) from None
        check_config(config, str(folder / "config.json"))
        return config

    def planned_shape(self, spec, weights, *, context_length, overrides):
        kind = weights_kind(weights)
        if kind == "folder":
            config = self.folder_config(Path(weights).expanduser())
        elif kind == "random":
            config = self.build_config(spec, overrides)
        elif spec.config is not None:
            config = spec.config()  # the registered (or hub-read) architecture of the pretrained weights
        else:
            return None
        return self.context_length(config, context_length), self.width(config)
