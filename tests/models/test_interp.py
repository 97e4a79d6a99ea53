"""Models held in TransformerLens or nnsight (extra ``interp``), audited exactly as the same architecture
loaded by name.

One tiny random GPT-2 (3 blocks, d = 32, built offline from a config) with a small byte-level BPE is saved
with ``save_pretrained``; the audit of that folder by name is the reference. The same weights held as a
TransformerLens ``TransformerBridge`` (booted from the folder), a ``HookedTransformer`` (TransformerLens < 4:
the folder's weights converted without weight processing), an nnsight ``LanguageModel`` and a plain
``NNsight`` wrapper must give the same inputs (data fingerprint), the same verdicts and ranks on every
representation, and tokens equal to the reference within float32 rounding. Each library's tests skip with
the reason where it is not installed (CI installs the extra).
"""

from __future__ import annotations

from importlib.metadata import version

import pandas as pd
import pytest
import torch

import auditor
from auditor.audit.extract import extract
from auditor.data import load_inputs
from auditor.models import load_model
from auditor.models.from_object import from_object

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore")]
N_CTX, BLOCKS, WIDTH, HEADS = 16, 3, 32, 4
OPTIONS = {"samples": 24, "first": True, "layers": "all", "tests": "assumption2,assumption1,general_position",
           "subsets": 40, "context_length": N_CTX, "device": "cpu", "robustness": False, "progress": False}
# what must be identical: the inputs, the decisions, the counts and the ranks (floats of the singular values
# may differ in their last bits: the libraries run the same layers with other attention kernels)
SAME = ["representation", "test", "status", "k", "N", "n", "d", "statement", "share_meets_threshold", "holds",
        "fraction", "rank_counts", "witness", "krank_lower", "krank_upper", "exhaustive", "data_fingerprint"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny random GPT-2 and its byte-level BPE (trained on the bundled reference text), saved together."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from auditor.data.samples import reference_text

    path = tmp_path_factory.mktemp("interp") / "tiny-gpt2"
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([reference_text()[:60_000]], trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>",
                                                     eos_token="<|endoftext|>")
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=WIDTH, n_layer=BLOCKS, n_head=HEADS, n_positions=128,
                                     vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=0)
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def reference(folder):
    """The audit of the folder by name, and its tokens."""
    rows = auditor.audit_model(str(folder), weights=str(folder), **OPTIONS)
    return rows, _tokens(load_model(str(folder), str(folder), device="cpu", context_length=N_CTX))


def _tokens(loaded) -> dict[str, torch.Tensor]:
    inputs = load_inputs(loaded, None, samples=OPTIONS["samples"], first=True, progress=False)
    reps = ["embedding", *(f"block.{i}" for i in range(BLOCKS))]
    return {name: t.contexts for name, t in extract(loaded, inputs, reps, progress=False).items()}


def float32_atol(x: torch.Tensor, depth: int) -> float:
    """How far two float32 evaluations of the same GPT-2 residual stream can lie apart when their kernels sum
    in other orders (eager against fused attention): each block adds the results of dot products of length
    d (attention input and output projections, MLP input), d / heads (scores), n (the attention average) and
    4 d (MLP output), each within (length) x eps x |result| (the classical gamma_n bound); the residual
    stream carries every block's error on unchanged, so the bound adds up over the ``depth`` blocks."""
    per_block = 3 * WIDTH + WIDTH // HEADS + N_CTX + 4 * WIDTH
    return depth * per_block * torch.finfo(torch.float32).eps * x.abs().max().item()


def _assert_same_audit(rows: pd.DataFrame, reference: pd.DataFrame) -> None:
    columns = [c for c in SAME if c in rows.columns and c in reference.columns]
    assert len(rows) == len(reference) == (BLOCKS + 1) * 3 and (rows["status"] == "ok").all()
    pd.testing.assert_frame_equal(rows[columns].reset_index(drop=True),
                                  reference[columns].reset_index(drop=True))
    assert (rows["weights"] == "in-memory").all()


def _assert_same_tokens(tokens: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    assert tokens.keys() == reference.keys()
    for name, want in reference.items():
        depth = 0 if name == "embedding" else int(name.split(".")[1]) + 1
        atol = float32_atol(want, depth) if depth else 0.0  # the embedding is a lookup and one addition
        got = tokens[name]
        assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
        if depth == 0:
            assert torch.equal(got, want), name
        else:
            assert (got - want).abs().max().item() <= atol, (name, (got - want).abs().max().item(), atol)


def _assert_close_blocks(got: torch.Tensor, want: torch.Tensor, depth: int) -> None:
    """The residual stream after ``depth`` blocks, computed in batches of other sizes: equal up to the
    float32 rounding of the blocks' dot products (:func:`float32_atol`)."""
    assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
    atol = float32_atol(want, depth)
    assert (got - want).abs().max().item() <= atol, ((got - want).abs().max().item(), atol)


# ---------------------------------------------------------------------------------------------------
# TransformerLens
# ---------------------------------------------------------------------------------------------------


def test_a_transformer_bridge_is_audited_as_the_folder(folder, reference):
    pytest.importorskip("transformer_lens", reason="TransformerLens is not installed (extra interp)")
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(str(folder), device="cpu")
    rows = auditor.audit_model(bridge, **OPTIONS)
    _assert_same_audit(rows, reference[0])
    loaded = from_object(bridge, context_length=N_CTX)
    assert loaded.details["architecture"] == "GPT2LMHeadModel" and loaded.query_index == N_CTX - 1
    tokens = _tokens(loaded)
    _assert_same_tokens(tokens, reference[1])
    inputs = load_inputs(loaded, None, samples=4, first=True, progress=False)
    ids = inputs.tensors["input_ids"]
    _, cache = bridge.run_with_cache(ids)  # TransformerLens's own view of the same hook points
    # the embedding is a lookup and one elementwise addition: bit-identical whatever the batch
    assert torch.equal(cache["blocks.0.hook_resid_pre"], cache["hook_embed"] + cache["hook_pos_embed"])
    assert torch.equal(tokens["embedding"][:4], cache["blocks.0.hook_resid_pre"])
    # the blocks' outputs: the tokens came from one batch of 24, the cache from a batch of 4 (other GEMM
    # shapes), so they agree within the float32 bound of the blocks' dot products
    for block in range(BLOCKS):
        want = cache[f"blocks.{block}.hook_resid_post"]
        _assert_close_blocks(tokens[f"block.{block}"][:4], want, block + 1)


def test_a_hooked_transformer_is_audited_as_the_folder(folder, reference):
    pytest.importorskip("transformer_lens", reason="TransformerLens is not installed (extra interp)")
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
        from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
    except ImportError:
        pytest.skip(f"TransformerLens {version('transformer_lens')} has no HookedTransformer (removed in "
                    "4.0; its TransformerBridge is tested above)")
    import transformers

    hf = transformers.GPT2LMHeadModel.from_pretrained(str(folder))
    config = HookedTransformerConfig(
        n_layers=BLOCKS, d_model=WIDTH, d_head=WIDTH // HEADS, n_heads=HEADS, d_mlp=4 * WIDTH,
        d_vocab=hf.config.vocab_size, n_ctx=128, act_fn="gelu_new", normalization_type="LN", eps=1e-5,
        original_architecture="GPT2LMHeadModel", positional_embedding_type="standard",
        default_prepend_bos=False)
    hooked = HookedTransformer(config, tokenizer=transformers.AutoTokenizer.from_pretrained(str(folder)))
    hooked.load_and_process_state_dict(convert_gpt2_weights(hf, config), fold_ln=False,
                                       center_writing_weights=False, center_unembed=False,
                                       fold_value_biases=False, refactor_factored_attn_matrices=False)
    rows = auditor.audit_model(hooked, **OPTIONS)
    _assert_same_audit(rows, reference[0])
    tokens = _tokens(from_object(hooked, context_length=N_CTX))
    _assert_same_tokens(tokens, reference[1])
    _, cache = hooked.run_with_cache(load_inputs(from_object(hooked, context_length=N_CTX), None, samples=4,
                                                 first=True, progress=False).tensors["input_ids"])
    assert torch.equal(tokens["embedding"][:4], cache["hook_embed"] + cache["hook_pos_embed"])  # elementwise
    # a batch of 24 against one of 4: other GEMM shapes, within the float32 bound of BLOCKS blocks
    last = f"block.{BLOCKS - 1}"
    _assert_close_blocks(tokens[last][:4], cache[f"blocks.{BLOCKS - 1}.hook_resid_post"], BLOCKS)


# ---------------------------------------------------------------------------------------------------
# nnsight
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("wrapper", ["LanguageModel", "NNsight"])
def test_an_nnsight_model_is_audited_as_the_folder(folder, reference, wrapper):
    nnsight = pytest.importorskip("nnsight", reason="nnsight is not installed (extra interp)")
    import transformers

    hf = transformers.GPT2LMHeadModel.from_pretrained(str(folder))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    if wrapper == "LanguageModel":
        model = nnsight.LanguageModel(hf, tokenizer=tokenizer)
    else:
        model = nnsight.NNsight(hf)
    processor = None if wrapper == "LanguageModel" else tokenizer  # a LanguageModel brings its tokenizer
    rows = auditor.audit_model(model, processor, **OPTIONS)
    _assert_same_audit(rows, reference[0])
    loaded = from_object(model, processor, context_length=N_CTX)
    assert loaded.model is hf.transformer and f"nnsight {wrapper}" in loaded.details["weights_source"]
    tokens = _tokens(loaded)
    for name, want in reference[1].items():  # the same module in the same process: the same bits
        assert torch.equal(tokens[name], want), name
    ids = load_inputs(loaded, None, samples=4, first=True, progress=False).tensors["input_ids"]
    with model.trace(ids):  # nnsight's own view of block 1's output
        saved = model.transformer.h[1].output.save()
    value = saved[0] if isinstance(saved, tuple | list) else saved
    _assert_close_blocks(tokens["block.1"][:4], value, 2)  # a batch of 24 against a trace of 4 examples


def test_objects_of_these_libraries_that_cannot_be_audited_say_what_can():
    pytest.importorskip("nnsight", reason="nnsight is not installed (extra interp)")
    import nnsight

    from auditor.core.errors import AuditError

    with pytest.raises(AuditError, match="expected a model name or a transformers model object") as err:
        auditor.audit_model(nnsight.NNsight(torch.nn.Sequential(torch.nn.Linear(2, 2))))
    assert "\n" not in str(err.value)
