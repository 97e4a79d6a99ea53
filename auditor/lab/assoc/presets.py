"""Named scales of capacity lab III: ``reference`` (the committed CPU run, minutes on 2 cores) and
``paper`` (the sizes, steps and seeds of paper C; hours to days on CPU, meant for a GPU or a cluster).

The reference scale keeps every experiment of the paper but fewer and smaller sizes, fewer steps and
fewer seeds; ``reports/assoc/README.md`` states what was cut. Optimiser settings (learning rates) are
ours where a quick search on the reference scale did better than the paper's value in this code base;
the paper's value is noted beside each.
"""

from __future__ import annotations

from typing import Any

from auditor.errors import did_you_mean

SCALES = ("reference", "paper")

_PAPER_DIMS = (8, 11, 16, 22, 32, 45, 64, 90, 128, 181, 256)  # 2^{3, 3.5, ..., 8}, rounded down as the authors did

ASSOC: dict[str, dict[str, dict[str, Any]]] = {
    "linear": {
        # paper: AdamW lr 1000 (sic), 4096 full-batch steps, 5 seeds; lr 1 stored more items here
        "reference": {"dims": (8, 11, 16, 23, 32), "seeds": (0, 1, 2), "steps": 1024, "lr": 1.0, "rel_tol": 0.02},
        "paper": {"dims": _PAPER_DIMS, "seeds": (0, 1, 2, 3, 4), "steps": 4096, "lr": 1.0, "rel_tol": 0.01},
    },
    "mlp": {
        # paper: AdamW lr 3e-2, up to 2^15 full-batch steps, m/d in {1, 2, 4, 8}, d up to 2^6.5
        "reference": {"dims": (8, 16), "width_ratios": (1, 2, 4), "seeds": (0, 1), "steps": 1024, "lr": 3e-2,
                      "rel_tol": 0.03},
        "paper": {"dims": _PAPER_DIMS[:8], "width_ratios": (1, 2, 4, 8), "seeds": (0, 1, 2, 3, 4), "steps": 2**15,
                  "lr": 3e-2, "rel_tol": 0.01},
    },
}

RECALL_SCALING: dict[str, dict[str, Any]] = {
    # paper: d in 2^{3..7.5}, 16384 steps of 1024 fresh prompts, best of lr in {1e-3, 3e-3, 1e-2}; at our
    # 16x smaller budget larger steps pay off, so the reference takes the best of {1e-2, 3e-2}
    "reference": {"dims": (8, 11, 16, 23), "head_dim": 2, "attn_ratio": 1.0, "width_ratios": (0.0, 1.0), "seeds": (0, 1),
                  "training": {"steps": 1000, "batch_size": 256, "lrs": (1e-2, 3e-2)}},
    "paper": {"dims": _PAPER_DIMS[:10], "head_dim": 2, "attn_ratio": 1.0, "width_ratios": (0.0, 1.0), "seeds": (0, 1, 2),
              "training": {"steps": 16384, "batch_size": 1024, "lrs": (1e-3, 3e-3, 1e-2)}},
}

RECALL_TRADEOFF: dict[str, dict[str, Any]] = {
    # paper: H in {1, 2, 4, 6, ..., 32}, m in {1, 8, 16, ..., 128}, 16384 steps of 1024 prompts, lr 1e-2
    "reference": {"heads": (1, 2, 4, 8, 16), "widths": (0, 16, 32, 64, 128), "seeds": (0,),
                  "training": {"steps": 1000, "batch_size": 256, "lrs": (1e-2, 3e-2)}},
    "paper": {"heads": (1, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32),
              "widths": (1, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128), "seeds": (0, 1, 2),
              "training": {"steps": 16384, "batch_size": 1024, "lrs": (1e-2,)}},
}

RECALL_DYNAMICS: dict[str, dict[str, Any]] = {
    # the paper's own setting is cheap enough to be the reference
    "reference": {"steps": 8192, "batch_size": 1024, "seeds": (0, 1, 2)},
    "paper": {"steps": 8192, "batch_size": 1024, "seeds": (0, 1, 2, 3, 4)},
}


def preset(table: dict[str, Any], scale: str) -> dict[str, Any]:
    """The settings of ``scale`` in ``table`` (a copy), with a did-you-mean error for unknown scales."""
    if scale not in table:
        raise did_you_mean("scale", scale, table)
    return {k: dict(v) if isinstance(v, dict) else v for k, v in table[scale].items()}
