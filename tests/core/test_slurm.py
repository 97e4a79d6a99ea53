"""``--executor slurm`` against a real Slurm: a single-node cluster (slurmctld, slurmd and munged on this
machine) started for the module by ``scripts/slurm-local.sh`` when Debian's ``slurm-wlm`` and ``munge``
are installed and we are root; skipped with the reason otherwise. Nothing is mocked: the units run as
the tasks of real job arrays, in this venv's python, and write their own unit files.

The units do real work with a known answer (the numerical rank of a seeded rank-r product is r). Jobs
are tiny (one CPU each; the node has as many CPUs as this machine), so the module takes about a minute.
The option checks at the top need no cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

import probes
from auditor.cli import main
from auditor.core import slurm as slurm_module
from auditor.core.errors import AuditError
from auditor.core.slurm import SlurmOptions, parse_sbatch, parse_time
from auditor.lab.sweep import run_sweep, unit_key

HERE = Path(__file__).resolve().parent
TESTS = (str(HERE), str(HERE.parent))  # this module (its unit functions) and conftest, for the jobs
SCRIPT = HERE.parents[1] / "scripts" / "slurm-local.sh"
SLURM_DIR = Path(os.environ.get("AUDITOR_SLURM_DIR", "/tmp/attention-auditor-slurm"))
BINARIES = ("slurmctld", "slurmd", "munged", "sinfo", "sbatch", "squeue", "scancel", "srun")
GATE = "gate"  # the unit with index GATE_AT waits for <workdir>/release (the scancel test)
GATE_AT = 1
CONFIGS = [{"index": i, "m": 24, "r": r, "n": 20, "seed": i} for i, r in enumerate((3, 7, 12))]


def rank_unit(config: dict) -> dict:
    """Numerical rank of a seeded rank-r product (known answer r). With a ``workdir`` it logs its start
    and end there, and the unit GATE_AT of a gated run waits for ``release`` (bounded) after saying so."""
    workdir = Path(config["workdir"]) if "workdir" in config else None
    if workdir is not None:
        with open(workdir / "runs.log", "a") as log:
            log.write(f"start {config['index']}\n")
        if config.get(GATE) and config["index"] == GATE_AT and not (workdir / "release").exists():
            (workdir / f"started-{GATE_AT}").touch()
            deadline = time.monotonic() + 120
            while not (workdir / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
    if config["r"] > 16:
        raise AuditError(f"unit {config['index']} cannot run: r must be <= 16; got {config['r']}")
    gen = torch.Generator().manual_seed(config["seed"])
    m, r, n = config["m"], config["r"], config["n"]
    a = torch.randn(m, r, generator=gen, dtype=torch.float64) @ torch.randn(
        r, n, generator=gen, dtype=torch.float64
    )
    res = probes.numerical_rank(a)
    if workdir is not None:
        with open(workdir / "runs.log", "a") as log:
            log.write(f"done {config['index']}\n")
    return {"index": config["index"], "r": r, "rank": int(res.rank), "margin": float(res.margin),
            "seed": config["seed"], "device": "cpu"}


def same_rows(a: Path, b: Path) -> bool:
    """The two sweeps' results.csv hold the same rows, value for value as written (git_commit aside: a
    commit may land between two runs; versions, device, seed, unit and unit_config included)."""
    one, two = (pd.read_csv(f / "results.csv", dtype=str, keep_default_na=False) for f in (a, b))
    pd.testing.assert_frame_equal(one.drop(columns="git_commit"), two.drop(columns="git_commit"))
    return True


# -- the options (no cluster needed) ----------------------------------------------------------------

@pytest.mark.parametrize(("text", "minutes"), [("90", 90), ("5:30", 6), ("2:00:00", 120), ("1-12", 2160),
                                               ("1-00:30", 1470), ("0-00:00:01", 1)])
def test_time_limits_read_as_slurm_writes_them(text, minutes):
    assert parse_time(text) == minutes


@pytest.mark.parametrize("text", ["", "0", "1h", "1:2:3:4", "-5", "1-", "a-10"])
def test_bad_time_limits_are_one_line(text):
    with pytest.raises(AuditError, match=r"^--slurm-time takes minutes or Slurm's \[D-\]HH:MM:SS"):
        parse_time(text)


def test_extra_sbatch_flags():
    assert parse_sbatch(["--account=abc", "--qos=high", "--exclusive", "--mem=16G"]) == {
        "account": "abc", "qos": "high", "exclusive": True, "mem": "16G"}
    with pytest.raises(AuditError, match="takes a long sbatch flag as --name=value"):
        parse_sbatch(["-A abc"])
    with pytest.raises(
        AuditError, match="--time is set by the executor; use --slurm-partition, --slurm-time"
    ):
        parse_sbatch(["--time=10"])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"cpus_per_task": 0}, "--slurm-cpus takes an integer >= 1; got 0"),
    ({"gpus_per_task": -1}, "--slurm-gpus takes an integer >= 0; got -1"),
    ({"array_parallelism": 0}, "--slurm-parallel takes an integer >= 1; got 0"),
    ({"partition": " "}, "--slurm-partition takes a partition name"),
])
def test_bad_slurm_options_are_one_line(kwargs, message):
    with pytest.raises(AuditError, match=f"^{message}"):
        SlurmOptions(**kwargs)


def test_slurm_options_without_executor_slurm_are_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["memorize", "--heads", "1", "--context", "3", "--d-h", "2", "--N", "5", "--d", "4",
                 "--slurm-partition", "gpu", "--out", "m"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and lines == [
        "error: --slurm-* options go with --executor slurm; add --executor slurm or leave them out"
    ]
    assert list(tmp_path.iterdir()) == []


def test_executor_slurm_without_submitit_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "submitit", None)  # `import submitit` now raises ImportError
    monkeypatch.chdir(tmp_path)
    code = main(["memorize", "--heads", "1", "--context", "3", "--d-h", "2", "--N", "5", "--d", "4",
                 "--executor", "slurm", "--out", "m"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and lines == [f"error: {slurm_module.SLURM_MISSING}"]
    assert list(tmp_path.iterdir()) == []


# -- a real single-node Slurm -----------------------------------------------------------------------

def _why_no_slurm() -> str | None:
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing): apt-get install -y slurm-wlm munge"
    if os.geteuid() != 0:
        return (
            "the single-node Slurm of scripts/slurm-local.sh runs its daemons as root; run the tests as root"
        )
    try:
        import submitit  # noqa: F401
    except ImportError:
        return 'submitit is not installed: pip install "attention-auditor[slurm]"'
    return None


def _running() -> bool:
    pids = [SLURM_DIR / "slurmctld.pid", SLURM_DIR / "slurmd.pid"]
    with contextlib.suppress(OSError, ValueError):
        return all(os.kill(int(p.read_text()), 0) is None for p in pids)
    return False


@pytest.fixture(scope="session")
def cluster():
    """A single-node Slurm for the session (started here unless one of the script's already runs; only
    what was started here is stopped); SLURM_CONF and PYTHONPATH (so jobs import this module) set."""
    reason = _why_no_slurm()
    if reason:
        pytest.skip(reason)
    started_here = not _running()
    done = subprocess.run([str(SCRIPT), "start"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "PYTHONPATH")}
    os.environ["SLURM_CONF"] = str(SLURM_DIR / "slurm.conf")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (*TESTS, saved["PYTHONPATH"]) if p)
    every = slurm_module.SQUEUE_EVERY_S
    slurm_module.SQUEUE_EVERY_S = (
        1.0  # a one-node cluster of our own: ask squeue more often than a login node would
    )
    try:
        yield SLURM_DIR / "slurm.conf"
    finally:
        slurm_module.SQUEUE_EVERY_S = every
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if started_here:
            subprocess.run([str(SCRIPT), "stop"], capture_output=True, timeout=60)


def test_the_cluster_answers(cluster):
    assert (
        "debug"
        in subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=30).stdout
    )
    assert subprocess.run(["srun", "hostname"], capture_output=True, text=True, timeout=60).stdout.strip()


def test_a_job_array_gives_the_rows_of_local(cluster, tmp_path):
    configs = CONFIGS[:2]  # one round on a 2-CPU node (the scancel test below runs three units)
    remote = run_sweep(rank_unit, configs, tmp_path / "slurm", executor="slurm", progress=False)
    run_sweep(rank_unit, configs, tmp_path / "local", executor="local", progress=False)
    assert remote["rank"].tolist() == [3, 7]
    assert same_rows(tmp_path / "slurm", tmp_path / "local")
    jobs = json.loads((tmp_path / "slurm" / "slurm" / "jobs.json").read_text())
    assert sorted(jobs) == sorted(unit_key(c) for c in configs)
    assert len({j.split("_")[0] for j in jobs.values()}) == 1, "one job array"
    script = next((tmp_path / "slurm" / "slurm").glob("*_submission.sh")).read_text()
    assert "#SBATCH --array=0-1%2" in script and "#SBATCH --cpus-per-task=1" in script
    assert sys.executable in script


def test_scancel_mid_sweep_then_the_rerun_completes_it_running_nothing_twice(cluster, tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    configs = [{**c, "workdir": str(workdir), GATE: True} for c in CONFIGS]
    out = tmp_path / "sweep"
    failure: list[BaseException] = []

    def sweep() -> None:
        try:
            run_sweep(rank_unit, configs, out, executor="slurm", progress=False)
        except BaseException as err:  # noqa: BLE001 -- handed to the test thread
            failure.append(err)

    driver = threading.Thread(target=sweep)
    driver.start()
    deadline = time.monotonic() + 120
    while not (workdir / f"started-{GATE_AT}").exists() and time.monotonic() < deadline and driver.is_alive():
        time.sleep(0.2)
    assert (workdir / f"started-{GATE_AT}").exists(), failure
    job = json.loads((out / "slurm" / "jobs.json").read_text())[unit_key(configs[GATE_AT])]
    subprocess.run(["scancel", job], check=True, timeout=30)
    driver.join(timeout=180)
    assert not driver.is_alive()
    assert len(failure) == 1 and isinstance(failure[0], AuditError), failure
    message = str(failure[0])
    assert (
        "\n" not in message
        and f"Slurm job {job} ended without a result" in message
        and "CANCELLED" in message
    )
    assert "run the same command again to resume" in message
    finished = {p.stem for p in (out / "units").glob("*.json")}
    assert finished == {unit_key(configs[0]), unit_key(configs[2])}, "the other units finished and were kept"

    (workdir / "release").touch()
    rows = run_sweep(rank_unit, configs, out, executor="slurm", progress=False)
    assert rows["rank"].tolist() == [3, 7, 12]
    runs = (workdir / "runs.log").read_text().split("\n")
    assert sorted(runs.count(f"done {i}") for i in range(3)) == [1, 1, 1], runs  # each unit finished once
    assert [runs.count(f"start {i}") for i in range(3)] == [1, 2, 1], runs  # only the cancelled one ran again
    local = run_sweep(rank_unit, configs, tmp_path / "local", executor="local", progress=False)
    assert same_rows(out, tmp_path / "local")
    assert local["rank"].tolist() == [3, 7, 12]


def test_a_workers_bad_input_is_its_own_one_line(cluster, tmp_path):
    configs = [CONFIGS[0], {**CONFIGS[1], "r": 17}]
    with pytest.raises(AuditError) as caught:
        run_sweep(rank_unit, configs, tmp_path / "s", executor="slurm", progress=False)
    assert str(caught.value) == "unit 1 cannot run: r must be <= 16; got 17"
    assert [p.stem for p in (tmp_path / "s" / "units").glob("*.json")] == [unit_key(CONFIGS[0])]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_or_misconfigured_slurm_is_one_line_and_no_hang(cluster, tmp_path, monkeypatch, capsys):
    port = _free_port()  # nothing listens there
    conf = tmp_path / "slurm.conf"
    conf.write_text("".join(f"SlurmctldPort={port}\n" if line.startswith("SlurmctldPort=") else line
                            for line in cluster.read_text().splitlines(keepends=True)))
    monkeypatch.setenv("SLURM_CONF", str(conf))
    with pytest.raises(AuditError, match=r"^Slurm refused listing the partitions \(.*Unable to contact slurm "
                                         r"controller.*\); check that slurmctld runs") as caught:
        run_sweep(rank_unit, CONFIGS, tmp_path / "a", executor="slurm", progress=False)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "a").exists(), "a refused sweep leaves no folder"

    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))  # Slurm itself would retry for 60 s
    with pytest.raises(AuditError, match=r"^SLURM_CONF names '.*missing.conf', which is not a file"):
        run_sweep(rank_unit, CONFIGS, tmp_path / "b", executor="slurm", progress=False)

    monkeypatch.setenv("SLURM_CONF", str(cluster))
    monkeypatch.chdir(tmp_path)
    code = main(["memorize", "--heads", "1", "--context", "3", "--d-h", "2", "--N", "5", "--d", "4",
                 "--executor", "slurm", "--slurm-partition", "debgu", "--out", "m"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and lines == [
        "error: unknown Slurm partition 'debgu'; did you mean 'debug'? known: debug"
    ]
    assert not (tmp_path / "m").exists()


@pytest.mark.slow  # each job imports transformers and builds the model: about 30 s on 2 busy cores
def test_sharded_extraction_as_a_job_array_equals_one_process(cluster, tmp_path):
    from conftest import shared_data, tiny_vit

    from auditor.audit.extract import extract
    from auditor.audit.shard import ModelRecipe, extract_sharded
    from auditor.data import load_inputs

    recipe = ModelRecipe("vit-base", device="cpu", seed=1, config_overrides=tiny_vit())
    loaded = recipe.load()
    inputs = load_inputs(loaded, str(shared_data("imagenet-sample")), 12, progress=False)
    reps = ["embedding", "block.1"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the jobs use --slurm-cpus 1 threads: the same kernels as this reference
    try:
        single = extract(loaded, inputs, reps, batch_size=4, seed=5, progress=False)
        sharded = extract_sharded(
            recipe,
            inputs,
            reps,
            workers=2,
            executor="slurm",
            batch_size=4,
            seed=5,
            loaded=loaded,
            progress=False,
            slurm=SlurmOptions(folder=str(tmp_path / "logs")),
        )
    finally:
        torch.set_num_threads(threads)
    for name, tok in single.items():
        assert torch.equal(sharded[name].contexts, tok.contexts) and torch.equal(
            sharded[name].queries, tok.queries
        )
        assert sharded[name].meta == tok.meta
    with pytest.raises(
        AuditError, match=r"^representation 'block.7' is out of range: the model has 3 blocks"
    ):
        extract_sharded(
            recipe,
            inputs,
            ["block.7"],
            workers=2,
            executor="slurm",
            batch_size=4,
            progress=False,
            slurm=SlurmOptions(folder=str(tmp_path / "logs")),
        )


@pytest.mark.slow  # another job array with a gated unit: about 30 s
def test_a_killed_driver_leaves_its_jobs_running_and_the_rerun_attaches_to_them(cluster, tmp_path):
    """The process that submitted the array dies (SIGKILL: a lost login session); the jobs go on, and
    running the same sweep again collects them instead of submitting them again."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    configs = [{**c, "workdir": str(workdir), GATE: True} for c in CONFIGS]
    out = tmp_path / "sweep"
    script = (
        "import json, sys\nimport test_slurm\nfrom auditor.lab.sweep import run_sweep\n"
        "run_sweep(test_slurm.rank_unit, json.loads(sys.argv[1]), sys.argv[2], "
        "executor='slurm', progress=False)\n"
    )
    driver = subprocess.Popen([sys.executable, "-c", script, json.dumps(configs), str(out)])
    try:
        deadline = time.monotonic() + 120
        while (
            not (workdir / f"started-{GATE_AT}").exists()
            and time.monotonic() < deadline
            and driver.poll() is None
        ):
            time.sleep(0.2)
        assert (workdir / f"started-{GATE_AT}").exists()
    finally:
        driver.kill()
        driver.wait(timeout=30)
    submitted = json.loads((out / "slurm" / "jobs.json").read_text())
    live = subprocess.run(
        ["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True, timeout=30
    ).stdout.split()
    assert submitted[unit_key(configs[GATE_AT])] in live, "the gated job outlived its driver"

    (workdir / "release").touch()
    rows = run_sweep(rank_unit, configs, out, executor="slurm", progress=False)
    assert rows["rank"].tolist() == [3, 7, 12]
    assert json.loads((out / "slurm" / "jobs.json").read_text()) == submitted, "nothing was submitted again"
    runs = (workdir / "runs.log").read_text().split("\n")
    assert [runs.count(f"start {i}") for i in range(3)] == [1, 1, 1], runs
    assert [runs.count(f"done {i}") for i in range(3)] == [1, 1, 1], runs
