"""The memorization room of the capacity lab (Paper A): how many examples multi-head attention memorizes.

Layout: ``data`` (the synthetic uniform-[0, 1) generator) -> ``model`` (the layer of the theory and the authors'
variant as a batched Ensemble) -> ``task`` (padding and masks so different H, n, d_h, N train together)
-> ``train`` (sweeps on the shared engine, bucketed) -> ``certify`` (rank of Z, least-squares readout,
Proposition 2) and ``saturation`` -> ``plots``. The experiments: ``experiment`` (``audit memorize``, with
the Figure 2 presets), ``certify_runs`` (``audit certify``) and ``pipeline`` (``audit capacity``, the
layer on real tokens).

>>> from auditor.lab.memorize.train import MemorizeSettings, grid, run_memorize
>>> runs = grid(heads=[1, 2, 4], context=[8], d_h=[16], N=[512], seeds=[0], d=16)
>>> frame = run_memorize(runs, MemorizeSettings(steps=2000, lr=1e-2, batch_size=512), "runs/mem")  # doctest: +SKIP
"""

from auditor.lab.memorize.certify import (
    Certificate,
    attention_features,
    capacity_bound,
    certify,
    lower_bound,
    proposition2_bound,
)
from auditor.lab.memorize.data import DataConfig, MemorizeData, make_data
from auditor.lab.memorize.model import MHAConfig, MHAEnsemble
from auditor.lab.memorize.saturation import Saturation, saturation
from auditor.lab.memorize.task import MemorizeTask
from auditor.lab.memorize.train import MemorizeRun, MemorizeSettings, Rounds, grid, run_memorize, train_rounds

__all__ = [
    "Certificate",
    "DataConfig",
    "MHAConfig",
    "MHAEnsemble",
    "MemorizeData",
    "MemorizeRun",
    "MemorizeSettings",
    "MemorizeTask",
    "Rounds",
    "Saturation",
    "attention_features",
    "capacity_bound",
    "certify",
    "grid",
    "lower_bound",
    "make_data",
    "proposition2_bound",
    "run_memorize",
    "saturation",
    "train_rounds",
]
