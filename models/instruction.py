"""Instruction encoders: text -> one embedding e (B, E) that FiLM conditions the image trunk on.

Two interchangeable encoders (``INSTRUCTION_ENCODERS``), both used in two steps so a batch never
re-tokenises text: ``prepare(texts) -> tensor`` once per instruction table (the env's / the store's
list of strings), then ``forward(prepared[instruction_index]) -> (B, out_dim)`` per batch.

- ``words`` (default): a learned encoder over the task vocabulary. Words are lower-cased alphanumeric
  runs; ids 0 = padding, 1 = unknown word (a held-out colour the training table never named), 2.. the
  vocabulary in sorted order (stored in the config, so a checkpoint rebuilds it alone).
  ``unknown_words="nearest"`` or ``"blend"`` backs an unknown word off to known ones instead of ``<unk>`` (below):

      h = TransformerEncoderLayer(WordEmbed(w) + Pos)      (B, L, E)    one pre-norm layer: word order
      e = LayerNorm(mean over the real words of h)          (B, E)       matters ("red cube ... blue ball")

- ``wordllama``: a frozen pretrained static sentence embedding (the ``wordllama`` package's 256-D
  ``l2_supercat`` model, which ships its weights inside the wheel; loaded with downloads disabled) as the
  stand-in for RT-1's Universal Sentence Encoder, which cannot be downloaded here. ``prepare`` returns
  the L2-normalised 256-D vectors and ``forward`` passes them through; the learned FiLM projections are
  what adapts them. It is an average of token embeddings, so it ignores word order: two instructions
  that differ only by swapping two words get the same vector (``go_avoid``'s "X ... avoid Y" relies on
  the words themselves, which differ). The package is an optional extra: ``pip install quadforge[lang]``.

Unknown-word backoff (``unknown_words="nearest"``, words encoder only). A learned vocabulary has no
vector for a word it never trained on, so "go to the gold cube" reads as "go to the <unk> cube" and the
colour, the one word that names the object, is lost. With the backoff, ``prepare`` replaces each unknown
word by the known word that (1) fills the same slot - some instruction of the prepared table has the
known word where the other has the unknown one, every other word equal - and (2) is the closest of those
candidates by the frozen wordllama embedding's cosine. It is the language prior a pretrained text encoder
brings, applied where the learned one has nothing: the model itself is unchanged and never sees the
new word. The slot rule keeps a candidate a word of the same kind (a colour stands for a colour, not for
"pacing", which wordllama puts nearest "pink"); it needs the table to hold the alternatives, as an env's
full instruction table does (a one-instruction table keeps ``<unk>``). ``backoff(texts)`` says which word
stands for which.

``unknown_words="blend"`` reads the unknown word as a mix of the same candidates instead of the closest
one: its word vector is sum_c softmax(cos(u, c) / BLEND_TEMPERATURE) · WordEmbed(c). It matters where
the frozen embedding cannot tell two candidates apart: "orange" is 0.146 from "red" and 0.150 from
"yellow", so "nearest" reads it as "yellow", the word "gold" also reads as, and a scene with a gold and an
orange object becomes a coin flip; blended, orange is half red, half yellow, while a clear winner keeps
nearly all the weight (gold -> yellow 0.998, pink -> red 0.94, purple -> blue 0.999). A mix gets an id
past the vocabulary (``len(vocab) + 2 + j``) whose row ``forward`` builds from the learned embeddings, so
it follows training and the weights stay untouched; ``backoff(texts)`` names each mix's heaviest word and
``backoff_weights(texts)`` the whole mix.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

INSTRUCTION_ENCODERS = ("words", "wordllama")
UNKNOWN_WORD_RULES = ("unk", "nearest", "blend")
# wordllama's cosines between colour words lie in 0.0-0.25: at 0.02 a candidate ahead by 0.05 takes ~0.9
# of the weight, so only near-ties (orange: red 0.146, yellow 0.150) stay mixed (module doc)
BLEND_TEMPERATURE = 0.02
PAD, UNK = 0, 1
WORDLLAMA_DIM = 256
_WORD = re.compile(r"[a-z0-9]+")


def words_of(text: str) -> list[str]:
    return _WORD.findall(str(text).lower())


def build_vocabulary(texts: Sequence[str]) -> list[str]:
    """Sorted unique words of an instruction table (the word encoder's vocabulary)."""
    return sorted({w for t in texts for w in words_of(t)})


def slot_fillers(texts: Sequence[str], word: str) -> set[str]:
    """Words that stand where ``word`` stands in some pair of ``texts`` equal in every other word."""
    split = [words_of(t) for t in texts]
    contexts = {(tuple(ws[:i]), tuple(ws[i + 1:])) for ws in split for i, w in enumerate(ws) if w == word}
    return {w for ws in split for i, w in enumerate(ws)
            if w != word and (tuple(ws[:i]), tuple(ws[i + 1:])) in contexts}


class WordTokenEncoder(nn.Module):
    def __init__(self, vocab: Sequence[str], dim: int = 128, max_words: int = 24, num_heads: int = 4,
                 unknown_words: str = "unk"):
        super().__init__()
        if not vocab:
            raise ValueError("word instruction encoder needs a non-empty vocabulary (the task's instruction table)")
        if unknown_words not in UNKNOWN_WORD_RULES:
            raise ValueError(f"unknown_words={unknown_words!r}; allowed: {', '.join(UNKNOWN_WORD_RULES)}")
        self.unknown_words = unknown_words
        if dim % num_heads:
            raise ValueError(f"word encoder dim={dim} must be divisible by num_heads={num_heads}")
        self.vocab = list(vocab)
        self.index = {w: i + 2 for i, w in enumerate(self.vocab)}
        self.max_words, self.out_dim = int(max_words), int(dim)
        self.embed = nn.Embedding(len(self.vocab) + 2, dim, padding_idx=PAD)
        self.pos = nn.Parameter(torch.zeros(self.max_words, dim))
        nn.init.normal_(self.pos, std=0.02)
        self.layer = nn.TransformerEncoderLayer(dim, num_heads, 2 * dim, dropout=0.0, activation="gelu",
                                                batch_first=True, norm_first=True)
        self.norm = nn.LayerNorm(dim)
        # "blend" mixes, made by prepare: not parameters (a checkpoint never holds them; prepare remakes them)
        self._mix_rows: list[torch.Tensor] = []
        self._mix_ids: dict[tuple, int] = {}

    def backoff_weights(self, texts: Sequence[str]) -> dict[str, dict[str, float]]:
        """Unknown word -> {known word: weight} it reads as in ``texts`` (module doc): one word at weight 1
        under ``unknown_words="nearest"``, the softmax mix under ``"blend"``; {} under ``"unk"``."""
        unknown = sorted({w for t in texts for w in words_of(t) if w not in self.index})
        if self.unknown_words == "unk" or not unknown:
            return {}
        candidates = {u: sorted(w for w in slot_fillers(texts, u) if w in self.index) for u in unknown}
        candidates = {u: c for u, c in candidates.items() if c}
        if not candidates:
            return {}
        wanted = sorted(set(candidates) | {w for c in candidates.values() for w in c})
        vectors = dict(zip(wanted, torch.as_tensor(load_wordllama().embed(wanted, norm=True), dtype=torch.float32)))
        out = {}
        for u, c in candidates.items():
            cos = [float(vectors[u] @ vectors[w]) for w in c]
            if self.unknown_words == "nearest":
                out[u] = {max(zip(cos, c))[1]: 1.0}               # a tie goes to the later word
            else:
                out[u] = dict(zip(c, torch.softmax(torch.tensor(cos) / BLEND_TEMPERATURE, 0).tolist()))
        return out

    def backoff(self, texts: Sequence[str]) -> dict[str, str]:
        """Unknown word -> the known word it reads as (the heaviest of a mix) in ``texts``; {} under "unk"."""
        return {u: max(mix, key=lambda w: (mix[w], w)) for u, mix in self.backoff_weights(texts).items()}

    def _mix_id(self, mix: dict[str, float]) -> int:
        """The id past the vocabulary whose embedding is ``mix``'s weighted sum (one per distinct mix)."""
        key = tuple(sorted(mix.items()))
        if key not in self._mix_ids:
            row = torch.zeros(len(self.vocab) + 2)
            for w, weight in mix.items():
                row[self.index[w]] = weight
            self._mix_ids[key] = len(self.vocab) + 2 + len(self._mix_rows)
            self._mix_rows.append(row)
        return self._mix_ids[key]

    def prepare(self, texts: Sequence[str]) -> torch.Tensor:
        """texts (K strings) -> word ids (K, max_words) long, 0-padded; too-long instructions are an error."""
        rows = []
        reads_as = {u: (self.index[next(iter(mix))] if self.unknown_words == "nearest" else self._mix_id(mix))
                    for u, mix in self.backoff_weights(texts).items()}
        for text in texts:
            ids = [self.index.get(w, reads_as.get(w, UNK)) for w in words_of(text)]
            if not ids:
                raise ValueError(f"instruction {text!r} has no words")
            if len(ids) > self.max_words:
                raise ValueError(f"instruction {text!r} has {len(ids)} words; the encoder takes at most "
                                 f"{self.max_words} (config max_words)")
            rows.append(ids + [PAD] * (self.max_words - len(ids)))
        return torch.tensor(rows, dtype=torch.long)

    def word_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, L) -> (B, L, E): the learned embeddings, mixes (ids past the vocabulary) built from them."""
        if not self._mix_rows:
            return self.embed(ids)
        table = self.embed.weight
        table = torch.cat([table, torch.stack(self._mix_rows).to(table) @ table])
        return F.embedding(ids, table, padding_idx=PAD)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, L) -> e (B, E)."""
        real = ids != PAD                                                    # (B, L)
        h = self.layer(self.word_vectors(ids) + self.pos[: ids.shape[1]], src_key_padding_mask=~real)  # (B, L, E)
        h = (h * real[..., None]).sum(1) / real.sum(1, keepdim=True).clamp_min(1)            # (B, E)
        return self.norm(h)


@functools.cache
def load_wordllama() -> Any:
    """The wordllama 256-D model from the files inside its wheel (never a download), loaded once per
    process (every encoder and backoff shares it; it is frozen); a clear error when the package is missing."""
    try:
        import wordllama
        from wordllama import WordLlama
    except ImportError as err:
        raise ImportError("instruction encoder 'wordllama' needs the wordllama package: "
                          "pip install 'quadforge[lang]' (its weights ship inside the wheel)") from err
    # The wheel holds weights/ and tokenizers/; 0.4.0 looks for the tokenizer in "<package>/tokenizer/"
    # (singular) and then in "<cache_dir>/tokenizers/", so pointing cache_dir at the package itself finds
    # both shipped files and nothing is fetched (or written to ~/.cache).
    return WordLlama.load(dim=WORDLLAMA_DIM, disable_download=True, cache_dir=Path(wordllama.__file__).parent)


class WordLlamaEncoder(nn.Module):
    """Frozen wordllama sentence vectors; ``prepare`` computes them, ``forward`` passes them through."""

    out_dim = WORDLLAMA_DIM

    def prepare(self, texts: Sequence[str]) -> torch.Tensor:
        vectors = load_wordllama().embed([str(t) for t in texts], norm=True)
        return torch.as_tensor(vectors, dtype=torch.float32)                 # (K, 256)

    def forward(self, vectors: torch.Tensor) -> torch.Tensor:
        if vectors.ndim != 2 or vectors.shape[1] != WORDLLAMA_DIM:
            raise ValueError(f"wordllama encoder expects prepared vectors (B, {WORDLLAMA_DIM}), "
                             f"got {tuple(vectors.shape)}")
        return vectors


def build_instruction_encoder(kind: str, vocab: Sequence[str] = (), dim: int = 128,
                              max_words: int = 24, unknown_words: str = "unk") -> nn.Module:
    if kind == "words":
        return WordTokenEncoder(vocab, dim, max_words, unknown_words=unknown_words)
    if kind == "wordllama":
        return WordLlamaEncoder()
    raise ValueError(f"instruction encoder {kind!r} unknown; allowed: {INSTRUCTION_ENCODERS}")
