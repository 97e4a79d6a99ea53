"""Capacity by threshold search (``capacity``: the bisection, the guide lines and the scaling-law fits),
the plateau rule that tells a converged run from a step-limited one (``convergence``), the fits and
Markdown summaries (``summary``) and the figures (``plots``) of the associative-memory and factual-recall
rooms (``assoc``, ``recall``)."""
