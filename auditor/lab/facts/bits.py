"""Bits of the facts room (``audit bits``), counted by :mod:`auditor.lab.information`: the entropy of the
generated table (``db_spec``: a random table holds facts x log2(values_per_query) bits, since a fact's
value is one of its relation's values_per_query, or of the shared vocabulary; a planted table holds its
groups, block values and noise) less the code correcting the facts the layer gets wrong
(log2(N+1) + log2 C(N, E) + E log2 M, M = the values one fact may take), clipped at 0. A table read from
a file has no generator on record: its facts are counted as uniform over the ``values`` (an upper estimate
of its entropy, named in the formula). Each facts experiment keeps its own folder (``reports/facts/width``,
...), which names the experiment of its rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from auditor.lab.information import argmax_stored_bits, planted_table_entropy, uniform_entropy
from auditor.lab.room import BitsReader


def table_entropy(row: pd.Series) -> tuple[float, float, str]:
    """(entropy H of the row's table, alphabet M of one fact, how H was counted) from its ``db_spec``."""
    spec = row.get("db_spec")
    if not isinstance(spec, str) or not spec.strip().startswith("{"):
        values = float(row["values"])
        return (float(uniform_entropy(row["triples"], values)), values,
                "facts log2(values) (table read from a file: generator unknown, uniform assumed)")
    spec = json.loads(spec)
    facts = int(row["triples"])
    if spec["kind"] == "random":
        alphabet = float(spec["values_per_query"])
        return float(uniform_entropy(facts, alphabet)), alphabet, "facts log2(values_per_query)"
    blocks = spec["key_groups"] * spec["query_groups"]
    values = spec["values_per_query"] if spec["shared_values"] else blocks
    entropy = planted_table_entropy(spec["keys"], spec["queries"], spec["key_groups"], spec["query_groups"],
                                    facts=facts, values=values, shared_values=spec["shared_values"],
                                    noise=spec["noise"])
    return entropy, float(values), "planted table: groups, block values, noise"


def facts_bits(frame: pd.DataFrame, experiment: str = "facts") -> pd.DataFrame:
    """Rows of a trained ``audit facts`` experiment (columns triples, facts_stored, values, parameters)."""
    if "tau" in frame:  # one training, one row per softmax threshold: count it once
        frame = frame.drop_duplicates(
            [c for c in ("unit", "db", "d_model", "heads", "d_qk", "d_vo", "seed") if c in frame]
        )
    frame = frame.reset_index(drop=True)
    config = frame.apply(
        lambda r: ", ".join(
            f"{k}={r[k]}" for k in ("db", "d_model", "heads", "d_qk", "d_vo", "seed") if k in r
        ),
        axis=1,
    )
    counted = [table_entropy(row) for _, row in frame.iterrows()]
    entropy = np.array([c[0] for c in counted])
    alphabet = np.array([c[1] for c in counted])
    stored, residual = argmax_stored_bits(entropy, frame["triples"], frame["facts_stored"], alphabet)
    return pd.DataFrame(
        {
            "room": "facts",
            "experiment": experiment,
            "config": config,
            "stored_bits": stored,
            "entropy_bits": entropy,
            "residual_bits": residual,
            "parameters": frame["parameters"],
            "formula": [f"H = {c[2]}; - [log2(N+1) + log2 C(N, E) + E log2 M], E = triples - facts_stored, "
                        "clipped at 0" for c in counted],
            "converged": frame["early_stopped"].astype(bool) if "early_stopped" in frame else None,
        }
    )


def _read(frame: pd.DataFrame, file: Path) -> pd.DataFrame:
    parts = file.parent.parts
    name = " ".join(
        ["facts", *parts[parts.index("facts") + 1 :]] if "facts" in parts else ["facts", file.parent.name]
    )
    return facts_bits(frame, name)


READER = BitsReader(claims=lambda columns: "facts_stored" in columns, read=_read)
