"""Streamed contexts: an audit whose tokens exceed the memory budget tests each chunk of contexts as it
is extracted and keeps only (N, d) per representation, with the rows of the in-memory audit.

Models are tiny random ViT and GPT-2 folders (save_pretrained); data are the shared ImageNet images and
WikiText-2. ``memory_budget=1e-9`` forces streaming in chunks of one batch.
"""

from __future__ import annotations

import dataclasses
import json
import weakref

import pandas as pd
import pytest
import torch
from conftest import save_tiny_vit, shared_data, tiny_gpt2, with_singular_values

import probes
from auditor.audit.assumptions import RunOptions
from auditor.audit.config import AuditConfig
from auditor.audit.plan import AuditPlan
from auditor.audit.runner import run
from auditor.audit.sources import load_inputs_for, streamed, token_groups
from auditor.audit.stream import ContextReducer, StreamedContexts, _Aligned
from auditor.audit.tokens import Tokens, TokenWriter
from probes import fast
from probes.geometry import CHUNK_BYTES

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore")]
TINY = 1e-9  # GiB: every chunk is one batch
TIMING = ["seconds", "git_commit"]  # what may differ between two runs of the same audit


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    from transformers import GPT2Config, GPT2Model

    root = tmp_path_factory.mktemp("stream-models")
    save_tiny_vit(root / "vit", num_hidden_layers=2)
    GPT2Model(GPT2Config(**tiny_gpt2(n_layer=2))).save_pretrained(root / "gpt2")
    return {"vit": str(root / "vit"), "gpt2": str(root / "gpt2")}


def _config(folders: dict[str, str], family: str, **options) -> AuditConfig:
    data = {"vit": ("imagenet-sample", {}), "gpt2": ("wikitext-2/valid.txt", {"context_length": 12})}
    path, extra = data[family]
    return AuditConfig(
        model=folders[family],
        data=str(shared_data(path)),
        samples=20,
        first=True,
        representations=("random-attention", "block.0", "block.1"),
        weights=("random",),
        subsets=40,
        device="cpu",
        batch_size=4,
        **extra,
        **options,
    )


@pytest.fixture(scope="module", params=[pytest.param("vit", marks=pytest.mark.slow), "gpt2"])
def both(request, folders, tmp_path_factory):
    """The same audit in memory and streamed (both saving their tokens)."""
    root = tmp_path_factory.mktemp(f"stream-{request.param}")
    held = run(_config(folders, request.param, save_tokens=True), out=root / "held", progress=False)
    flowing = run(
        _config(folders, request.param, save_tokens=True, memory_budget=TINY),
        out=root / "streamed",
        progress=False,
    )
    return held, flowing


def test_streamed_rows_ranks_and_depth_equal_the_in_memory_audit(both):
    held, flowing = both
    assert set(held.rows["test"]) == {"assumption1", "assumption2", "assumption3", "general_position"}
    assert len(held.rows) == 3 * 4 and len(held.depth) == 3  # a depth profile: random attention, two blocks
    # exact: the streamed reductions run on the blocks one in-memory call cuts (_Aligned), same shapes
    pd.testing.assert_frame_equal(flowing.rows.drop(columns=TIMING), held.rows.drop(columns=TIMING))
    pd.testing.assert_frame_equal(
        flowing.depth.drop(columns="git_commit"), held.depth.drop(columns="git_commit")
    )
    assert held.context_ranks.keys() == flowing.context_ranks.keys()
    for label in held.context_ranks:
        assert torch.equal(flowing.context_ranks[label], held.context_ranks[label])
        assert torch.equal(flowing.margins[label], held.margins[label])


def test_the_report_says_the_contexts_streamed(both):
    held, flowing = both
    assert "contexts" not in json.loads((held.out / "config.json").read_text())
    note = json.loads((flowing.out / "config.json").read_text())["contexts"]
    assert note.startswith("streamed in chunks of at most 4 examples")


def test_tokens_saved_chunk_by_chunk_read_back_as_the_in_memory_files(both):
    held, flowing = both
    names = sorted(p.name for p in (held.out / "tokens").iterdir())
    assert len(names) == 3 and names == sorted(p.name for p in (flowing.out / "tokens").iterdir())
    for name in names:
        a, b = Tokens.load(held.out / "tokens" / name), Tokens.load(flowing.out / "tokens" / name)
        # both runs extract in batches of 4 (same process, same kernels), written and read back: bit-identical
        assert torch.equal(a.contexts, b.contexts) and torch.equal(a.queries, b.queries)
        assert a.meta == b.meta


def test_a_streamed_token_file_retests_to_the_same_rows(both, tmp_path):
    held, flowing = both
    file = flowing.out / "tokens" / "block.1@random.safetensors"
    again = run(AuditConfig(model=held.config.model, tokens=(str(file),), subsets=40, device="cpu"),
                out=tmp_path / "again", progress=False)
    want = held.rows[held.rows["representation"] == "block.1"].reset_index(drop=True)
    got = again.rows.reset_index(drop=True)
    same = [
        "test",
        "fraction",
        "share_meets_threshold",
        "statement",
        "min_margin",
        "critical_rtol",
        "rank_counts",
        "witness",
        "collapse_residual",
    ]
    pd.testing.assert_frame_equal(got[same], want[same])  # the same tokens, tested in memory by both runs


def test_memory_is_bounded_by_the_chunk_not_by_n(folders):
    config = _config(folders, "vit", memory_budget=TINY)
    from auditor.models import load_model

    loaded = load_model(config.model, "random", device="cpu", seed=0)
    plan = AuditPlan.of(config)
    groups = list(
        token_groups(
            loaded, ["embedding", "block.1"], plan.sampling, plan.extraction, plan.testing, None, False
        )
    )
    assert len(groups) == 1
    for item in groups[0].items:
        contexts = item.contexts
        assert isinstance(contexts, StreamedContexts) and contexts.shape == (20, loaded.n, loaded.d)
        assert contexts.chunk == config.batch_size  # whole batches; the tiny budget allows one
        # held at once: one chunk, and per reduction the rows waiting to fill the block its probes call
        # works on (Assumption 2: 256 MiB of float64 Gram matrices, e.g. 125 ViT-base contexts; the
        # residuals: 64 MiB of float64, 55 ViT-base contexts), whatever N
        num, n, d = contexts.shape
        blocks = (fast.chunk_size(n, d), max(1, CHUNK_BYTES // (8 * n * d)))
        assert contexts.largest <= contexts.chunk + sum(min(b - 1, num - contexts.chunk) for b in blocks)
        assert item.queries.shape == (20, loaded.d)
        contexts.release()
        assert not contexts.file.path.exists()  # the temporary contexts file is gone after the tests
    roomy = list(
        token_groups(
            loaded,
            ["embedding", "block.1"],
            plan.sampling,
            dataclasses.replace(plan.extraction, memory_budget=1.0),
            plan.testing,
            None,
            False,
        )
    )
    assert all(isinstance(item.contexts, torch.Tensor) for group in roomy for item in group.items)  # held


def test_images_decoded_per_batch_give_the_rows_of_images_decoded_up_front(folders, monkeypatch):
    """Images decoded per batch with the contexts streamed give the rows of every image decoded up front
    with the contexts held (a random draw of 20, in batches of 4), and no more than two batches of decoded
    images are alive at once."""
    import auditor.data as data
    from auditor.data.images import ImagesOnDemand

    config = dataclasses.replace(_config(folders, "vit", memory_budget=TINY), first=False)
    alive: weakref.WeakSet[torch.Tensor] = weakref.WeakSet()
    peak, take = [0], ImagesOnDemand.take

    def counted(self, start, stop):
        out = take(self, start, stop)
        alive.add(out["pixel_values"])
        peak[0] = max(peak[0], sum(len(t) for t in alive))
        return out

    with monkeypatch.context() as patch:
        patch.setattr(ImagesOnDemand, "take", counted)
        flowing = run(config, out=None, progress=False)
    assert 4 <= peak[0] <= 2 * config.batch_size < 20
    load = data.load_inputs

    def held(*args, **kwargs):  # every image decoded and held, as before images were decoded per batch
        inputs = load(*args, **kwargs)
        return dataclasses.replace(inputs, tensors=inputs.examples(), on_demand=None)

    monkeypatch.setattr(data, "load_inputs", held)
    before = run(dataclasses.replace(config, memory_budget=None), out=None, progress=False)
    assert before.rows["data_source"].str.contains("20 of 1000 image files drawn at random").all()
    pd.testing.assert_frame_equal(flowing.rows.drop(columns=TIMING), before.rows.drop(columns=TIMING))


def test_the_chunks_are_whole_batches_of_the_same_forward_pass(folders):
    from auditor.audit.extract import extract
    from auditor.models import load_model

    config = _config(folders, "gpt2", memory_budget=TINY)
    loaded = load_model(config.model, "random", device="cpu", seed=0, context_length=12)
    plan = AuditPlan.of(config)
    read = load_inputs_for(loaded, plan.sampling, None, False)
    reference = extract(loaded, read.inputs, ["block.0"], batch_size=4, progress=False)["block.0"]
    group = streamed(loaded, read, ["block.0"], plan.extraction, plan.testing, False)
    assert torch.equal(group.items[0].queries, reference.queries)
    assert dict(group.items[0].meta) == reference.meta


# ---------------------------------------------------------------------------------------------------
# The reductions on their own: any chunking gives the in-memory values bit for bit
# ---------------------------------------------------------------------------------------------------


def _contexts(num: int = 150, n: int = 6, d: int = 10) -> torch.Tensor:
    """Random contexts (num, n, d), float32, every 7th of rank n - 1 and one with a tiny singular value."""
    gen = torch.Generator().manual_seed(3)
    e = torch.randn(num, n, d, generator=gen)
    e[::7, -1] = e[::7, 0] * 2  # rank n - 1
    e[5] = with_singular_values([1.0, 0.5, 0.2, 0.1, 0.05, 1e-6], n, d).to(torch.float32)
    return e


@pytest.mark.parametrize("chunk", [1, 4, 37, 150])
def test_streamed_reductions_equal_probes_on_all_contexts(chunk):
    e = _contexts()
    q = e[:, 0].clone()
    reducer = ContextReducer(
        *e.shape,
        e.dtype,
        torch.device("cpu"),
        tests=("assumption2", "assumption3"),
        rtol=None,
        robustness=True,
        geometry=True,
        save=None,
        chunk=chunk,
    )
    for start in range(0, e.shape[0], chunk):
        reducer.add(e[start : start + chunk], q[start : start + chunk], {"n": "6"})
    queries, s = reducer.finish()
    assert torch.equal(queries, q)
    ranks = probes.context_ranks(e)  # exact below: every chunking feeds the blocks of this call (_Aligned)
    assert torch.equal(s.ranks.rank, ranks.rank) and torch.equal(s.ranks.margin, ranks.margin)
    assert torch.equal(s.ranks.bound, ranks.bound) and s.ranks.stages == ranks.stages
    from probes.geometry import token_geometry

    assert s.collapse_residual() == token_geometry(e, q).collapse_residual
    options = RunOptions(subsets=200, seed=0, rtol=None, threshold=0.99)
    want2 = probes.assumption2(e, ranks=ranks, threshold=1.0).to_dict()  # (the audit's: every context)
    got2 = s.run("assumption2", q, 6, options)[0].to_dict()
    assert not want2["share_meets_threshold"] and want2["witness"] == [0]
    assert {k: v for k, v in got2.items() if k != "seconds"} == {
        k: v for k, v in want2.items() if k != "seconds"
    }
    want3 = probes.assumption3(e, q, 6, subsets=200).to_dict()
    got3 = s.run("assumption3", q, 6, options)[0].to_dict()
    assert {k: v for k, v in got3.items() if k != "seconds"} == {
        k: v for k, v in want3.items() if k != "seconds"
    }
    s.release()


def test_more_contexts_than_announced_are_refused_and_leave_no_file():
    e = _contexts()
    reducer = ContextReducer(e.shape[0] - 1, *e.shape[1:], e.dtype, torch.device("cpu"),
                             tests=("assumption2", "assumption3"), rtol=None, robustness=True, geometry=False,
                             save=None, chunk=e.shape[0])
    reducer.add(e[:100], e[:100, 0].clone(), {"n": "6"})
    with pytest.raises(RuntimeError, match="more than the N = "):
        reducer.add(e[100:], e[100:, 0].clone(), {"n": "6"})
    assert reducer.writer is not None and not reducer.writer.tmp.exists()  # the temporary file removed


def test_aligned_blocks_are_those_of_one_call():
    seen: list[int] = []
    aligned = _Aligned(5, lambda block: seen.append(int(block.shape[0])))
    for size in (3, 1, 8, 2, 4):  # 18 rows
        aligned.feed(torch.zeros(size, 2, 2))
        assert aligned.held < 5
    aligned.finish()
    assert seen == [10, 5, 3]  # whole blocks (two at once when they came together), the rest at the end


def test_token_writer_refuses_a_chunk_that_does_not_continue_and_leaves_no_file(tmp_path):
    writer = TokenWriter(tmp_path / "t.safetensors", 4, 3, 5, torch.float32, {"n": "3", "d": "5"})
    writer.write(torch.zeros(3, 3, 5))
    with pytest.raises(ValueError, match="does not continue"):
        writer.write(torch.zeros(2, 3, 5))  # 5 > N = 4
    writer.abort()
    assert list(tmp_path.iterdir()) == []
