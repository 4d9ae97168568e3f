"""The vision-language token front-end and decoder pieces shared by RT-1-style, GeRM, GeRM w/o MoE and
GeRM w/o RL (seed 003 §IV-C; RT-1).

Per window of T history frames (left-padded at episode starts, newest frame last) and one instruction:

    e        = InstructionEncoder(instruction)                          (B, E)
    F_t      = FiLMImageEncoder(image_t, e) + M                         (B, D, h, w)   per frame
    Z_t      = TokenLearner(F_t)                                        (B, S, D)      S tokens per frame
               M (D, h, w): learned map-position embedding. TokenLearner's weighted sums keep WHAT a
               feature is but not WHERE it was; a shallow from-scratch trunk has too small a receptive
               field to encode position through padding, so "the red one is on the left" needs M.
    tokens   = [W_e·e + c, Z_1 + p_1 + q, .., Z_T + p_T + q]            (B, 1 + T·S, D)
               p_t: learned frame-slot embedding, q (S, D): learned token-slot embedding; the first
               token is the instruction itself (``language_token``, rank 0: every token sees it)

The instruction token is ours, not RT-1's (RT-1 feeds language through FiLM only): with FiLM alone our
small from-scratch model took far longer to bind "the red one" to the red square on the colour task,
because the binding then has to be learned inside the trunk; with the token the decoder can compare
the instruction with the frame tokens directly. ``language_token=False`` gives RT-1's pure-FiLM design.

Frames are encoded independently (the only input shared between them is e), so frame t's tokens never
depend on later frames: the front-end is causal over the history, and deployment encodes only the new
frame and keeps the older frames' tokens. Padding frames (mask False) are not encoded at all.

The decoders attend with a rank mask: a token of frame t sees every token of frames <= t (full attention
within a frame, RT-1's frame-causal mask); tokens after the frames (RT-1's action read-outs, GeRM's
action tokens) carry ranks T, T+1, .. and see every token of lower or equal rank; padded keys are
skipped but a token always sees itself.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple

import torch
from torch import nn

from quadforge.models.decoder import Decoder
from quadforge.models.instruction import (INSTRUCTION_ENCODERS, UNKNOWN_WORD_RULES, WORDLLAMA_DIM,
                                         build_instruction_encoder)
from quadforge.models.moe import MoEConfig, matched_dense_hidden
from quadforge.models.tokenlearner import TokenLearner
from quadforge.models.vision import FiLMImageEncoder, ImageEncoderConfig


@dataclass
class VLAConfig:
    # --- inputs ------------------------------------------------------------------------------------
    image: ImageEncoderConfig = field(default_factory=ImageEncoderConfig)
    history: int = 6                     # frames per window (seed 003: 6, +1 for the Q target only)
    instruction: str = "words"           # "words" (learned) | "wordllama" (frozen, 256-D)
    vocab: tuple[str, ...] = ()          # the word encoder's vocabulary (from the instruction table)
    word_dim: int = 128
    max_words: int = 24
    unknown_words: str = "unk"           # "unk" | "nearest" | "blend": an unseen word's backoff (models/instruction.py)
    # --- tokens ------------------------------------------------------------------------------------
    d_model: int = 128
    tokens_per_frame: int = 8            # TokenLearner S (RT-1: 8)
    token_hidden: int = 64               # TokenLearner attention MLP width (RT-1: 64)
    language_token: bool = True          # also give the decoder the instruction as one token (ours)
    # --- decoder -----------------------------------------------------------------------------------
    num_layers: int = 4
    num_heads: int = 4
    ffn_hidden: int = 256                # per expert when moe, else the dense FFN width
    moe: bool = False
    num_experts: int = 8
    top_k: int = 2
    noisy_gating: bool = True
    balance: str = "cv2"
    balance_weight: float = 1e-2
    dropout: float = 0.0
    # --- actions -----------------------------------------------------------------------------------
    action_dim: int = 12
    num_bins: int = 256

    @property
    def cond_dim(self) -> int:
        return WORDLLAMA_DIM if self.instruction == "wordllama" else self.word_dim

    def validate(self) -> None:
        if self.instruction not in INSTRUCTION_ENCODERS:
            raise ValueError(f"VLA instruction encoder {self.instruction!r} unknown; allowed: {INSTRUCTION_ENCODERS}")
        if self.unknown_words not in UNKNOWN_WORD_RULES:
            raise ValueError(f"VLA config unknown_words={self.unknown_words!r}; allowed: {UNKNOWN_WORD_RULES}")
        if self.unknown_words != "unk" and self.instruction != "words":
            raise ValueError(f"VLA config unknown_words={self.unknown_words!r} backs off the words encoder's "
                             f"vocabulary; instruction={self.instruction!r} has none (use unknown_words='unk')")
        if self.instruction == "words" and not self.vocab:
            raise ValueError("VLA config: instruction='words' needs vocab (build_vocabulary(instruction table))")
        for name in ("history", "d_model", "tokens_per_frame", "token_hidden", "num_layers", "num_heads",
                     "ffn_hidden", "action_dim", "word_dim", "max_words"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"VLA config {name}={getattr(self, name)}; must be >= 1")
        if self.num_bins < 2:
            raise ValueError(f"VLA config num_bins={self.num_bins}; must be >= 2")
        if self.d_model % self.num_heads:
            raise ValueError(f"VLA config d_model={self.d_model} must be divisible by num_heads={self.num_heads}")
        if self.image.out_channels != self.d_model or self.image.cond_dim != self.cond_dim:
            raise ValueError(f"VLA config: image.out_channels ({self.image.out_channels}) must equal d_model "
                             f"({self.d_model}) and image.cond_dim ({self.image.cond_dim}) the instruction "
                             f"width ({self.cond_dim}); build it with VLAConfig.make(...)")
        self.image.validate()
        if self.moe:
            self.moe_config().validate()

    def moe_config(self) -> MoEConfig:
        return MoEConfig(dim=self.d_model, hidden=self.ffn_hidden, num_experts=self.num_experts, top_k=self.top_k,
                         noisy=self.noisy_gating, balance=self.balance, balance_weight=self.balance_weight,
                         dropout=self.dropout)

    def dense_matched(self) -> "VLAConfig":
        """GeRM w/o MoE: dense FFNs at the MoE's active parameter count (same rule as GeRMConfig)."""
        if not self.moe:
            return dataclasses.replace(self)
        return dataclasses.replace(self, moe=False, ffn_hidden=matched_dense_hidden(self.moe_config()))

    @classmethod
    def make(cls, image_size: tuple[int, int] = (64, 64), image: Mapping[str, Any] | None = None,
             **kw: Any) -> "VLAConfig":
        """A consistent config: the image trunk's output width and FiLM input follow d_model / the encoder."""
        cfg = cls(**kw)
        cfg.vocab = tuple(cfg.vocab)
        cfg.image = ImageEncoderConfig(**{**(dict(image) if image else {}), "image_size": tuple(image_size),
                                          "out_channels": cfg.d_model, "cond_dim": cfg.cond_dim})
        cfg.validate()
        return cfg

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["vocab"] = list(self.vocab)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "VLAConfig":
        d = dict(d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"VLA config has unknown fields {unknown}; known: {sorted(known)}")
        d["image"] = ImageEncoderConfig.from_dict(d.get("image", {}))
        d["vocab"] = tuple(d.get("vocab", ()))
        return cls(**d)


def images_to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 (..., H, W, 3) camera frames -> float (..., 3, H, W) in [0, 1]."""
    if images.shape[-1] != 3:
        raise ValueError(f"RGB frames must be (..., H, W, 3), got {tuple(images.shape)}")
    x = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
    return x.movedim(-1, -3)


class VisionLanguageFrontEnd(nn.Module):
    def __init__(self, cfg: VLAConfig):
        super().__init__()
        self.cfg = cfg
        self.instruction = build_instruction_encoder(cfg.instruction, cfg.vocab, cfg.word_dim, cfg.max_words,
                                                     cfg.unknown_words)
        self.image = FiLMImageEncoder(cfg.image)
        self.token_learner = TokenLearner(cfg.d_model, cfg.tokens_per_frame, cfg.token_hidden)
        self.map_pos = nn.Parameter(torch.zeros(cfg.d_model, *cfg.image.feature_size()))   # M
        nn.init.normal_(self.map_pos, std=0.02)
        self.frame_pos = nn.Parameter(torch.zeros(cfg.history, cfg.d_model))       # p_t
        self.token_pos = nn.Parameter(torch.zeros(cfg.tokens_per_frame, cfg.d_model))  # q
        nn.init.normal_(self.frame_pos, std=0.02)
        nn.init.normal_(self.token_pos, std=0.02)
        self.language = nn.Linear(cfg.cond_dim, cfg.d_model) if cfg.language_token else None   # W_e, c

    def prepare_instructions(self, texts: list[str]) -> torch.Tensor:
        """An instruction table -> the encoder's prepared inputs (index rows with the instruction ids)."""
        return self.instruction.prepare(texts)

    def embed_instruction(self, prepared: torch.Tensor) -> torch.Tensor:
        return self.instruction(prepared)                                       # (B, E)

    def frame_tokens(self, frames: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """frames (N, 3, H, W) float, e (N, E) -> Z (N, S, D): one frame's tokens (no positions)."""
        h, w = self.cfg.image.image_size
        if frames.shape[-2:] != (h, w):
            raise ValueError(f"frames are {tuple(frames.shape[-2:])}, the model was built for {h}x{w} images")
        return self.token_learner(self.image(frames, e) + self.map_pos)

    def encode_frames(self, frames: torch.Tensor, mask: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """frames (B, F, 3, H, W), mask (B, F), e (B, E) -> tokens (B, F, S, D); padding frames stay 0
        (never encoded)."""
        b, f = mask.shape
        rows = mask.bool().nonzero(as_tuple=True)       # the one host read (its size)
        if rows[0].numel() == 0:
            return frames.new_zeros(b, f, self.cfg.tokens_per_frame, self.cfg.d_model)
        tokens = self.frame_tokens(frames[rows], e[rows[0]])          # in the trunk's dtype (bf16 under autocast)
        out = tokens.new_zeros(b, f, self.cfg.tokens_per_frame, self.cfg.d_model)
        out[rows] = tokens
        return out

    def assemble(self, frame_tokens: torch.Tensor, mask: torch.Tensor, e: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """frame tokens (B, T, S, D), mask (B, T), instruction embedding e (B, E) -> tokens (B, L, D),
        valid (B, L), rank (L,) with L = [1 +] T·S."""
        b, t, s, d = frame_tokens.shape
        if t != self.cfg.history:
            raise ValueError(f"window has {t} frames, the model's history is {self.cfg.history}")
        x = frame_tokens + self.frame_pos[:, None, :] + self.token_pos[None, :, :]   # (B, T, S, D)
        x = x.reshape(b, t * s, d)
        valid = mask.bool()[:, :, None].expand(b, t, s).reshape(b, t * s)
        rank = torch.arange(t, device=x.device).repeat_interleave(s)                  # frame index per token
        if self.language is not None:
            x = torch.cat([self.language(e)[:, None], x], dim=1)
            valid = torch.cat([valid.new_ones(b, 1), valid], dim=1)
            rank = torch.cat([rank.new_zeros(1), rank])
        return x, valid, rank

    def forward(self, frames: torch.Tensor, mask: torch.Tensor, instruction: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """frames (B, T, 3, H, W) float, mask (B, T), prepared instruction (B, ...) -> assemble(...)."""
        e = self.embed_instruction(instruction)
        return self.assemble(self.encode_frames(frames, mask, e), mask, e)


def rank_mask(rank: torch.Tensor, valid: torch.Tensor, num_new: int) -> torch.Tensor:
    """(B, 1, L, K) attention mask for the last L=num_new of K=len(rank) tokens: key k is visible to
    query q when rank[k] <= rank[q] and k is valid; a token always sees itself."""
    k = rank.shape[0]
    q_rank = rank[k - num_new:, None]                                        # (L, 1)
    allowed = (rank[None, :] <= q_rank)[None] & valid[:, None, :]           # (B, L, K)
    eye = torch.arange(k - num_new, k, device=rank.device)[:, None] == torch.arange(k, device=rank.device)[None]
    return (allowed | eye[None])[:, None]


class VLAOutput(NamedTuple):
    logits: torch.Tensor     # (B, m, bins)
    aux_loss: torch.Tensor   # () MoE balance loss (0 for dense decoders)


def parameter_counts(model: nn.Module, decoder: Decoder) -> dict[str, int]:
    """Trainable parameters in total and those that touch one token (MoE: router + top-k experts)."""
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"total": total, "active": total - decoder.inactive_parameters()}
