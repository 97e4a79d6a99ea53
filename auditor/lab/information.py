"""Stored bits: the one definition every room of the lab counts with.

A model trained on data X drawn from a known generator stores what it knows about X, the mutual
information I(X; model) = H(X) - H(X | model). Neither term needs guessing here:

* H(X), the **generator's entropy**, follows from the task's own parameters: N labels drawn uniformly
  from M values hold N log2 M bits (:func:`uniform_entropy`); a uniformly random pairing of N items
  (a bijection) holds log2 N! bits, not N log2 N (:func:`bijection_entropy`); a planted fact table holds
  the bits of its groups, block values and noise (:func:`planted_table_entropy`); n uniform token
  sequences of length S over V tokens hold n S log2 V bits.
* H(X | model) is at most the length L of any code that rebuilds X from the model's predictions
  (Shannon: no code beats the conditional entropy on average), so **stored bits = H(X) - L** is a
  lower bound on what the model holds, computable from what the run recorded:

  - where the run recorded the model's probabilities of the true labels, L is its log-loss in bits,
    sum_i -log2 p(x_i) (arithmetic coding reaches it within 2 bits in total; a model at the
    generator's own uniform distribution pays exactly H(X), a model sure of every label pays 0:
    :func:`logloss_stored_bits`);
  - where only the argmax was recorded (E of the N labels wrong, each of M values), L is the correction
    code of :func:`correction_bits`: the count E (log2(N+1) bits: E is one of 0..N), which E labels are
    wrong (log2 C(N, E)) and each wrong label's value (log2 M each): L = log2(N+1) + log2 C(N, E) +
    E log2 M (:func:`argmax_stored_bits`). A model at chance gets E = N (1 - 1/M) wrong; with
    log2 C(N, k) >= N h(k/N) - (1/2) log2(8 k (N-k)/N) >= N h(k/N) - (1/2) log2(2N) and the identity
    N h(1/M) + N (1 - 1/M) log2 M = N log2 M + N (1 - 1/M) log2(M/(M-1)), its code is
    L - H >= N (1 - 1/M) log2(M/(M-1)) + log2(N+1) - (1/2) log2(2N) > 0 bits longer than the data, so it
    stores 0; partial recall earns only what it saves over sending the labels, not (correct) x log2 M. A
    model with every label right still pays log2(N+1) bits to say that none is wrong.

**Clipped at 0** (a model cannot store negative information; H - L < 0 only says this code learned
nothing from it) and **at most H** (L >= 0), so no row can claim more than the data's entropy.

A capacity *certificate* (rank of the attention-weighted contexts) trains nothing: it says which g of N
labels a readout fits exactly whatever they are ("labels interpolable"). To compare it with trained models
it is converted at the label alphabet: the g fitted labels are free, the other N - g are sent as they are,
L = (N - g) log2 M, stored = g log2 M (:func:`interpolable_stored_bits`).
"""

from __future__ import annotations

import numpy as np
from scipy.special import gammaln

LN2 = float(np.log(2.0))


def _array(value: object, name: str, *, low: float = 0.0) -> np.ndarray:
    """``value`` as a float array, every entry finite and >= ``low`` (else one ValueError naming ``name``)."""
    out = np.asarray(value, dtype=float)
    bad = ~np.isfinite(out) | (out < low)
    if bad.any():
        first = out.reshape(-1)[np.flatnonzero(bad.reshape(-1))[0]]
        raise ValueError(f"{name} must be finite and >= {low:g}; got {first:g}")
    return out


def log2_factorial(n: object) -> np.ndarray:
    """log2 n! (real n >= 0, through the log-gamma function: exact to float64 rounding)."""
    return gammaln(_array(n, "n") + 1.0) / LN2


def log2_binomial(n: object, k: object) -> np.ndarray:
    """log2 C(n, k) for 0 <= k <= n."""
    n, k = np.broadcast_arrays(_array(n, "n"), _array(k, "k"))
    if (k > n).any():
        raise ValueError(f"k must be within 0..n; got k = {k[k > n][0]:g} > n = {n[k > n][0]:g}")
    return (gammaln(n + 1.0) - gammaln(k + 1.0) - gammaln(n - k + 1.0)) / LN2


def uniform_entropy(n: object, alphabet: object) -> np.ndarray:
    """H of ``n`` labels drawn independently and uniformly from ``alphabet`` values: n log2 M bits."""
    return _array(n, "the number of labels") * np.log2(_array(alphabet, "the label alphabet", low=1.0))


def bijection_entropy(n: object) -> np.ndarray:
    """H of a uniformly random pairing of n items with n others (a random permutation): log2 n! bits."""
    return log2_factorial(n)


def _multinomial_groups(n: int, groups: int) -> float:
    """log2 of the ways to split n labelled items into ``groups`` labelled groups of balanced sizes (sizes
    n // g or n // g + 1), less log2 of the relabellings that keep every size (they give the same split)."""
    small, extra = divmod(n, groups)
    sizes = [small + 1] * extra + [small] * (groups - extra)
    ways = float(log2_factorial(n)) - sum(float(log2_factorial(s)) for s in sizes)
    return ways - float(log2_factorial(extra)) - float(log2_factorial(groups - extra))


def binary_entropy(p: float) -> float:
    """h(p) = -p log2 p - (1 - p) log2 (1 - p) (0 at p = 0 and 1)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"a probability must be within [0, 1]; got {p:g}")
    return 0.0 if p in (0.0, 1.0) else float(-p * np.log2(p) - (1 - p) * np.log2(1 - p))


def planted_table_entropy(keys: int, queries: int, key_groups: int, query_groups: int, *, facts: int,
                          values: int, shared_values: bool = False, noise: float = 0.0) -> float:
    """H of a planted fact table (keys and queries in balanced groups, one value per (key group, query
    group) block, a ``noise`` fraction of the ``facts`` relabelled to one of the other ``values - 1``).

    With a distinct value per block (``shared_values`` False, ``values`` = blocks): the key split, the
    query split (each up to relabelling groups of equal size, which gives the same table) and the
    assignment of values to blocks, log2 blocks!. With ``values`` shared values drawn per block, blocks
    may share a value and hide the split: counted is only what survives that, the block values
    (blocks log2 values), a lower bound. Noise adds facts (h(noise) + noise log2(values - 1)) bits; the
    planted values are then the majority of their blocks (noise < 1/2), so the table still tells the
    structure and the noise apart.
    """
    blocks = key_groups * query_groups
    if shared_values:
        structure = blocks * float(np.log2(values))
    else:
        structure = (_multinomial_groups(keys, key_groups) + _multinomial_groups(queries, query_groups)
                     + float(log2_factorial(blocks)))
    flips = facts * (binary_entropy(noise) + noise * float(np.log2(max(values - 1, 1)))) if noise else 0.0
    return structure + flips


def correction_bits(n: object, errors: object, alphabet: object) -> np.ndarray:
    """L = log2(N+1) + log2 C(N, E) + E log2 M: the bits that turn a model's argmax predictions of N labels,
    E of them wrong, into the true labels (how many are wrong, which, and each one's value of M)."""
    n = _array(n, "the number of labels")
    errors = _array(errors, "the number of wrong labels")
    return np.log2(n + 1.0) + log2_binomial(n, errors) + errors * np.log2(
        _array(alphabet, "the label alphabet", low=1.0))


def stored_bits(entropy: object, residual: object) -> np.ndarray:
    """H - L clipped to [0, H]: what a model stores of data with entropy H given its residual code L."""
    entropy = _array(entropy, "the data's entropy")
    return np.clip(entropy - _array(residual, "the residual code length"), 0.0, entropy)


def argmax_stored_bits(entropy: object, n: object, correct: object, alphabet: object
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(stored bits, residual bits) of a model that gets ``correct`` of ``n`` labels right by argmax."""
    n, correct = np.broadcast_arrays(_array(n, "the number of labels"), _array(correct, "the correct count"))
    if (correct > n).any():
        raise ValueError(f"the correct count must be within 0..N; got {correct[correct > n][0]:g} of "
                         f"{n[correct > n][0]:g}")
    residual = correction_bits(n, n - correct, alphabet)
    return stored_bits(entropy, residual), residual


def logloss_stored_bits(entropy: object, logloss_bits: object) -> tuple[np.ndarray, np.ndarray]:
    """(stored bits, residual bits) of a model whose total log-loss on the data is ``logloss_bits``
    (sum over the predicted tokens of -log2 p(true token))."""
    residual = _array(logloss_bits, "the log-loss in bits")
    return stored_bits(entropy, residual), residual


def interpolable_stored_bits(n: object, interpolable: object, alphabet: object
                             ) -> tuple[np.ndarray, np.ndarray]:
    """(stored bits, residual bits) of a certificate that ``interpolable`` of ``n`` labels of ``alphabet``
    values are fitted exactly whatever they are: g log2 M, the other N - g labels sent as they are."""
    n, g = np.broadcast_arrays(_array(n, "the number of labels"), _array(interpolable, "interpolable labels"))
    if (g > n).any():
        raise ValueError(f"interpolable labels must be within 0..N; got {g[g > n][0]:g} of {n[g > n][0]:g}")
    entropy = uniform_entropy(n, alphabet)
    residual = uniform_entropy(n - g, alphabet)
    return stored_bits(entropy, residual), residual
