"""``audit models``: the registered model names, from a snapshot of the registry kept beside it.

Listing the registry itself imports every family's adapter, with torch and transformers (seconds); the
listing reads :data:`MODELS` instead, a snapshot of what
:func:`auditor.audit.model_snapshot.registry_lines` derives from the registry (name, family, modality, the n
an audit with no options uses, the width d, the hub source, the description). ``tests/test_cli_speed.py``
holds the snapshot equal to the registry, so a model added to the registry fails that test until
``python -m auditor.audit.model_snapshot`` writes the snapshot again. This module imports nothing but click.
"""

from __future__ import annotations

from typing import NamedTuple

import click


class ModelLine(NamedTuple):
    """One registered name as ``audit models`` lists it."""

    name: str
    family: str
    modality: str  # "image" | "text"
    n: int | None  # the context length of an audit with no options (None: known only once loaded)
    d: int | None  # the width
    source: str  # the hub id of its pretrained weights
    description: str


# BEGIN SNAPSHOT (written by `python -m auditor.audit.model_snapshot`; do not edit by hand)
MODELS: tuple[ModelLine, ...] = (
    ModelLine('bert-base', 'bert', 'text', 256, 768, 'google-bert/bert-base-uncased',
              'BERT-base uncased; paper n = 512'),
    ModelLine('bert-large', 'bert', 'text', 256, 1024, 'google-bert/bert-large-uncased',
              'BERT-large; paper A at n = 512'),
    ModelLine('clip-vit-b16', 'clip', 'image', 197, 768, 'openai/clip-vit-base-patch16',
              'CLIP ViT-B/16 vision tower; n = 197'),
    ModelLine('dinov2-base', 'dinov2', 'image', 257, 768, 'facebook/dinov2-base',
              'DINOv2 ViT-B/14 at 224 px; n = 257'),
    ModelLine('dinov2-reg-base', 'dinov2', 'image', 261, 768, 'facebook/dinov2-with-registers-base',
              'DINOv2 ViT-B/14 with 4 registers (in the context); n = 261'),
    ModelLine('gemma-2-2b', 'decoder', 'text', 64, 2304, 'google/gemma-2-2b',
              'Gemma 2 2B (d 2304, 26 blocks)'),
    ModelLine('gpt2', 'gpt2', 'text', 256, 768, 'openai-community/gpt2',
              'GPT-2 small (124M); n = 256'),
    ModelLine('gpt2-large', 'gpt2', 'text', 128, 1280, 'openai-community/gpt2-large',
              'GPT-2 large; paper A at n = 1024'),
    ModelLine('llama-3.1-8b', 'decoder', 'text', 32, 4096, 'meta-llama/Llama-3.1-8B',
              'Llama 3.1 8B (d 4096, 32 blocks)'),
    ModelLine('llama-3.2-1b', 'decoder', 'text', 128, 2048, 'meta-llama/Llama-3.2-1B',
              'Llama 3.2 1B (d 2048, 16 blocks)'),
    ModelLine('minilm', 'bert', 'text', 128, 384, 'sentence-transformers/all-MiniLM-L6-v2',
              'MiniLM-L6; n = 128; real weights offline'),
    ModelLine('mistral-7b', 'decoder', 'text', 32, 4096, 'mistralai/Mistral-7B-v0.1',
              'Mistral 7B v0.1 (d 4096, 32 blocks)'),
    ModelLine('phi-3-mini', 'decoder', 'text', 64, 3072, 'microsoft/Phi-3-mini-4k-instruct',
              'Phi-3 mini 4k (d 3072, 32 blocks)'),
    ModelLine('qwen2.5-0.5b', 'decoder', 'text', 128, 896, 'Qwen/Qwen2.5-0.5B',
              'Qwen2.5 0.5B (d 896, 24 blocks)'),
    ModelLine('qwen3-0.6b', 'decoder', 'text', 128, 1024, 'Qwen/Qwen3-0.6B-Base',
              'Qwen3 0.6B (d 1024, 28 blocks)'),
    ModelLine('siglip-base', 'siglip', 'image', 196, 768, 'google/siglip-base-patch16-224',
              'SigLIP B/16 vision tower, query = patch mean (--query); n = 196'),
    ModelLine('vit-base', 'vit', 'image', 197, 768, 'google/vit-base-patch16-224-in21k',
              'ViT-B/16, paper A; n = 197'),
    ModelLine('vit-base-224', 'vit', 'image', 197, 768, 'google/vit-base-patch16-224',
              'ViT-B/16, ImageNet-1k; n = 197'),
    ModelLine('vit-large', 'vit', 'image', 197, 1024, 'google/vit-large-patch16-224-in21k',
              'ViT-L/16 in21k; n = 197'),
)
# END SNAPSHOT


# How documents name each family of the registry (README, docs/auditor.md, audit_model's docstring);
# tests/test_docs_figures.py holds its keys to the registry's families and each name to those documents.
FAMILY_NAMES = {"vit": "ViT", "bert": "BERT", "gpt2": "GPT-2", "decoder": "decoder LLMs", "dinov2": "DINOv2",
                "clip": "CLIP", "siglip": "SigLIP"}


def families(lines: tuple[ModelLine, ...] = MODELS) -> list[str]:
    """The families of the registered names, in the order of their first name."""
    return list(dict.fromkeys(line.family for line in lines))


@click.command("models")
def models_command() -> None:
    """List the registered model names (any hub id or timm:<name> works too), each with the context length n
    an audit with no options uses (text models: the cost rule of --context-length)."""
    for line in MODELS:
        shown = f"n = {line.n}" if line.n is not None else ""
        click.echo(f"{line.name:15s} {line.family:7s} {shown:8s} {line.source:45s} {line.description}")
