"""Fact databases: sets of triples (key, query, value) that are partial functions (k, q) -> v.

A :class:`FactDatabase` holds the names of its keys (subjects), queries (relations) and values
(objects) and the triples as integer indices ``triples: (N, 3)`` = (key, query, value). It is built from
a CSV file or a pandas DataFrame (:func:`from_frame`, :func:`load_csv`) or from a generator
(:class:`DatabaseSpec`), and it refuses input that is not a partial function, naming the first clash.

Generators (all seeded, all deterministic):

* ``random``: every present pair (k, q) gets a value drawn uniformly from the ``values_per_query``
  values that relation q owns (its own block of values) or, with ``shared_values``, from one vocabulary
  of ``values_per_query`` values shared by every relation. ``density`` is the fraction of the |K| x |Q|
  pairs that are present (exactly ``round(density |K| |Q|)`` of them).
* ``planted``: keys fall into ``key_groups`` groups and queries into ``query_groups`` groups; every
  (key group, query group) block carries one value (a distinct one per block, or drawn from
  ``values_per_query`` shared values). The tensor is then a multilinear image of the small
  groups x groups x values core, so its CP rank equals the core's: exactly ``key_groups * query_groups``
  when every block has its own value. ``noise`` relabels that fraction of the facts with a random other
  value, which raises the rank.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from auditor.core.errors import AuditError, did_you_mean

GENERATORS = ("random", "planted")
COLUMNS = ("key", "query", "value")


@dataclass(frozen=True, eq=False)
class FactDatabase:
    """A partial function (key, query) -> value over named keys, queries and values.

    Attributes:
        keys, queries, values: names, in index order.
        triples: (N, 3) int64 = (key index, query index, value index), sorted by (key, query).
        name: a short label used in result rows.
    """

    keys: tuple[str, ...]
    queries: tuple[str, ...]
    values: tuple[str, ...]
    triples: np.ndarray = field(repr=False)
    name: str = "db"

    def __post_init__(self) -> None:
        t = np.asarray(self.triples)
        if t.ndim != 2 or t.shape[1] != 3:
            raise AuditError(f"triples must have shape (N, 3), got {t.shape}")
        if t.size and not np.issubdtype(t.dtype, np.integer):
            raise AuditError(f"triples must hold integer indices, got dtype {t.dtype}")
        t = t.astype(np.int64).reshape(-1, 3)  # (N, 3)
        for axis, names in enumerate((self.keys, self.queries, self.values)):
            if t.size and (t[:, axis].min() < 0 or t[:, axis].max() >= len(names)):
                raise AuditError(f"{COLUMNS[axis]} index out of range 0..{len(names) - 1}")
            if len(set(names)) != len(names):
                raise AuditError(f"{COLUMNS[axis]} names must be distinct")
        t = np.unique(t, axis=0)  # identical triples count once; rows sorted by (k, q, v)
        clash = np.flatnonzero((t[1:, 0] == t[:-1, 0]) & (t[1:, 1] == t[:-1, 1]))
        if clash.size:
            k, q, v = t[clash[0]]
            v2 = t[clash[0] + 1, 2]
            raise AuditError(
                f"not a partial function: ({self.keys[k]!r}, {self.queries[q]!r}) has two values, "
                f"{self.values[v]!r} and {self.values[v2]!r} ({clash.size} clashing pair(s) in all); "
                "keep one value per (key, query)"
            )
        t.setflags(write=False)
        object.__setattr__(self, "triples", t)

    @property
    def num_triples(self) -> int:
        return int(self.triples.shape[0])

    @property
    def shape(self) -> tuple[int, int, int]:
        """(|K|, |Q|, |V|): the shape of the database tensor D."""
        return len(self.keys), len(self.queries), len(self.values)

    def value_table(self) -> np.ndarray:
        """(|K|, |Q|) int64: the value index of every present pair, -1 where the pair is absent."""
        table = np.full(self.shape[:2], -1, dtype=np.int64)
        table[self.triples[:, 0], self.triples[:, 1]] = self.triples[:, 2]
        return table

    def to_frame(self) -> pd.DataFrame:
        """The triples as a DataFrame with columns key, query, value (names)."""
        k, q, v = self.triples.T
        return pd.DataFrame(
            {
                "key": np.asarray(self.keys, dtype=object)[k],
                "query": np.asarray(self.queries, dtype=object)[q],
                "value": np.asarray(self.values, dtype=object)[v],
            }
        )

    def save_csv(self, path: str | Path, seed: int | None = None) -> None:
        """Write the triples as CSV (key, query, value, and the provenance columns; ``seed``: the
        generator's)."""
        from auditor.lab.sweep import write_table

        write_table(self.to_frame(), path, seed=seed)

    def summary(self) -> dict[str, Any]:
        """Sizes for result rows: triples, keys, queries, values, density of present pairs."""
        K, Q, V = self.shape
        return {
            "db": self.name,
            "triples": self.num_triples,
            "keys": K,
            "queries": Q,
            "values": V,
            "density": self.num_triples / max(K * Q, 1),
        }


def from_indices(
    triples: np.ndarray, shape: tuple[int, int, int], *, name: str = "db", drop_unused: bool = False
) -> FactDatabase:
    """Database over generated names (``k0..``, ``r0..``, ``v0..``) from index triples (N, 3).

    With ``drop_unused`` keys, queries and values that occur in no triple are removed (indices renumbered).
    """
    triples = np.asarray(triples, dtype=np.int64).reshape(-1, 3)  # (N, 3)
    sizes = list(shape)
    if drop_unused:
        for axis in range(3):
            used, triples[:, axis] = np.unique(triples[:, axis], return_inverse=True)
            sizes[axis] = len(used)
    names = [tuple(f"{p}{i}" for i in range(n)) for p, n in zip(("k", "r", "v"), sizes)]
    return FactDatabase(*names, triples=triples, name=name)


def from_frame(
    frame: pd.DataFrame, *, key: str = "key", query: str = "query", value: str = "value", name: str = "db"
) -> FactDatabase:
    """Database from a DataFrame with one triple per row; names keep their first-appearance order.

    Args:
        frame: one row per triple; the three named columns are read as strings.
        key, query, value: column names (e.g. ``subject``, ``relation``, ``object``).
    """
    columns = [key, query, value]
    for col in columns:
        if col not in frame.columns:
            raise did_you_mean("column", col, [str(c) for c in frame.columns])
    sub = frame[columns]
    if sub.isna().any().any():
        row = int(np.flatnonzero(sub.isna().any(axis=1).to_numpy())[0])
        raise AuditError(f"row {row} has an empty {key}/{query}/{value} cell; every triple needs all three")
    codes, names = [], []
    for col in columns:
        c, uniques = pd.factorize(sub[col].astype(str), sort=False)
        codes.append(c)
        names.append(tuple(str(u) for u in uniques))
    triples = np.stack(codes, axis=1).astype(np.int64)  # (N, 3)
    return FactDatabase(names[0], names[1], names[2], triples=triples, name=name)


def load_csv(
    path: str | Path, *, key: str = "key", query: str = "query", value: str = "value", name: str | None = None
) -> FactDatabase:
    """Database from a CSV file with a header row naming the key, query and value columns."""
    path = Path(path)
    if not path.is_file():
        raise AuditError(
            f"no such database file {str(path)!r}; give a CSV with columns {key},{query},{value}"
        )
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise AuditError(f"cannot read {str(path)!r} as CSV ({type(err).__name__}: {err})") from None
    return from_frame(frame, key=key, query=query, value=value, name=name or path.stem)


@dataclass(frozen=True)
class DatabaseSpec:
    """A seeded random database (see the module docstring for the two generators)."""

    kind: str = "random"  # "random" | "planted"
    keys: int = 32
    queries: int = 8
    values_per_query: int = 4  # random: values each relation owns (or the shared vocabulary size)
    shared_values: bool = False  # random/planted: one vocabulary of values_per_query values for all
    density: float = 1.0  # fraction of (k, q) pairs present
    key_groups: int = 4  # planted
    query_groups: int = 2  # planted
    noise: float = 0.0  # planted: fraction of facts relabelled at random
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in GENERATORS:
            raise did_you_mean("database generator", self.kind, GENERATORS)
        for name in ("keys", "queries", "values_per_query"):
            if getattr(self, name) < 1:
                raise AuditError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.density <= 1:
            raise AuditError(f"density must be in (0, 1], got {self.density}")
        if not 0 <= self.noise <= 1:
            raise AuditError(f"noise must be in [0, 1], got {self.noise}")
        if self.kind == "planted":
            if not 1 <= self.key_groups <= self.keys or not 1 <= self.query_groups <= self.queries:
                raise AuditError(
                    f"planted groups must satisfy 1 <= key_groups <= keys and 1 <= query_groups <= queries, "
                    f"got {self.key_groups}/{self.keys} and {self.query_groups}/{self.queries}"
                )
            if self.noise > 0 and self.num_values < 2:
                raise AuditError("noise needs at least two values to relabel to")

    @property
    def num_values(self) -> int:
        """|V| of the generated database."""
        if self.kind == "planted" and not self.shared_values:
            return self.key_groups * self.query_groups
        return self.values_per_query if self.shared_values else self.values_per_query * self.queries

    @property
    def label(self) -> str:
        """Short name used as the ``db`` column of result rows."""
        if self.kind == "random":
            vocab = "shared" if self.shared_values else "block"
            core = f"random-{self.keys}x{self.queries}-v{self.values_per_query}{vocab}"
        else:
            core = f"planted-{self.keys}x{self.queries}-g{self.key_groups}x{self.query_groups}"
            core += f"-v{self.values_per_query}shared" if self.shared_values else ""
            core += f"-noise{self.noise:g}" if self.noise else ""
        dens = f"-d{self.density:g}" if self.density < 1 else ""
        return f"{core}{dens}-s{self.seed}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def build(self) -> FactDatabase:
        """Generate the database (same spec, same triples)."""
        rng = np.random.default_rng([self.seed, 0xFAC7])
        K, Q = self.keys, self.queries
        present = int(round(self.density * K * Q))
        if present < 1:
            raise AuditError(f"density {self.density} leaves no (key, query) pair present; raise it")
        pairs = np.sort(rng.choice(K * Q, size=present, replace=False))  # flat k * Q + q
        k, q = pairs // Q, pairs % Q
        if self.kind == "random":
            draw = rng.integers(0, self.values_per_query, size=present)
            v = draw if self.shared_values else q * self.values_per_query + draw
        else:
            kg = _balanced_groups(rng, K, self.key_groups)  # (K,)
            qg = _balanced_groups(rng, Q, self.query_groups)  # (Q,)
            blocks = self.key_groups * self.query_groups
            if self.shared_values:
                block_value = rng.integers(0, self.values_per_query, size=blocks)
            else:
                block_value = rng.permutation(blocks)
            v = block_value[kg[k] * self.query_groups + qg[q]]
            noisy = rng.random(present) < self.noise
            shift = rng.integers(1, self.num_values, size=present)  # a different value, uniformly
            v = np.where(noisy, (v + shift) % self.num_values, v)
        triples = np.stack([k, q, v], axis=1)  # (N, 3)
        return from_indices(triples, (K, Q, self.num_values), name=self.label)


def _balanced_groups(rng: np.random.Generator, n: int, groups: int) -> np.ndarray:
    """(n,) group labels, every group non-empty and sizes within one of each other, randomly placed."""
    return rng.permutation(np.arange(n) % groups)
