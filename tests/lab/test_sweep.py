"""Scaling out and surviving failure: resumable sweeps, a real SIGKILL, Ray execution, sharded extraction.

The sweep units here do real work with known answers: the numerical rank of a seeded product of an
(m x r) and an (r x n) Gaussian matrix is min(m, r, n). Ray tests start one real local Ray instance
for the module (2 CPUs); nothing is mocked.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import shared_data, tiny_gpt2, tiny_memorize, tiny_vit

import probes
from auditor.core.errors import AuditError
from auditor.core.provenance import provenance
from auditor.lab import sweep
from auditor.lab.sweep import collect, field_defaults, key_fields, run_sweep, unit_key

HERE = Path(__file__).resolve().parent
TESTS = [str(HERE), str(HERE.parent)]  # this module and conftest, for the subprocesses
GATE_ENV = "AUDITOR_TEST_SWEEP_GATE"  # units with index >= GATE_AT wait for this file (kill test only)
GATE_AT = 3
ran_units: list[int] = []  # indices of the units run in this process


def rank_unit(config: dict) -> list[dict]:
    """Numerical rank of a seeded rank-r product (known answer min(m, r, n)), at two tolerances."""
    gate = os.environ.get(GATE_ENV)
    if gate and config["index"] >= GATE_AT:
        Path(gate + ".waiting").touch()  # units 0 .. GATE_AT-1 are on disk by now
        deadline = time.monotonic() + 300
        while not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    ran_units.append(config["index"])
    gen = torch.Generator().manual_seed(config["seed"])
    m, r, n = config["m"], config["r"], config["n"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # in every process (local, subprocess, Ray worker): the same kernels, so the
    try:  # sweeps below compare their floats exactly whichever process ran a unit
        a = torch.randn(m, r, generator=gen, dtype=torch.float64) @ torch.randn(
            r, n, generator=gen, dtype=torch.float64
        )
        results = [(rtol, probes.numerical_rank(a, rtol=rtol)) for rtol in (None, 1e-6)]
    finally:
        torch.set_num_threads(threads)
    return [{"index": config["index"], "m": m, "r": r, "n": n, "rtol": rtol, "rank": int(res.rank),
             "margin": float(res.margin), "tol": float(res.tol), "seed": config["seed"], "dtype": "float64",
             "device": "cpu", **provenance()} for rtol, res in results]


def failing_unit(config: dict) -> dict:
    """Fails on the unit with index 2 (as a user error), runs the others."""
    if config["index"] == 2:
        raise AuditError(f"unit {config['index']} cannot run: r must be <= 8")
    return rank_unit(config)[0]


def must_not_run(config: dict) -> dict:
    raise AssertionError(f"unit {config} ran although it had finished")


CONFIGS = [{"index": i, "m": 24, "r": r, "n": 20, "seed": i} for i, r in enumerate((3, 7, 12, 20, 1, 16))]


def unit_files(out: Path) -> list[Path]:
    return sorted((out / "units").glob("*.json"))


def test_unit_key_depends_on_values_not_key_order():
    assert unit_key({"a": 1, "b": [1, 2]}) == unit_key({"b": [1, 2], "a": 1})
    assert unit_key({"a": 1}) != unit_key({"a": 2})
    assert unit_key({"x": (1, 2)}) == unit_key({"x": [1, 2]})  # what JSON stores is what is hashed
    assert len(unit_key({})) == 16


@dataclasses.dataclass(frozen=True)
class Layer:
    width: int
    heads: int = 1


@dataclasses.dataclass(frozen=True)
class LayerWithBias(Layer):  # the same unit a release later: a field added with its default
    bias: bool = False


def test_key_leaves_out_entries_at_their_declared_default():
    unit = {
        "m": 24,
        "layers": [{"width": 4, "heads": 1}, {"width": 8, "heads": 2}],
        "tol": 0.1,
        "workdir": "x",
    }
    declared = {"layers": [Layer], "tol": 0.1}
    assert key_fields(unit, declared) == {"m": 24, "layers": [{"width": 4}, {"width": 8, "heads": 2}]}
    assert unit_key(unit, declared) == unit_key({"m": 24, "layers": [{"width": 4}, {"width": 8, "heads": 2}]})
    assert unit_key({**unit, "tol": 0.2}, declared) != unit_key(unit, declared)  # off its default: in the key
    assert key_fields({"width": 4, "heads": 1}, Layer) == {"width": 4}  # a dataclass declares a whole unit
    assert field_defaults(LayerWithBias) == {"heads": 1, "bias": False}


def layers_unit(config: dict) -> dict:
    return {"width": config["layer"]["width"], "cells": config["layer"]["width"] * config["layer"]["heads"]}


def test_a_field_added_with_its_default_keys_no_finished_unit_anew(tmp_path):
    before = [{"layer": dataclasses.asdict(Layer(w)), "seed": 0} for w in (2, 3)]
    first = run_sweep(layers_unit, before, tmp_path, progress=False, key_defaults={"layer": Layer})
    after = [{"layer": dataclasses.asdict(LayerWithBias(w)), "seed": 0} for w in (2, 3)]
    again = run_sweep(must_not_run, after, tmp_path, progress=False, key_defaults={"layer": LayerWithBias})
    assert again["cells"].tolist() == first["cells"].tolist() == [2, 3]
    biased = [{"layer": dataclasses.asdict(LayerWithBias(2, bias=True)), "seed": 0}]
    with pytest.raises(AssertionError, match="ran although it had finished"):  # new work: a new key
        run_sweep(must_not_run, biased, tmp_path, progress=False, key_defaults={"layer": LayerWithBias})


def test_local_sweep_rows_are_right_ordered_and_reproducible_from_their_line(tmp_path):
    frame = run_sweep(rank_unit, CONFIGS, tmp_path, progress=False)
    assert len(unit_files(tmp_path)) == len(CONFIGS)
    assert frame["index"].tolist() == [i for i in range(len(CONFIGS)) for _ in range(2)]
    expected = [min(c["m"], c["r"], c["n"]) for c in CONFIGS for _ in range(2)]
    assert frame["rank"].tolist() == expected  # the known answer, at both tolerances
    saved = pd.read_csv(tmp_path / "results.csv")
    assert saved["rank"].tolist() == expected and saved["margin"].tolist() == frame["margin"].tolist()
    for _, row in saved.iterrows():
        config = json.loads(row["unit_config"])
        assert unit_key(config) == row["unit"]
        again = rank_unit(config)  # the row's own line says how to make it again
        assert any(r["margin"] == row["margin"] and r["rank"] == row["rank"] for r in again)
        assert row["git_commit"] and row["versions"]


def test_rerun_skips_finished_units_and_rebuilds_the_csv(tmp_path):
    first = run_sweep(rank_unit, CONFIGS, tmp_path, progress=False)
    (tmp_path / "results.csv").write_text("index,ra")  # a truncated CSV is rebuilt, never read
    again = run_sweep(must_not_run, CONFIGS, tmp_path, progress=False)
    pd.testing.assert_frame_equal(first, again)
    assert pd.read_csv(tmp_path / "results.csv")["rank"].tolist() == first["rank"].tolist()
    subset = collect(tmp_path, CONFIGS[::-1][:2])  # any subset, in the order asked for
    assert subset["index"].tolist() == [5, 5, 4, 4]


def test_moved_output_folder_still_resumes(tmp_path):
    """A unit's ``workdir`` says where it keeps side files, not what it computes: a sweep moved to a
    new folder (with workdir pointing there) finds its finished units."""
    first = [{**c, "workdir": str(tmp_path / "a")} for c in CONFIGS]
    frame = run_sweep(rank_unit, first, tmp_path / "a", progress=False)
    shutil.move(tmp_path / "a", tmp_path / "b")
    moved = [{**c, "workdir": str(tmp_path / "b")} for c in CONFIGS]
    again = run_sweep(must_not_run, moved, tmp_path / "b", progress=False)
    assert again["rank"].tolist() == frame["rank"].tolist()
    assert unit_key(first[0]) == unit_key(moved[0]) == unit_key(CONFIGS[0])


def test_truncated_corrupt_or_foreign_unit_files_are_run_again(tmp_path):
    reference = run_sweep(rank_unit, CONFIGS, tmp_path / "ref", progress=False)
    out = tmp_path / "run"
    run_sweep(rank_unit, CONFIGS, out, progress=False)
    files = {json.loads(p.read_text())["config"]["index"]: p for p in unit_files(out)}
    text = files[1].read_text()
    files[1].write_text(text[: len(text) // 2])  # truncated
    files[3].write_bytes(b"\x00\xff garbage")  # not JSON
    files[4].write_text(json.dumps({"config": CONFIGS[0], "rows": [{"rank": 99}]}))  # another config's record
    files[5].write_text(json.dumps({"config": CONFIGS[5], "rows": "not rows"}))
    ran_units.clear()
    frame = run_sweep(rank_unit, CONFIGS, out, progress=False)
    assert sorted(ran_units) == [1, 3, 4, 5]
    pd.testing.assert_frame_equal(frame, reference)
    assert (out / "results.csv").read_bytes() == (tmp_path / "ref" / "results.csv").read_bytes()


def test_failed_unit_keeps_finished_rows_and_a_failed_fresh_sweep_leaves_no_folder(tmp_path):
    out = tmp_path / "partial"
    with pytest.raises(AuditError, match="unit 2 cannot run"):
        run_sweep(failing_unit, CONFIGS, out, progress=False)
    assert len(unit_files(out)) == 2  # units 0 and 1 finished before the failure
    frame = run_sweep(rank_unit, CONFIGS, out, progress=False)
    assert frame["index"].tolist() == [0, 1] + [i for i in range(2, len(CONFIGS)) for _ in range(2)]
    fresh = tmp_path / "a" / "b" / "fresh"
    with pytest.raises(AuditError):
        run_sweep(failing_unit, [CONFIGS[2]], fresh, progress=False)
    assert not (tmp_path / "a").exists()


def test_one_sweep_per_folder_and_stale_temp_files_are_cleaned(tmp_path):
    run_sweep(rank_unit, CONFIGS[:2], tmp_path, progress=False)
    stale = tmp_path / "units" / f".{unit_key(CONFIGS[2])}.json.abc123.tmp"
    with sweep._exclusive(tmp_path / "units"):  # a live sweep holds the folder
        stale.write_text('{"config": {"ind')  # what a kill in the middle of a write leaves
        with pytest.raises(AuditError, match="another sweep is writing"):
            run_sweep(rank_unit, CONFIGS, tmp_path, progress=False)
        assert stale.exists()  # the refused sweep touched nothing
    stale_csv = tmp_path / ".results.csv.xyz789.tmp"
    stale_csv.write_text("index,ra")
    run_sweep(rank_unit, CONFIGS, tmp_path, progress=False)
    assert not stale.exists() and not stale_csv.exists() and len(unit_files(tmp_path)) == len(CONFIGS)


def test_sweep_arguments_are_checked(tmp_path):
    with pytest.raises(AuditError, match="unknown executor 'spark'; valid: local, ray, slurm"):
        run_sweep(rank_unit, CONFIGS, tmp_path, executor="spark")
    with pytest.raises(AuditError, match="same configuration twice"):
        run_sweep(rank_unit, [CONFIGS[0], dict(CONFIGS[0])], tmp_path)
    with pytest.raises(AuditError, match="no configurations"):
        run_sweep(rank_unit, [], tmp_path)
    with pytest.raises(TypeError, match="must return a dict or a list of dicts"):
        run_sweep(json.dumps, [CONFIGS[0]], tmp_path / "bad", progress=False)
    assert not (tmp_path / "bad").exists()


_SWEEP_SCRIPT = """
import sys
sys.path[:0] = {tests!r}
from test_sweep import CONFIGS, rank_unit
from auditor.lab.sweep import run_sweep
run_sweep(rank_unit, CONFIGS, sys.argv[1], progress=False)
"""


def test_sigkill_mid_sweep_loses_no_finished_row_and_resumes_to_the_same_csv(tmp_path):
    out, gate = tmp_path / "killed", tmp_path / "gate"
    env = {**os.environ, GATE_ENV: str(gate)}
    proc = subprocess.Popen([sys.executable, "-c", _SWEEP_SCRIPT.format(tests=TESTS), str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not Path(str(gate) + ".waiting").exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the sweep never reached the gated unit"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)  # while unit GATE_AT runs: a real, uncatchable kill
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    finished = unit_files(out)
    assert len(finished) == GATE_AT  # every unit finished before the kill is on disk, complete
    for path in finished:
        payload = json.loads(path.read_text())
        assert unit_key(payload["config"]) == path.stem and len(payload["rows"]) == 2
    assert not (out / "results.csv").exists()

    ran_units.clear()
    resumed = run_sweep(rank_unit, CONFIGS, out, progress=False)
    assert ran_units == list(range(GATE_AT, len(CONFIGS)))  # only the unfinished units ran again
    reference = run_sweep(rank_unit, CONFIGS, tmp_path / "uninterrupted", progress=False)
    same = ["git_commit"]  # provenance: a commit made while the test runs changes it, nothing else
    pd.testing.assert_frame_equal(resumed.drop(columns=same), reference.drop(columns=same))
    # the same text, field for field, but the provenance (the killed run stamped its own process's)
    uninterrupted = tmp_path / "uninterrupted" / "results.csv"
    assert csv_fields(out / "results.csv", same) == csv_fields(uninterrupted, same)
    assert not list((out / "units").glob(".*.tmp"))


def csv_fields(path: Path, drop: list[str]) -> list[list[str]]:
    """A CSV file's fields as written (strings), without the columns ``drop``."""
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    keep = [i for i, name in enumerate(rows[0]) if name not in drop]
    return [[row[i] for i in keep] for row in rows]


@pytest.mark.slow
def test_sigkill_of_the_memorize_cli_resumes_to_the_uninterrupted_result(tmp_path):
    """A real room: ``audit memorize`` killed after its first bucket, rerun, equals an uninterrupted run."""
    args = ["-m", "auditor.cli", "memorize", "--heads", "1,2,3", "--context", "4", "--d-h", "4", "--N", "32",
            "--d", "8", "--classes", "10", "--steps", "200", "--batch-size", "16", "--bucket-size", "1",
            "--threads", "1"]
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, *args, "--out", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (out / "units").is_dir() or not unit_files(out):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert 1 <= len(unit_files(out)) < 3
    for path in unit_files(out):
        json.loads(path.read_text())
    for folder in (out, tmp_path / "uninterrupted"):
        subprocess.run([sys.executable, *args, "--out", str(folder)], check=True, capture_output=True)
    a, b = (pd.read_csv(f / "results.csv") for f in (out, tmp_path / "uninterrupted"))
    assert a["unit"].tolist() == b["unit"].tolist()  # keys leave the output folder out
    varying = ["seconds", "unit_config", "git_commit"]  # wall time; the folder; a commit made meanwhile
    pd.testing.assert_frame_equal(a.drop(columns=varying), b.drop(columns=varying))


# ---------------------------------------------------------------------------------------------------
# Ray: one real local instance for the module
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import tests/
    started = not ray.is_initialized()
    if started:
        # address="local": a new instance even if a `ray start` cluster (or a stale record of one) exists
        ray.init(
            address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING"
        )
    yield ray
    if started:
        ray.shutdown()


_CLUSTER_DRIVER = """
import sys
sys.path[:0] = {tests!r}
import ray
import test_sweep
from auditor.lab.sweep import run_sweep
ray.cloudpickle.register_pickle_by_value(test_sweep)
run_sweep(test_sweep.rank_unit, test_sweep.CONFIGS, sys.argv[1], executor="ray", address=sys.argv[2],
          progress=False)
"""


@pytest.mark.slow
def test_sweep_on_a_cluster_started_with_ray_start_equals_local(tmp_path):
    """The documented cluster path: ``ray start --head`` in one process, the sweep joins it by address."""
    pytest.importorskip("ray")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # a throwaway single-node cluster on this machine
    ray_cli = str(Path(sys.executable).with_name("ray"))
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # its own session folder: no trace in /tmp/ray
    head = subprocess.Popen(
        [
            ray_cli,
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp}",
        ],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        driver = subprocess.run(
            [
                sys.executable,
                "-c",
                _CLUSTER_DRIVER.format(tests=TESTS),
                str(tmp_path / "ray"),
                f"127.0.0.1:{port}",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert driver.returncode == 0, driver.stderr[-3000:]
    finally:
        head.terminate()  # `ray start --block` stops its own processes on SIGTERM
        try:
            head.wait(timeout=90)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, signal.SIGKILL)  # anything of this cluster still alive
            shutil.rmtree(temp, ignore_errors=True)
    run_sweep(rank_unit, CONFIGS, tmp_path / "local", progress=False)
    # the same text, field for field, but the provenance (stamped by each process)
    assert csv_fields(tmp_path / "ray" / "results.csv", ["git_commit"]) == csv_fields(
        tmp_path / "local" / "results.csv", ["git_commit"])


def test_ray_sweep_equals_local_sweep(ray_local, tmp_path):
    local = run_sweep(rank_unit, CONFIGS, tmp_path / "local", progress=False)
    remote = run_sweep(rank_unit, CONFIGS, tmp_path / "ray", executor="ray", progress=False)
    provenance_only = ["git_commit"]  # changes only if a commit lands while the test runs
    pd.testing.assert_frame_equal(local.drop(columns=provenance_only), remote.drop(columns=provenance_only))
    assert csv_fields(tmp_path / "local" / "results.csv", provenance_only) == csv_fields(
        tmp_path / "ray" / "results.csv", provenance_only)
    assert run_sweep(must_not_run, CONFIGS, tmp_path / "ray", executor="ray", progress=False).equals(remote)


def test_ray_unit_error_is_the_users_one_line_and_other_units_finish(ray_local, tmp_path):
    with pytest.raises(AuditError) as info:
        run_sweep(failing_unit, CONFIGS, tmp_path, executor="ray", progress=False)
    assert str(info.value) == "unit 2 cannot run: r must be <= 8"
    assert len(unit_files(tmp_path)) == len(CONFIGS) - 1  # submitted units still finish and are kept


def test_memorize_room_with_ray_executor_matches_local(ray_local, tmp_path):
    from auditor.lab.experiment import run_experiment
    from auditor.lab.room import get

    config = tiny_memorize(bucket_size=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # Ray runs each task with OMP_NUM_THREADS = its num_cpus = 1: the same kernels
    try:
        local, _ = run_experiment(get("memorize"), config, tmp_path / "local", plots=False, progress=False)
    finally:
        torch.set_num_threads(threads)
    remote, _ = run_experiment(
        get("memorize"), config, tmp_path / "ray", executor="ray", plots=False, progress=False
    )
    assert local["unit"].tolist() == remote["unit"].tolist()  # keys leave the output folder out
    varying = ["seconds", "unit_config", "git_commit"]  # wall time; the folder; a commit made meanwhile
    pd.testing.assert_frame_equal(local.drop(columns=varying), remote.drop(columns=varying))
    assert remote["memorized"].between(1, 16).all()


# ---------------------------------------------------------------------------------------------------
# Sharded extraction
# ---------------------------------------------------------------------------------------------------


def test_shard_bounds_cover_the_examples_on_batch_boundaries():
    from auditor.audit.shard import shard_bounds

    for num in (1, 7, 23, 64, 100):
        for workers in (1, 2, 3, 8):
            for batch in (1, 4, 32):
                bounds = shard_bounds(num, workers, batch)
                assert bounds[0][0] == 0 and bounds[-1][1] == num
                assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
                assert all(start % batch == 0 for start, _ in bounds)
                assert len(bounds) == min(workers, -(-num // batch))
                batches = [-(-(stop - start) // batch) for start, stop in bounds]
                assert max(batches) - min(batches) <= 1
    with pytest.raises(AuditError, match="workers must be a positive integer"):
        shard_bounds(10, 0, 4)


@pytest.fixture(scope="module")
def tiny_models():
    """(recipe, inputs) of a tiny random ViT on real ImageNet images and a tiny GPT-2 on WikiText."""
    from auditor.audit.shard import ModelRecipe
    from auditor.data import load_inputs

    vit = ModelRecipe("vit-base", device="cpu", seed=1, config_overrides=tiny_vit())
    gpt = ModelRecipe("gpt2", device="cpu", seed=2, context_length=24, config_overrides=tiny_gpt2())
    cases = []
    for recipe, data, num in ((vit, shared_data("imagenet-sample"), 21),
                              (gpt, shared_data("wikitext-2/test.txt"), 19)):
        loaded = recipe.load()
        assert ModelRecipe.of(loaded, context_length=recipe.context_length,
                              config_overrides=recipe.config_overrides) == recipe
        cases.append((recipe, loaded, load_inputs(loaded, str(data), num, progress=False)))
    return cases


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_sharded_extraction_equals_one_process_and_so_does_the_report(executor, tiny_models, request):
    from auditor.audit.extract import extract
    from auditor.audit.plan import AuditPlan
    from auditor.audit.runner import AuditConfig, run_tests
    from auditor.audit.shard import extract_sharded

    if executor == "ray":
        request.getfixturevalue("ray_local")
    reps = ["embedding", "random-attention", "block.1"]
    testing = AuditPlan.of(AuditConfig(subsets=64, seed=5)).testing
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers use 1 thread each below: same kernels as this reference
    try:
        for recipe, loaded, inputs in tiny_models:
            single = extract(loaded, inputs, reps, batch_size=4, seed=5, progress=False)
            sharded = extract_sharded(
                recipe,
                inputs,
                reps,
                workers=3,
                executor=executor,
                batch_size=4,
                seed=5,
                threads=1,
                loaded=loaded,
                progress=False,
            )
            assert list(sharded) == list(single)
            for name, tok in single.items():
                assert torch.equal(sharded[name].contexts, tok.contexts), (recipe.name, name)
                assert torch.equal(sharded[name].queries, tok.queries)
                assert sharded[name].meta == tok.meta
                rows_single, _ = run_tests(tok.contexts, tok.queries, testing)
                rows_sharded, _ = run_tests(sharded[name].contexts, sharded[name].queries, testing)
                drop = ("seconds",)
                assert [{k: v for k, v in r.items() if k not in drop} for r in rows_sharded] == [
                    {k: v for k, v in r.items() if k not in drop} for r in rows_single]
    finally:
        torch.set_num_threads(threads)


def test_sharded_extraction_reports_worker_errors_as_one_line(ray_local, tiny_models):
    from auditor.audit.shard import ModelRecipe, extract_sharded

    recipe, loaded, inputs = tiny_models[0]
    with pytest.raises(
        AuditError, match=r"^representation 'block.7' is out of range: the model has 3 blocks"
    ):
        extract_sharded(recipe, inputs, ["block.7"], workers=2, executor="ray", batch_size=8, progress=False)
    wrong = ModelRecipe("vit-base", device="cpu", config_overrides=tiny_vit(image_size=64))  # n = 65, not 17
    with pytest.raises(AuditError, match="the inputs hold 17 tokens per example but vit-base uses n = 65"):
        extract_sharded(wrong, inputs, ["embedding"], workers=2, executor="ray", batch_size=8, progress=False)
    with pytest.raises(AuditError, match="unknown executor 'dask'"):
        extract_sharded(recipe, inputs, ["embedding"], executor="dask")


def test_atomic_files_get_the_umask_mode_not_a_private_one(tmp_path):
    from auditor.core.atomic import write_csv_atomic, write_text_atomic

    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "a" / "x.json", "{}")
        write_csv_atomic(pd.DataFrame({"k": [1]}), tmp_path / "y.csv")
    finally:
        os.umask(old)
    assert (tmp_path / "a" / "x.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "y.csv").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "a" / "x.json").read_text() == "{}" and not list(tmp_path.rglob("*.tmp"))
