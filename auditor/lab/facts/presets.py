"""The reference settings of the facts experiments (and their ``--quick`` smoke-test versions).

:func:`sweep_units` maps an experiment name to ``{unit function name: [unit configs]}`` (``scale`` has
two sweeps: ``scale-rank`` and ``scale-train``). The reference database of ``width``, ``budget`` and
``tau`` has 32 keys x 8 relations with 4 values per relation: 256 triples, in the range of Paper B's
~200, and CP rank exactly 32 (certified: the bounds meet). ``tau`` uses 8 values shared by all relations
instead, so that the rank of D (certified between 32 and 63) is not simply the number of values.
"""

from __future__ import annotations

from typing import Any

from auditor.errors import did_you_mean
from auditor.lab.facts.database import DatabaseSpec
from auditor.lab.facts.experiments import (
    bound_configs,
    budget_configs,
    measure_configs,
    scale_configs,
    tau_configs,
    width_configs,
)
from auditor.lab.facts.model import LayerConfig

REFERENCE_DB = DatabaseSpec(kind="random", keys=32, queries=8, values_per_query=4)
QUICK_DB = DatabaseSpec(kind="random", keys=8, queries=4, values_per_query=2)
TAU_DB = DatabaseSpec(kind="random", keys=32, queries=8, values_per_query=8, shared_values=True)
BOUND_DB = DatabaseSpec(kind="random", keys=6, queries=4, values_per_query=3)
QUICK_TRAIN = {"steps": 60, "eval_every": 20}
_PLANTED = {"kind": "planted", "keys": 40, "queries": 10, "key_groups": 4, "query_groups": 3}
MEASURE_DBS = [
    DatabaseSpec(keys=6, queries=3, values_per_query=3, shared_values=True, seed=1),
    DatabaseSpec(keys=16, queries=4, values_per_query=4, shared_values=True, density=0.75),
    REFERENCE_DB,
    DatabaseSpec(keys=32, queries=8, values_per_query=8, shared_values=True),
    DatabaseSpec(keys=64, queries=4, values_per_query=16, shared_values=True),
    DatabaseSpec(**_PLANTED),
    DatabaseSpec(**_PLANTED, shared_values=True, values_per_query=5),
    DatabaseSpec(**_PLANTED, noise=0.05),
]


def sweep_units(
    experiment: str,
    *,
    quick: bool = False,
    train: dict[str, Any] | None = None,
    db_seeds: tuple[int, ...] | None = None,
    init_seeds: tuple[int, ...] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Unit configs of ``experiment`` (``width``, ``budget``, ``tau``, ``bound`` or ``scale``)."""
    train = {**(QUICK_TRAIN if quick else {}), **(train or {})}
    seeds: dict[str, Any] = {}
    if db_seeds is not None:
        seeds["db_seeds"] = db_seeds
    if init_seeds is not None:
        seeds["init_seeds"] = init_seeds
    if experiment == "width":
        if quick:
            return {
                "width": width_configs(
                    QUICK_DB,
                    d_models=(2, 4),
                    d_vos=(1, 2),
                    db_seeds=db_seeds or (0,),
                    init_seeds=init_seeds or (0,),
                    train=train,
                )
            }
        return {"width": width_configs(REFERENCE_DB, train=train, **seeds)}
    if experiment == "budget":
        if quick:
            return {
                "budget": budget_configs(
                    QUICK_DB, d_model=3, db_seeds=db_seeds or (0,), init_seeds=init_seeds or (0,), train=train
                )
            }
        return {"budget": budget_configs(REFERENCE_DB, d_model=8, train=train, **seeds)}
    if experiment == "tau":
        if quick:
            return {
                "tau": tau_configs(
                    QUICK_DB,
                    d_models=(2, 4),
                    taus=(0.5, 0.9),
                    db_seeds=db_seeds or (0,),
                    init_seeds=init_seeds or (0,),
                    train=train,
                )
            }
        return {
            "tau": tau_configs(
                TAU_DB, init_seeds=init_seeds or (0, 1, 2), train=train, db_seeds=db_seeds or (0,)
            )
        }
    if experiment == "bound":
        if quick:
            members = [
                LayerConfig(d_model=2, d_qk=1, d_vo=1),
                LayerConfig(d_model=3, heads=2, d_qk=2, d_vo=1),
            ]
            return {
                "bound": bound_configs(
                    DatabaseSpec(keys=4, queries=3, values_per_query=2),
                    members=members,
                    train=train,
                    cp={"tol": 1e-3, "restarts": 1, "max_iter": 200},
                )
            }
        return {"bound": bound_configs(BOUND_DB, train=train)}
    if experiment == "measure":
        if quick:
            return {
                "measure": measure_configs(
                    [
                        QUICK_DB,
                        DatabaseSpec(keys=5, queries=3, values_per_query=2, shared_values=True, seed=1),
                    ]
                )
            }
        return {"measure": measure_configs(MEASURE_DBS)}
    if experiment == "scale":
        if quick:
            dbs = [DatabaseSpec(keys=200, queries=10, values_per_query=10)]
            members = [LayerConfig(d_model=16, heads=2, d_qk=16, d_vo=16)]
            rank_units, train_units = scale_configs(
                dbs, train_dbs=dbs, members=members, train=train, batch_size=512
            )
            for unit in rank_units:
                unit["effective"] = False
            return {"scale-rank": rank_units, "scale-train": train_units}
        rank_units, train_units = scale_configs(train=train)
        return {"scale-rank": rank_units, "scale-train": train_units}
    raise did_you_mean(
        "facts experiment", experiment, ("width", "budget", "tau", "bound", "measure", "scale")
    )
