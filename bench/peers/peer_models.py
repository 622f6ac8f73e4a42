"""The models the multi-host peer benchmarks train (fsdp2_hsdp.py, deepspeed_zeropp.py).

The same two architectures as Weft's engine, with the same parameter count, so that the FLOPs
per token and so the MFU of a peer compare with Weft's (worker/mfu.h, common/job_spec.cc):

  llama: token embedding, blocks of [RMSNorm (eps 1e-5), attention with grouped key/value heads
         and rotary positions (each head's two halves rotated against each other), RMSNorm,
         SwiGLU MLP], final RMSNorm, untied LM head; no biases anywhere.
  gpt2:  token and position embeddings, blocks of [LayerNorm, attention, LayerNorm, GELU (tanh)
         MLP 4x wide], final LayerNorm, head tied to the token embedding; biases everywhere.

The vocabulary is padded to a multiple of 128 rows as Weft pads it (padded_vocab_size's
default); targets never reach the padding rows.

Used as a library: Shape (add_shape_args / shape_from_args for the command line), build(shape),
init_module (per-module initialisation, so a sharded model can be initialised piece by piece),
param_count (the analytic count Weft uses) and flops_per_token.
"""
import argparse
import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

# Dense bf16 peak of one H100/H200 SXM, the figure Weft's MFU divides by.
PEAK_FLOPS = 989e12


@dataclasses.dataclass
class Shape:
    arch: str = "llama"
    layers: int = 16
    dim: int = 2048
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 8192
    vocab: int = 128256
    seq: int = 2048
    rope_theta: float = 500000.0

    @property
    def padded_vocab(self):
        return (self.vocab + 127) // 128 * 128

    @property
    def head_dim(self):
        return self.dim // self.heads


def add_shape_args(p: argparse.ArgumentParser):
    """Shape flags; the defaults are the Llama-1B-like benchmark shape (Weft's llama default)."""
    p.add_argument("--arch", default="llama", choices=["llama", "gpt2"])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8, help="llama only")
    p.add_argument("--ffn", type=int, default=8192, help="llama only: SwiGLU hidden size")
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--rope-theta", type=float, default=500000.0)
    p.add_argument("--shape", default="",
                   help='WEFT_BENCH_SHAPE-style override: llama "LAYERS DIM HEADS KV FFN VOCAB SEQ", '
                        'gpt2 "LAYERS DIM HEADS VOCAB SEQ"')


def shape_from_args(a) -> Shape:
    s = Shape(a.arch, a.layers, a.dim, a.heads, a.kv_heads, a.ffn, a.vocab, a.seq, a.rope_theta)
    if a.shape:
        f = [int(x) for x in a.shape.split()]
        if a.arch == "llama":
            s.layers, s.dim, s.heads, s.kv_heads, s.ffn, s.vocab, s.seq = f
        else:
            s.layers, s.dim, s.heads, s.vocab, s.seq = f
    if a.arch == "gpt2":
        s.kv_heads, s.ffn = s.heads, 4 * s.dim
    if s.dim % s.heads or s.heads % s.kv_heads or s.head_dim % 2:
        raise SystemExit(f"bad shape {s}: dim % heads, heads % kv_heads and head_dim % 2 must be 0")
    return s


def param_count(s: Shape) -> int:
    """Weft's ModelParameterCount for the same spec (padded vocabulary)."""
    c, v = s.dim, s.padded_vocab
    if s.arch == "llama":
        kv_width = s.head_dim * s.kv_heads
        block = 2 * c + c * (c + 2 * kv_width) + c * c + 3 * c * s.ffn
        return 2 * v * c + c + s.layers * block
    return v * c + s.seq * c + s.layers * (12 * c * c + 13 * c) + 2 * c


def flops_per_token(s: Shape) -> float:
    """Training FLOPs per token as worker/mfu.h counts them: weight matmuls (6 per parameter)
    plus attention scores and their application (12 x layers x width x context)."""
    return 6.0 * param_count(s) + 12.0 * s.layers * s.dim * s.seq


# ---- Llama ---------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x):
        # Normalised in fp32 whatever the compute dtype, as Weft's kernel does.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


def rope_tables(s: Shape, device=None):
    """cos and sin, (seq, head_dim), for the half-split layout: frequency i drives dims i and
    i + head_dim / 2. Computed in fp32 (angles reach seq radians: bf16 would garble them)."""
    half = s.head_dim // 2
    inv_freq = s.rope_theta ** (-torch.arange(half, device=device, dtype=torch.float32) / half)
    angle = torch.arange(s.seq, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    angle = torch.cat([angle, angle], dim=-1)
    return angle.cos(), angle.sin()


def apply_rope(x, cos, sin):
    """x: (batch, heads, seq, head_dim); rotates (x_i, x_{i+half}) by angle i."""
    lo, hi = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-hi, lo], dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = s.heads, s.kv_heads, s.head_dim
        kv_width = s.kv_heads * s.head_dim
        self.attn_norm = RMSNorm(s.dim)
        # q, k and v in one matmul: [q | k | v] along the output dimension.
        self.wqkv = nn.Linear(s.dim, s.dim + 2 * kv_width, bias=False)
        self.wo = nn.Linear(s.dim, s.dim, bias=False)
        self.mlp_norm = RMSNorm(s.dim)
        self.w_gate_up = nn.Linear(s.dim, 2 * s.ffn, bias=False)  # [gate | up]
        self.w_down = nn.Linear(s.ffn, s.dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        kv_width = self.kv_heads * self.head_dim
        q, k, v = self.wqkv(self.attn_norm(x)).split([c, kv_width, kv_width], dim=-1)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.kv_heads != self.heads)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, c))
        gate, up = self.w_gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.w_down(F.silu(gate) * up)


class Llama(nn.Module):
    tied = False

    def __init__(self, s: Shape):
        super().__init__()
        self.shape = s
        self.checkpoint_blocks = False
        self.embed = nn.Embedding(s.padded_vocab, s.dim)
        self.blocks = nn.ModuleList(LlamaBlock(s) for _ in range(s.layers))
        self.final_norm = RMSNorm(s.dim)
        self.head = nn.Linear(s.dim, s.padded_vocab, bias=False)
        self.reset_buffers()

    def reset_buffers(self, device=None):
        """(Re)computes the rotary tables; needed after to_empty() from the meta device."""
        if device is None:
            device = self.embed.weight.device
            device = None if device.type == "meta" else device
        cos, sin = rope_tables(self.shape, device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        t = tokens.shape[1]
        cos, sin = self.rope_cos[:t].to(x.dtype), self.rope_sin[:t].to(x.dtype)
        for block in self.blocks:
            if self.checkpoint_blocks:
                x = torch.utils.checkpoint.checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin)
        return lm_loss(self.head(self.final_norm(x)), targets)


# ---- GPT-2 ---------------------------------------------------------------------------------

class GPTBlock(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.heads = s.heads
        self.ln1 = nn.LayerNorm(s.dim)
        self.qkv = nn.Linear(s.dim, 3 * s.dim)
        self.proj = nn.Linear(s.dim, s.dim)
        self.ln2 = nn.LayerNorm(s.dim)
        self.up = nn.Linear(s.dim, 4 * s.dim)
        self.down = nn.Linear(4 * s.dim, s.dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    tied = True

    def __init__(self, s: Shape):
        super().__init__()
        self.shape = s
        self.checkpoint_blocks = False
        self.embed = nn.Embedding(s.padded_vocab, s.dim)
        self.pos_embed = nn.Embedding(s.seq, s.dim)
        self.blocks = nn.ModuleList(GPTBlock(s) for _ in range(s.layers))
        self.final_norm = nn.LayerNorm(s.dim)
        self.head = nn.Linear(s.dim, s.padded_vocab, bias=False)
        self.head.weight = self.embed.weight

    def reset_buffers(self, device=None):
        pass

    def forward(self, tokens, targets):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.pos_embed(pos)
        for block in self.blocks:
            if self.checkpoint_blocks:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return lm_loss(self.head(self.final_norm(x)), targets)


def lm_loss(logits, targets):
    # Cross-entropy in fp32: the softmax over 128k classes in bf16 loses the small terms.
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def build(s: Shape) -> nn.Module:
    """The model with uninitialised parameters (build under torch.device("meta") for a large
    one); call init_module on every module, or init_weights, before training."""
    return Llama(s) if s.arch == "llama" else GPT2(s)


def init_module(m: nn.Module, s: Shape):
    """Initialises the parameters m owns directly (not its children's): normal(0, 0.02) for
    matrices and embeddings, residual output projections scaled by 1/sqrt(2 x layers) (GPT-2's
    rule), norms at 1, biases at 0. One module at a time so that a ZeRO-3 model can gather just
    that module's parameters for it."""
    std = 0.02
    with torch.no_grad():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            scaled = getattr(m, "_residual_out", False)
            nn.init.normal_(m.weight, 0.0, std / math.sqrt(2 * s.layers) if scaled else std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (RMSNorm, nn.LayerNorm)):
            nn.init.ones_(m.weight)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


def mark_residual_outputs(model: nn.Module):
    for m in model.modules():
        for name in ("wo", "w_down", "proj", "down"):
            sub = getattr(m, name, None)
            if isinstance(sub, nn.Linear):
                sub._residual_out = True


def init_weights(model: nn.Module):
    mark_residual_outputs(model)
    for m in model.modules():
        init_module(m, model.shape)
    model.reset_buffers()


def count_parameters(model: nn.Module) -> int:
    """Parameters of a built (unsharded or meta) model, shared ones once."""
    return sum(p.numel() for p in model.parameters())


def random_batch(s: Shape, mb: int, device, rank: int):
    """(inputs, targets) of random tokens, one batch a rank reuses every micro-step: the peers
    measure speed, not learning."""
    gen = torch.Generator(device=device)
    gen.manual_seed(1000 + rank)
    tokens = torch.randint(0, s.vocab, (mb, s.seq + 1), device=device, generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def speed_fields(s: Shape, mb: int, accum: int, step_s: float, cuda: bool) -> str:
    """The RESULT line's fields of a measured step time: tokens/s per GPU, step_ms, MFU against
    PEAK_FLOPS and the GPU's peak allocated memory."""
    tok_s_per_gpu = mb * s.seq * accum / step_s
    mfu = tok_s_per_gpu * flops_per_token(s) / PEAK_FLOPS
    maxmem = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    return (f"tok_s_per_gpu={tok_s_per_gpu:.0f} step_ms={step_s * 1e3:.1f} mfu={mfu:.3f} "
            f"maxmem_GiB={maxmem:.2f}")
