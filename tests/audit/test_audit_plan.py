"""The audit's plan: a configuration split into the frozen parts each stage receives, checked before any work,
and the cost rule of the default context length.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from auditor.audit.assumptions import RunOptions
from auditor.audit.config import AuditConfig
from auditor.audit.plan import (
    DEFAULT_COST,
    AuditPlan,
    DefaultCost,
    Extraction,
    Loading,
    Row,
    Sampling,
    Sweep,
    audit_flops,
    default_context_length,
)
from auditor.core.errors import AuditError
from auditor.core.slurm import SlurmOptions
from auditor.data import BUNDLED_MIN_SAMPLES


def test_every_field_of_the_configuration_reaches_exactly_the_parts_that_use_it():
    config = AuditConfig(model="gpt2", data="some.txt", samples=64, first=True, subsets=300, seed=7,
                         rtol=1e-5, threshold=0.9, device="cpu", batch_size=8, context_length=32, sweep=True,
                         sweep_ks=(4, 9), sweep_subsets=50, sweep_refine=2, dtype="float64", bos=False,
                         threads=1, workers=2, memory_budget=0.5, robustness=False, tests=("assumption1",),
                         weights=("random",))
    plan = AuditPlan.of(config)
    assert plan.sampling == Sampling(data="some.txt", samples=64, first=True, seed=7, sweep_k=9)
    assert plan.loading == Loading(device="cpu", seed=7, context_length=32, trust_remote_code=False,
                                   dtype="float64", query=None, bos=False)
    assert plan.extraction.batch_size == 8 and plan.extraction.memory_budget == 0.5
    assert plan.extraction.sharding is not None and plan.extraction.sharding.workers == 2
    sharding = plan.extraction.sharding
    assert sharding.slurm == SlurmOptions() and sharding.loading == plan.loading
    assert plan.testing == RunOptions(subsets=300, seed=7, rtol=1e-5, threshold=0.9, robustness=False,
                                      tests=("assumption1",))
    assert plan.sweep == Sweep(ks=(4, 9), subsets=50, refine=2, seed=7, rtol=1e-5)
    assert plan.rows == tuple(Row(rep, "random") for rep in ("embedding", "random-attention", "block.0"))
    assert plan.threads == 1 and plan.tokens is None


def test_the_parts_are_frozen_and_the_defaults_extract_in_this_process():
    plan = AuditPlan.of(AuditConfig())
    assert plan.extraction == Extraction(batch_size=32, seed=0, device="auto", memory_budget=None,
                                         save_tokens=False)
    assert plan.sweep is None and plan.sampling.sweep_k is None
    for part in (plan, plan.sampling, plan.loading, plan.extraction, plan.testing):
        with pytest.raises(dataclasses.FrozenInstanceError):
            part.seed = 1  # type: ignore[misc]


def test_pins_and_layers_shape_the_rows_and_the_depth_audit():
    pinned = AuditPlan.of(AuditConfig(representations=("embedding", "block.0@pretrained"),
                                      weights=("random",)))
    assert pinned.by_weights() == {"random": ["embedding"], "pretrained": ["block.0"]}
    assert not pinned.across_depth
    assert AuditPlan.of(AuditConfig(representations=("block.0", "block.3"))).across_depth
    deep = AuditPlan.of(AuditConfig(layers="-2:", weights=("random",)))
    assert deep.across_depth and deep.rows == (Row("embedding", "random"),)
    assert deep.representations(["embedding"], 4) == ["embedding", "block.2", "block.3"]


def test_the_default_sample_count_is_the_bundled_rule_or_the_asked_one():
    assert Sampling(data=None, samples=None, first=False, seed=0).count(8) == BUNDLED_MIN_SAMPLES
    assert Sampling(data=None, samples=40, first=False, seed=0).count(8) == 40


@pytest.mark.parametrize("options, message", [
    ({"tokens": ("a.safetensors",), "samples": 10}, "samples do not apply when re-testing token files"),
    ({"tokens": ("a.safetensors",), "workers": 2}, "workers do not apply when re-testing token files"),
])
def test_options_that_cannot_go_together_are_refused_when_the_plan_is_made(options, message):
    with pytest.raises(AuditError, match=message):
        AuditPlan.of(AuditConfig(**options))


def test_a_shape_the_plan_cannot_test_is_refused_before_any_work():
    plan = AuditPlan.of(AuditConfig(model="m"))
    with pytest.raises(AuditError, match="context length n = 9 exceeds the width d = 8 of m"):
        plan.check_shape(n=9, d=8)
    with pytest.raises(AuditError, match="block.7"):
        plan.check_shape(n=4, d=8, layers=2, reps=["block.7"])
    plan.check_shape(n=4, d=8, layers=2, reps=["embedding", "block.1"], num=10)  # fits


# ---------------------------------------------------------------------------------------------------
# The default context length of text models: one cost rule
# ---------------------------------------------------------------------------------------------------


def test_the_cost_rule_halves_only_the_defaults_that_would_not_end_in_minutes():
    assert default_context_length(512, 768) == 256  # bert-base: 2.9e13 estimated at n = 512
    assert default_context_length(512, 1024) == 256  # bert-large
    assert default_context_length(1024, 1280) == 128  # gpt2-large: 1.3e13 still at n = 256
    assert default_context_length(256, 768) == 256  # gpt2: 6.5e12, 150 s measured
    assert default_context_length(128, 384) == 128  # minilm
    assert default_context_length(128, 2048) == 128  # llama-3.2-1b: the decoders' own rule already fits
    assert default_context_length(512, 768, DefaultCost(flops=1.0)) == DefaultCost().smallest_n
    assert audit_flops(512, 256, 768) == pytest.approx(6.5e12, rel=0.01)
    assert audit_flops(1024, 512, 768) > DEFAULT_COST.flops >= audit_flops(512, 256, 768)


def test_the_plan_asks_text_models_for_the_rule_s_n_and_leaves_images_and_given_n_alone():
    from auditor.models import resolve

    plan = AuditPlan.of(AuditConfig())
    assert plan.context_length(resolve("bert-base"), "random") == 256
    assert plan.context_length(resolve("gpt2"), "random") == 256
    assert plan.context_length(resolve("vit-base"), "random") is None  # n is the model's patch grid
    assert AuditPlan.of(AuditConfig(context_length=64)).context_length(resolve("bert-base"), "random") == 64


def test_an_audit_with_no_context_length_uses_the_rule_also_in_sharded_workers():
    """The rows carry the rule's n, in one process and across workers (each worker builds the same model)."""
    from conftest import shared_data

    import auditor

    common = dict(data=str(shared_data("wikitext-2/test.txt")), samples=8, first=True, weights="random",
                  representations="embedding", tests="assumption2", device="cpu", progress=False)
    one = auditor.audit_model("bert-base", **common)
    assert (one["n"] == 256).all() and (one["d"] == 768).all()
    two = auditor.audit_model("bert-base", workers=2, **common)
    assert two["fraction"].tolist() == one["fraction"].tolist() and (two["n"] == 256).all()
    assert (auditor.audit_model("bert-base", context_length=32, **common)["n"] == 32).all()


def test_long_stages_show_the_time_left(capsys):
    """Extraction and the tests draw bars with a total, so tqdm prints elapsed<remaining."""
    import torch

    import auditor

    gen = torch.Generator().manual_seed(0)
    contexts = torch.randn(40, 3, 8, generator=gen, dtype=torch.float64)  # (N, n, d)
    auditor.audit_tokens(contexts, contexts[:, 0].clone(), subsets=10, progress=True)
    err = capsys.readouterr().err
    assert re.search(r"tests \(given\).*4/4 \[\d\d:\d\d<\d\d:\d\d", err), err[-500:]


def test_audit_models_lists_every_name_with_the_n_of_its_default_audit(capsys):
    from auditor.cli import main
    from auditor.models import known_models

    assert main(["models"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert sorted(lines) == sorted(known_models())
    assert " n = 256 " in lines["bert-base"] and " n = 128 " in lines["gpt2-large"]
    assert " n = 197 " in lines["vit-base"]
