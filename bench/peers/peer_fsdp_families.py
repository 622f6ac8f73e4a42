"""Single-host PyTorch peer for the Llama, Qwen2, Qwen3 and Mistral families: FSDP2 (ZeRO-3
equivalent) with bf16 mixed precision, optionally torch.compile and per-block activation
checkpointing, and with --float8 torchao's float8 training, on one host of N GPUs.

    torchrun --standalone --nproc_per_node=N bench/peers/peer_fsdp_families.py \\
        --arch llama|qwen2|qwen3|mistral [--compile | --compile-blocks] [--ac] [--offload] \\
        [--float8] [--mb 2] \\
        [--layers 36 --dim 4096 --heads 32 --kv-heads 8 --head-dim 128 --ffn 12288 \\
         --vocab 151936 --seq 4096 --rope-theta 1e6 --window 0 --tied] [--steps 30 --warmup 10]

It measures the way ../shared/bench/peer_fsdp_gpt.py does (bench/peer_rows.sh reads both):
fp32 parameters, MixedPrecisionPolicy(param_dtype bf16, reduce_dtype fp32), fully_shard on
every block and then on the root, AdamW (fused unless offloaded), one random batch per rank
reused every step, `--warmup` untimed steps and then `--steps` timed ones between two
synchronisations; rank 0 prints one line

    RESULT arch=A mode=fsdp compile=.. world=N params=..M mb=.. seq=.. ac=.. offload=..
      step_ms=.. tok_s=.. tok_s_per_gpu=.. mfu_vs_989=..% maxmem_GiB=.. loss=..
      head_dim=.. window=.. attention=causal|flex|sdpa-mask float8=on|off

The model math is what transformers 4.57 computes for each family (check_peer_families.py
compares the logits on the CPU):

  llama:   token embedding; blocks of [RMSNorm, grouped-query attention with rotary positions
           (each head's two halves rotated against each other), RMSNorm, SwiGLU MLP]; final
           RMSNorm; LM head (untied unless --tied). No biases. RMSNorm eps 1e-5.
  qwen2:   llama plus biases on the q, k and v projections (none on o). eps 1e-6.
  qwen3:   llama (no biases) plus an RMSNorm over each query head and each key head (weight of
           size head_dim, the model's eps, 1e-6) before the rotation. The head size is its own
           (--head-dim): q is heads x head_dim wide and o maps that back to dim.
  mistral: llama with sliding-window attention (--window w): query i sees key j iff
           i - w < j <= i (w keys, itself included). eps 1e-5.

Attention: SDPA with is_causal (the flash kernel) when every query sees all earlier keys;
FlexAttention (compiled) with a sliding-window BlockMask, whose fully masked tiles it skips,
when the window is shorter than the sequence. Where FlexAttention is missing, or with
--attention sdpa-mask (the CPU check: FlexAttention needs compiling to be exact and fast),
SDPA with the same rule as a dense boolean mask, which is correct but not fast; the RESULT
line's attention= field says which ran.

The model is built on the meta device, sharded, then materialised and initialised shard by
shard, so that no rank ever holds the whole fp32 model and max_memory_allocated is training's
peak (an 8B fp32 model built whole would itself be a 32 GiB peak).

--float8 is the public FP8 baseline for Weft's FP8 engine: torchao's float8 training as
torchtitan runs it, on the same model, shapes and command line as the bf16 run. Before
fully_shard, convert_to_float8_training swaps the four matmuls of every block (wqkv, wo,
w_gate_up, w_down) for Float8Linear; the embedding, the norms and the LM head stay bf16, so
that FP8 covers the layers it covers in Weft's FP8 path (its blocks' Linear layers) and in
torchtitan's (which leaves the output layer out). A block Linear with a dimension that is not
a multiple of 16 (what torch._scaled_mm takes) stays bf16 and is named on stderr; none of the
benchmark shapes has one, so no padding (pad_inner_dim) is needed. The recipe is tensorwise
dynamic scaling (E4M3 inputs and weights, E5M2 output gradients, one scale per tensor from
its current amax, fast accumulation in the forward GEMM only), with the weights cast to FP8
before FSDP's all-gather (enable_fsdp_float8_all_gather) and their scales computed after each
optimizer step in one all-reduce for the whole model (precompute_float8_dynamic_scale_for_fsdp),
which the timed step includes. It composes with
--compile (which it needs to be fast: compiling fuses the amax and cast kernels) and --ac; it
is refused with --offload and where there is no GPU of compute capability 8.9 or newer.
--compile compiles the whole model; --compile-blocks compiles each block on its own before
FSDP wraps it, as torchtitan does, which keeps FSDP's hooks out of the compiled graphs (on
4 x H200 at Llama-8B's shape, float8 ran at 5,441 tok/s/GPU with --compile: slower than bf16).
torchao is not part of the GPU machine's torch install: its wheel is carried
(.device/wheels/) and bench/peers/install_torchao.sh installs it into a folder of its own for
PYTHONPATH.

FLOPs and MFU: as Weft counts them (worker/mfu.h, common/job_spec.cc ModelParameterCount),
6 x parameters + 12 x layers x attention width x context per token, against 989 TFLOP/s.
The parameters are counted with the padded vocabulary (Weft pads it to a multiple of 128 rows,
and so does this model), biases and q/k norms included. The attention width is heads x
head_dim (Weft's hidden_size; the two agree for every benchmark shape). A sliding window is
counted as full causal attention over the whole context, as Weft counts it, so the MFUs of
the two compare; the work a window skips makes both look faster, not more efficient. --float8
keeps both the count and the bf16 peak, so its MFU is a speed against the bf16 run's, not a
utilisation of the FP8 peak.
"""
import argparse
import dataclasses
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

# Dense bf16 peak of one H100/H200 SXM, the figure Weft's MFU divides by.
PEAK_FLOPS = 989e12

ARCHS = ("llama", "qwen2", "qwen3", "mistral")
# RMSNorm epsilon of each family's released checkpoints.
DEFAULT_EPS = {"llama": 1e-5, "qwen2": 1e-6, "qwen3": 1e-6, "mistral": 1e-5}


@dataclasses.dataclass
class Shape:
    arch: str = "llama"
    layers: int = 16
    dim: int = 2048
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 64
    ffn: int = 8192
    vocab: int = 128256
    seq: int = 2048
    rope_theta: float = 500000.0
    window: int = 0
    tied: bool = False
    eps: float = 1e-5

    @property
    def padded_vocab(self):
        return (self.vocab + 127) // 128 * 128

    @property
    def q_width(self):
        return self.heads * self.head_dim

    @property
    def kv_width(self):
        return self.kv_heads * self.head_dim

    @property
    def windowed(self):
        """Whether the window hides any key from any query (a window of seq or more does not)."""
        return 0 < self.window < self.seq


def add_shape_args(p: argparse.ArgumentParser):
    """The model flags, named as peer_fsdp_gpt.py names them; defaults are the Llama-1B-like
    benchmark shape (Weft's llama default)."""
    p.add_argument("--arch", default="llama", choices=ARCHS)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=0, help="key/value heads (default: --heads)")
    p.add_argument("--head-dim", type=int, default=0,
                   help="size of one head (default: dim / heads; Qwen3 sets its own)")
    p.add_argument("--ffn", type=int, default=0,
                   help="SwiGLU hidden size (default: 8/3 * dim rounded up to 256)")
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--rope-theta", type=float, default=500000.0)
    p.add_argument("--window", type=int, default=0,
                   help="mistral: sliding window w, query i sees keys i-w+1..i (0: none)")
    p.add_argument("--tied", action="store_true", help="LM head tied to the token embedding")
    p.add_argument("--eps", type=float, default=0.0,
                   help="RMSNorm epsilon (default: the family's, 1e-5 llama/mistral, 1e-6 qwen)")


def shape_from_args(a) -> Shape:
    s = Shape(arch=a.arch, layers=a.layers, dim=a.dim, heads=a.heads,
              kv_heads=a.kv_heads or a.heads, head_dim=a.head_dim or a.dim // a.heads,
              ffn=a.ffn or 256 * ((8 * a.dim // 3 + 255) // 256), vocab=a.vocab, seq=a.seq,
              rope_theta=a.rope_theta, window=a.window, tied=a.tied,
              eps=a.eps or DEFAULT_EPS[a.arch])
    if s.heads % s.kv_heads or s.head_dim % 2:
        raise SystemExit(f"bad shape {s}: heads % kv_heads and head_dim % 2 must be 0")
    if s.window and s.arch != "mistral":
        # transformers' Qwen2/Qwen3 windows depend on max_window_layers and layer_types, which
        # this peer does not model; their benchmark shapes have none.
        raise SystemExit(f"--window is for --arch mistral, not {s.arch}")
    if s.window < 0:
        raise SystemExit("--window must be >= 0")
    return s


def param_count(s: Shape) -> int:
    """Parameters of the model, padded vocabulary rows included (Weft's count)."""
    c, v = s.dim, s.padded_vocab
    block = (2 * c                                   # attention and MLP RMSNorms
             + c * (s.q_width + 2 * s.kv_width)      # q, k, v
             + s.q_width * c                         # o
             + 3 * c * s.ffn)                        # gate, up, down
    if s.arch == "qwen2":
        block += s.q_width + 2 * s.kv_width          # q, k, v biases
    if s.arch == "qwen3":
        block += 2 * s.head_dim                      # q_norm, k_norm
    return v * c * (1 if s.tied else 2) + c + s.layers * block


def flops_per_token(s: Shape) -> float:
    """Training FLOPs per token as worker/mfu.h counts them; a window counts as full causal
    attention over the whole context (see the module docstring)."""
    return 6.0 * param_count(s) + 12.0 * s.layers * s.q_width * s.seq


# ---- layers --------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # Normalised in fp32 whatever the compute dtype, as transformers and Weft do.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


def rope_tables(s: Shape, device=None):
    """cos and sin, (seq, head_dim), half-split layout: frequency i turns dims i and
    i + head_dim / 2. fp32: angles reach seq radians, which bf16 would garble."""
    inv_freq = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, device=device,
                                                    dtype=torch.float32) / s.head_dim))
    angle = torch.arange(s.seq, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    angle = torch.cat([angle, angle], dim=-1)
    return angle.cos(), angle.sin()


def apply_rope(x, cos, sin):
    """x: (batch, heads, seq, head_dim)."""
    lo, hi = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-hi, lo], dim=-1) * sin


def window_rule(w):
    """The sliding-window mask_mod: True where query q may see key k. One function for the
    BlockMask and the dense mask, so the two paths cannot disagree on the rule."""
    def mask_mod(b, h, q, k):
        return (k <= q) & (q - k < w)
    return mask_mod


_compiled_flex = None


def flex_attention_fn():
    """FlexAttention compiled once (uncompiled it materialises the scores and is slow); None
    where this torch has none."""
    global _compiled_flex
    if _compiled_flex is None:
        try:
            from torch.nn.attention.flex_attention import flex_attention
        except ImportError:
            return None
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


class Attention:
    """How a block attends: 'causal' (SDPA is_causal), 'flex' (`fn`, compiled FlexAttention,
    with `mask`, a BlockMask) or 'sdpa-mask' (SDPA with `mask`, a (seq, seq) boolean tensor)."""

    def __init__(self, kind, mask=None, fn=None):
        self.kind, self.mask, self.fn = kind, mask, fn


def build_attention(s: Shape, requested: str, device) -> Attention:
    """requested: 'auto' (the fastest correct path), 'flex' or 'sdpa-mask'."""
    if not s.windowed:
        return Attention("causal")
    rule = window_rule(s.window)
    if requested in ("auto", "flex"):
        flex = flex_attention_fn()
        if flex is not None:
            from torch.nn.attention.flex_attention import create_block_mask
            # Built compiled so that a long context never materialises seq x seq booleans.
            mask = create_block_mask(rule, None, None, s.seq, s.seq, device=device,
                                     _compile=torch.device(device).type == "cuda")
            return Attention("flex", mask, flex)
        if requested == "flex":
            raise SystemExit("--attention flex: this torch has no torch.nn.attention.flex_attention")
        print("peer_fsdp_families: torch.nn.attention.flex_attention is missing; the sliding "
              "window runs as SDPA with a dense mask (correct, much slower: not a fair peer)",
              file=sys.stderr, flush=True)
    i = torch.arange(s.seq, device=device)
    return Attention("sdpa-mask", rule(None, None, i[:, None], i[None, :]))


class Block(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.arch, self.heads, self.kv_heads, self.head_dim = s.arch, s.heads, s.kv_heads, s.head_dim
        self.attn_norm = RMSNorm(s.dim, s.eps)
        # q, k and v in one matmul, [q | k | v] along the output dimension: one launch and a
        # wider GEMM, as a tuned PyTorch model writes it.
        self.wqkv = nn.Linear(s.dim, s.q_width + 2 * s.kv_width, bias=s.arch == "qwen2")
        if s.arch == "qwen3":
            self.q_norm = RMSNorm(s.head_dim, s.eps)
            self.k_norm = RMSNorm(s.head_dim, s.eps)
        self.wo = nn.Linear(s.q_width, s.dim, bias=False)
        self.mlp_norm = RMSNorm(s.dim, s.eps)
        self.w_gate_up = nn.Linear(s.dim, 2 * s.ffn, bias=False)  # [gate | up]
        self.w_down = nn.Linear(s.ffn, s.dim, bias=False)
        # Set by Model.set_attention. An attribute, not an argument: FSDP's input casting and
        # checkpoint's tracing under torch.compile then only ever see tensors.
        self.attention = Attention("causal")

    def forward(self, x, cos, sin):
        attention = self.attention
        b, t, _ = x.shape
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q, k, v = self.wqkv(self.attn_norm(x)).split([q_width, kv_width, kv_width], dim=-1)
        q = q.view(b, t, self.heads, self.head_dim)
        k = k.view(b, t, self.kv_heads, self.head_dim)
        if self.arch == "qwen3":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        gqa = self.kv_heads != self.heads
        if attention.kind == "flex":
            y = attention.fn(q, k, v, block_mask=attention.mask, enable_gqa=gqa)
        elif attention.kind == "sdpa-mask":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attention.mask[:t, :t],
                                               enable_gqa=gqa)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, q_width))
        gate, up = self.w_gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.w_down(F.silu(gate) * up)


class Model(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.shape = s
        self.checkpoint_blocks = False
        self.attention = Attention("causal")
        self.embed = nn.Embedding(s.padded_vocab, s.dim)
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.final_norm = RMSNorm(s.dim, s.eps)
        self.head = nn.Linear(s.dim, s.padded_vocab, bias=False)
        if s.tied:
            self.head.weight = self.embed.weight
        self.reset_buffers()

    def reset_buffers(self, device=None):
        """(Re)computes the rotary tables: after to_empty() from the meta device they hold
        garbage."""
        if device is None:
            device = self.embed.weight.device
            device = None if device.type == "meta" else device
        cos, sin = rope_tables(self.shape, device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def set_attention(self, requested="auto", device=None):
        self.attention = build_attention(self.shape, requested, device or self.rope_cos.device)
        for block in self.blocks:
            # A block compiled on its own (--compile-blocks) is a wrapper: the attribute goes to
            # the module its forward runs.
            getattr(block, "_orig_mod", block).attention = self.attention

    def hidden(self, tokens):
        x = self.embed(tokens)
        t = tokens.shape[1]
        cos, sin = self.rope_cos[:t].to(x.dtype), self.rope_sin[:t].to(x.dtype)
        for block in self.blocks:
            if self.checkpoint_blocks:
                x = torch.utils.checkpoint.checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin)
        return self.final_norm(x)

    def logits(self, tokens):
        return self.head(self.hidden(tokens))

    def forward(self, tokens, targets):
        logits = self.head(self.hidden(tokens))
        # Cross-entropy in fp32: a softmax over 150k classes in bf16 loses the small terms.
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def init_weights(model: Model, std=0.02):
    """normal(0, std) matrices and embeddings, unit norms, zero biases. Works on sharded
    (DTensor) parameters shard by shard: each rank draws its own shard, which is all a speed
    measurement needs and never gathers a whole matrix."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if name.endswith("norm.weight"):
                local.fill_(1.0)
            elif name.endswith(".bias"):
                local.zero_()
            else:
                local.normal_(0.0, std)


# ---- float8 (torchao) ----------------------------------------------------------------------

# The Linear layers of a block that --float8 converts, by attribute name (Block.__init__).
FLOAT8_LINEARS = ("wqkv", "wo", "w_gate_up", "w_down")


def float8_filter(module: nn.Module, fqn: str) -> bool:
    """convert_to_float8_training's module_filter_fn: True for a block matmul (blocks.<i>.<name>,
    name in FLOAT8_LINEARS) whose two dimensions are multiples of 16. Named rather than
    "every Linear but the head", so that a layer added to the model later stays bf16 until
    someone decides otherwise."""
    parts = fqn.split(".")
    if len(parts) != 3 or parts[0] != "blocks" or parts[2] not in FLOAT8_LINEARS:
        return False
    out_features, in_features = module.weight.shape
    return out_features % 16 == 0 and in_features % 16 == 0


def float8_config(emulate=False):
    """torchao's tensorwise recipe with FP8 all-gather. emulate (torchao's emulated matmul, no
    torch._scaled_mm) is for checking the conversion on a CPU, never for a measurement."""
    from torchao.float8 import Float8LinearConfig
    return dataclasses.replace(Float8LinearConfig.from_recipe_name("tensorwise"),
                               enable_fsdp_float8_all_gather=True, emulate=emulate)


def convert_float8(model: Model, emulate=False):
    """Swaps the blocks' Linear layers for torchao's Float8Linear in place; works on the meta
    device and must come before fully_shard (FSDP then shards the FP8-aware weights). Returns
    (converted, kept): the names of the block Linears converted and of those left bf16."""
    from torchao.float8 import convert_to_float8_training
    block_linears = [name for name, m in model.named_modules()
                     if isinstance(m, nn.Linear) and name.startswith("blocks.")]
    convert_to_float8_training(model, config=float8_config(emulate), module_filter_fn=float8_filter)
    # Float8Linear is not among torchao's public names; its type name is.
    converted = [name for name, m in model.named_modules() if type(m).__name__ == "Float8Linear"]
    return converted, [name for name in block_linears if name not in converted]


def float8_preflight(a):
    """Refuses --float8 where it cannot run, before any process group exists, with the reason."""
    if a.offload:
        # The per-step scale precompute reads the shards where they live, host memory under
        # --offload, and all-reduces their amaxes over NCCL, which takes GPU tensors only.
        raise SystemExit("--float8 with --offload is not supported: the FP8 weight scales are "
                         "computed from the shards in place, which --offload keeps in host memory")
    if not torch.cuda.is_available():
        raise SystemExit("--float8 needs a CUDA GPU of compute capability 8.9 or newer "
                         "(torch._scaled_mm); this machine has no CUDA device")
    cap = torch.cuda.get_device_capability(int(os.environ.get("LOCAL_RANK", 0)))
    if cap < (8, 9):
        raise SystemExit(f"--float8 needs compute capability 8.9 or newer (torch._scaled_mm); "
                         f"this GPU has {cap[0]}.{cap[1]}")
    try:
        import torchao.float8  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"--float8 needs torchao ({e}): install the carried wheel with "
                         "bench/peers/install_torchao.sh WHEEL_DIR TARGET and put the folder it "
                         "prints on PYTHONPATH")


# ---- training measurement ------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_args(p)
    p.add_argument("--mode", default="fsdp", choices=["fsdp"],
                   help="accepted for peer_fsdp_gpt.py's command lines; FSDP2 is the only mode")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--compile-blocks", action="store_true",
                   help="compile each block on its own before sharding (torchtitan's way) "
                        "instead of the whole model")
    p.add_argument("--ac", action="store_true", help="activation checkpointing per block")
    p.add_argument("--offload", action="store_true",
                   help="parameters, gradients and optimizer state in host memory (CPUOffloadPolicy)")
    p.add_argument("--float8", action="store_true",
                   help="torchao float8 training (tensorwise, FP8 all-gather) for the blocks' "
                        "Linear layers; needs torchao (install_torchao.sh) and an sm_89+ GPU")
    p.add_argument("--mb", type=int, default=8, help="micro-batch per GPU")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--attention", default="auto", choices=["auto", "flex", "sdpa-mask"],
                   help="window attention path (auto: FlexAttention where available)")
    a = p.parse_args()
    s = shape_from_args(a)
    if a.float8:
        float8_preflight(a)

    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dev = torch.device("cuda")
    torch.manual_seed(rank)
    torch.backends.cuda.matmul.allow_tf32 = True

    with torch.device("meta"):
        model = Model(s)
    nparams = sum(q.numel() for q in model.parameters())
    if nparams != param_count(s):
        raise SystemExit(f"internal: built {nparams} parameters, counted {param_count(s)}")
    if a.float8:
        converted, kept = convert_float8(model)
        if not converted:
            raise SystemExit(f"--float8: no block Linear of shape {s} has dimensions that are "
                             "multiples of 16; nothing would run in FP8")
        if rank == 0:
            import torchao
            print(f"peer_fsdp_families: float8 (torchao {torchao.__version__}, tensorwise, FP8 "
                  f"all-gather) on {len(converted)} block Linears"
                  + (f"; left bf16 (a dimension not a multiple of 16): {', '.join(kept)}"
                     if kept else ""), file=sys.stderr, flush=True)
    if a.compile_blocks:
        # Each block compiled apart, before FSDP wraps it, so that FSDP's hooks stay outside the
        # compiled graphs and every block's casts and norms fuse within it (torchtitan's order).
        for i, block in enumerate(model.blocks):
            model.blocks[i] = torch.compile(block)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    off = CPUOffloadPolicy() if a.offload else OffloadPolicy()
    for block in model.blocks:
        fully_shard(block, mp_policy=mp, offload_policy=off)
    fully_shard(model, mp_policy=mp, offload_policy=off)
    # Offloaded shards live in host memory; the rotary tables and the mask stay on the GPU.
    model.to_empty(device="cpu" if a.offload else dev)
    init_weights(model)
    model.reset_buffers(dev)
    model.set_attention(a.attention, dev)
    model.checkpoint_blocks = a.ac
    step_model = torch.compile(model) if a.compile and not a.compile_blocks else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=not a.offload)
    if a.float8:
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    gen = torch.Generator(device=dev)
    gen.manual_seed(rank)
    x = torch.randint(0, s.vocab, (a.mb, s.seq), device=dev, generator=gen)
    y = torch.randint(0, s.vocab, (a.mb, s.seq), device=dev, generator=gen)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            torch.cuda.synchronize()
            t0 = time.time()
        loss = step_model(x, y)
        loss.backward()
        opt.step()
        if a.float8:
            # The next all-gather's FP8 weight scales, from the updated weights in one all-reduce.
            precompute_float8_dynamic_scale_for_fsdp(model)
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    dt = (time.time() - t0) / a.steps
    tok = a.mb * s.seq * world / dt
    mfu = tok * flops_per_token(s) / (world * PEAK_FLOPS)
    mem = torch.cuda.max_memory_allocated() / 2**30
    if rank == 0:
        compiled = "blocks" if a.compile_blocks else a.compile
        print(f"RESULT arch={s.arch} mode=fsdp compile={compiled} world={world} "
              f"params={nparams / 1e6:.1f}M mb={a.mb} seq={s.seq} ac={a.ac} offload={a.offload} "
              f"step_ms={dt * 1e3:.1f} tok_s={tok:,.0f} tok_s_per_gpu={tok / world:,.0f} "
              f"mfu_vs_989={mfu * 100:.1f}% maxmem_GiB={mem:.1f} loss={loss.item():.3f} "
              f"head_dim={s.head_dim} window={s.window} attention={model.attention.kind} "
              f"float8={'on' if a.float8 else 'off'}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
