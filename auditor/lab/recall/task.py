"""The synthetic factual recall task of paper C: fact tables and prompts.

S subjects, R relations; relation r owns the block of D answers [r D, (r + 1) D), and the fact a(s, r)
is an answer of that block (uniform at random, or the structured table a(s, r) = floor(s D / S) + r D
used for the learning dynamics). A prompt has T tokens: the subject and the relation at two random
distinct positions among the first T - 1, the other positions filled with noise tokens drawn uniformly
from a noise vocabulary of S + R tokens, and EOS at position T - 1. The answer of the prompt is
a(s, r).

Token ids of one task: subjects 0..S-1, relations S..S+R-1, noise S+R..2(S+R)-1, EOS 2(S+R); the
vocabulary has 2(S+R)+1 tokens and the output layer R D answers.

Ensembles train many tasks at once, so every function here works on E tasks with their own (S, R)
padded to the largest: ``answers`` (E, S_max, R_max), prompts (E, B, T).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from auditor.core.errors import AuditError

DEFAULT_PROMPT_LENGTH = 32


@dataclass(frozen=True)
class FactTable:
    """A table of S * R facts with D candidate answers per relation.

    ``seed`` draws the random table (the same seed always gives the same facts); ``structured`` uses
    a(s, r) = floor(s D / S) + r D instead (then the seed is unused).
    """

    subjects: int
    relations: int
    answers_per_relation: int = 8
    seed: int = 0
    structured: bool = False

    def __post_init__(self) -> None:
        if self.subjects < 1 or self.relations < 1:
            raise AuditError(
                f"need S >= 1 subjects and R >= 1 relations, got S={self.subjects}, R={self.relations}"
            )
        if self.answers_per_relation < 1:
            raise AuditError(f"need D >= 1 answers per relation, got D={self.answers_per_relation}")

    @property
    def num_facts(self) -> int:
        return self.subjects * self.relations

    @property
    def num_answers(self) -> int:
        """Size of the output vocabulary, R * D."""
        return self.relations * self.answers_per_relation

    @property
    def vocab_size(self) -> int:
        """Input vocabulary: S subjects, R relations, S + R noise tokens, EOS."""
        return 2 * (self.subjects + self.relations) + 1

    @property
    def eos_token(self) -> int:
        return 2 * (self.subjects + self.relations)

    def answers(self) -> torch.Tensor:
        """a(s, r) for every fact: (S, R) long, with a(s, r) in [r D, (r + 1) D)."""
        S, R, D = self.subjects, self.relations, self.answers_per_relation
        block = torch.arange(R)[None, :] * D  # (1, R)
        if self.structured:
            offset = (torch.arange(S)[:, None] * D) // S  # (S, 1): floor(s D / S)
        else:
            offset = torch.randint(D, (S, R), generator=torch.Generator().manual_seed(self.seed))
        return block + offset  # (S, R)

    def bits(self) -> float:
        """Information in the table: S R log2 D bits (each fact is one of D equally likely answers)."""
        return self.num_facts * float(torch.log2(torch.tensor(float(self.answers_per_relation))))


@dataclass
class PromptBatch:
    """Prompts for E tasks: ``tokens`` (E, B, T) long, ``answers`` (E, B) long, ``subjects`` and
    ``relations`` (E, B) long (the fact each prompt asks for), ``valid`` (E, B) bool (padding is False)."""

    tokens: torch.Tensor
    answers: torch.Tensor
    subjects: torch.Tensor
    relations: torch.Tensor
    valid: torch.Tensor


class FactBank:
    """The fact tables of E tasks, padded: ``answers`` (E, S_max, R_max), ``S``/``R``/``D`` (E,)."""

    def __init__(self, tables: Sequence[FactTable], prompt_length: int = DEFAULT_PROMPT_LENGTH) -> None:
        if not tables:
            raise AuditError("a fact bank needs at least one table")
        if prompt_length < 3:
            raise AuditError(f"prompts need T >= 3 tokens (subject, relation, EOS), got T={prompt_length}")
        self.tables = list(tables)
        self.T = prompt_length
        self.S = torch.tensor([t.subjects for t in tables])  # (E,)
        self.R = torch.tensor([t.relations for t in tables])  # (E,)
        self.D = torch.tensor([t.answers_per_relation for t in tables])  # (E,)
        s_max, r_max = int(self.S.max()), int(self.R.max())
        self.answers = torch.zeros(len(tables), s_max, r_max, dtype=torch.long)  # (E, S_max, R_max)
        for i, t in enumerate(tables):
            self.answers[i, : t.subjects, : t.relations] = t.answers()
        self.vocab_size = max(t.vocab_size for t in tables)
        self.num_answers = torch.tensor([t.num_answers for t in tables])  # (E,)

    @property
    def num_members(self) -> int:
        return len(self.tables)

    def _fill(self, subjects: torch.Tensor, relations: torch.Tensor, valid: torch.Tensor,
              generators: Sequence[torch.Generator]) -> PromptBatch:
        """Prompts asking for (subjects, relations), (E, B) each; member i's noise tokens and
        positions come from ``generators[i]`` only."""
        E, B = subjects.shape
        T = self.T
        noise, pos_s, pos_r = [], [], []
        for i, g in enumerate(generators):
            width = int(self.S[i] + self.R[i])  # noise vocabulary size S + R, ids from S + R
            noise.append(width + torch.randint(width, (B, T), generator=g))
            pos_s.append(torch.randint(T - 1, (B,), generator=g))
            pos_r.append(torch.randint(T - 2, (B,), generator=g))
        tokens = torch.stack(noise)  # (E, B, T)
        pos_s, pos_r = torch.stack(pos_s), torch.stack(pos_r)  # (E, B)
        pos_r = pos_r + (pos_r >= pos_s).long()  # distinct from the subject's position, still < T - 1
        tokens.scatter_(2, pos_s[..., None], subjects[..., None])
        tokens.scatter_(2, pos_r[..., None], (self.S[:, None] + relations)[..., None])
        tokens[..., T - 1] = (2 * (self.S + self.R))[:, None]  # EOS
        member = torch.arange(E)[:, None]  # (E, 1)
        answers = self.answers[member, subjects, relations]  # (E, B)
        return PromptBatch(
            tokens=tokens, answers=answers, subjects=subjects, relations=relations, valid=valid
        )

    def _check(self, generators: Sequence[torch.Generator]) -> None:
        if len(generators) != self.num_members:
            raise AuditError(f"need one generator per member: got {len(generators)} for {self.num_members}")

    def sample(self, batch_size: int, generators: Sequence[torch.Generator]) -> PromptBatch:
        """Fresh training prompts: member i draws B facts uniformly from its own S * R with
        ``generators[i]`` (so its prompts do not depend on the other members)."""
        self._check(generators)
        subjects = torch.stack(
            [torch.randint(int(s), (batch_size,), generator=g) for s, g in zip(self.S, generators)]
        )
        relations = torch.stack(
            [torch.randint(int(r), (batch_size,), generator=g) for r, g in zip(self.R, generators)]
        )
        valid = torch.ones(self.num_members, batch_size, dtype=torch.bool)
        return self._fill(subjects, relations, valid, generators)  # (E, B, T)

    def all_facts(self, contexts_per_fact: int, generators: Sequence[torch.Generator]) -> PromptBatch:
        """Every fact of every member, each in ``contexts_per_fact`` noisy prompts: (E, P_max, T).

        Member i has S_i R_i k valid prompts (fact-major: all contexts of fact 0, then fact 1, ...,
        fact number s R + r); the rest is padding (``valid`` False, asking for fact (0, 0)).
        """
        if contexts_per_fact < 1:
            raise AuditError(f"contexts_per_fact must be >= 1, got {contexts_per_fact}")
        self._check(generators)
        E, k = self.num_members, contexts_per_fact
        counts = self.S * self.R * k  # (E,)
        p_max = int(counts.max())
        idx = torch.arange(p_max)[None, :].expand(E, p_max)  # (E, P)
        valid = idx < counts[:, None]
        fact = torch.where(valid, idx // k, 0)  # (E, P)
        subjects = fact // self.R[:, None]
        relations = fact % self.R[:, None]
        return self._fill(subjects, relations, valid, generators)


def member_generator(seed: int, stream: int, step: int = 0) -> torch.Generator:
    """A generator that depends only on (seed, stream, step): the data of one member at one step.

    Streams separate uses (training prompts, evaluation prompts); a member's data never depends on
    which other members share its ensemble, and a resumed run redraws the same prompts.
    """
    return torch.Generator().manual_seed((seed * 1_000_003 + stream * 7_919 + step * 104_729) % (2**63 - 1))
