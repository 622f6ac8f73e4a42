"""CPU check that peer_fsdp_families.py computes what transformers computes, family by family.

    python bench/peers/check_peer_families.py [--tol 1e-5]

For llama, qwen2, qwen3 (tied and untied) and mistral at a tiny shape (2 layers, dim 64, 4 heads
/ 2 KV heads, SwiGLU 176, vocab 300, T 16; qwen3 with head_dim 32, so that q is 128 wide, not
64; mistral with window 4, so that most queries lose keys to it, and with window 100 at T 512):
builds the peer's model in
float32 on the CPU (no FSDP, no compile), copies its weights into the transformers model of the
family (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, built from a
config, eager attention), and compares the logits of a random batch over the real vocabulary
(the peer's padding rows are never compared). Norm weights and biases are drawn away from 1 and
0 first, so that a norm or a bias in the wrong place shows.

The window runs here as SDPA with a dense mask (--attention sdpa-mask in the peer):
FlexAttention is exact only compiled, and the GPU run compiles it. The dense mask is built from
the same mask_mod as the GPU's BlockMask (window_rule), so the rule checked here is the rule the
GPU runs. Where compiling FlexAttention on the CPU works, the script also compares the flex
path with the dense-mask path (held to the same tolerance; reported as skipped, with the
exception's type, where this machine cannot compile it).

Prints one CHECK line per case and CHECK_ALL ok=1|0; exits 1 if any case is off by more than
--tol (largest absolute logit difference; the logits are O(1)).
"""
import argparse
import sys
import os

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_fsdp_families as peer  # noqa: E402

TINY = dict(layers=2, dim=64, heads=4, kv_heads=2, ffn=176, vocab=300, seq=16,
            rope_theta=10000.0)
CASES = [
    ("llama", dict(head_dim=16)),
    ("qwen2", dict(head_dim=16)),
    ("qwen3", dict(head_dim=32, tied=True)),
    ("qwen3", dict(head_dim=32)),
    ("mistral", dict(head_dim=16, window=4)),
    # Long enough for FlexAttention's 128-token tiles to be skipped whole (queries 384-511
    # against keys 0-127) and cut (a window of 100 ends inside a tile).
    ("mistral", dict(head_dim=16, window=100, seq=512)),
]


def tiny_shape(arch, extra) -> peer.Shape:
    return peer.Shape(arch=arch, eps=peer.DEFAULT_EPS[arch], **{**TINY, **extra})


def hf_model(s: peer.Shape):
    """The transformers model of the family at shape s, float32, eager attention."""
    import transformers as tf
    common = dict(vocab_size=s.vocab, hidden_size=s.dim, intermediate_size=s.ffn,
                  num_hidden_layers=s.layers, num_attention_heads=s.heads,
                  num_key_value_heads=s.kv_heads, max_position_embeddings=s.seq,
                  rms_norm_eps=s.eps, rope_theta=s.rope_theta, tie_word_embeddings=s.tied,
                  attention_dropout=0.0)
    if s.arch == "llama":
        cfg, cls = tf.LlamaConfig(**common, head_dim=s.head_dim, attention_bias=False,
                                  mlp_bias=False), tf.LlamaForCausalLM
    elif s.arch == "qwen2":
        cfg, cls = tf.Qwen2Config(**common, use_sliding_window=False), tf.Qwen2ForCausalLM
    elif s.arch == "qwen3":
        cfg, cls = tf.Qwen3Config(**common, head_dim=s.head_dim, attention_bias=False,
                                  use_sliding_window=False), tf.Qwen3ForCausalLM
    else:
        cfg, cls = tf.MistralConfig(**common, head_dim=s.head_dim,
                                    sliding_window=s.window or None), tf.MistralForCausalLM
    return cls._from_config(cfg, attn_implementation="eager", dtype=torch.float32).eval()


def randomise(model: peer.Model, gen):
    """Weights as a trained model might have them: N(0, 0.02) matrices, norms 1 + N(0, 0.1),
    biases N(0, 0.02)."""
    peer.init_weights(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))


def copy_into_hf(model: peer.Model, hf):
    """Copies the peer's weights into the transformers model, splitting the fused q/k/v and
    gate/up projections and dropping the vocabulary's padding rows. Refuses to leave any
    transformers tensor unset."""
    s = model.shape
    out = {}
    out["model.embed_tokens.weight"] = model.embed.weight[:s.vocab]
    out["model.norm.weight"] = model.final_norm.weight
    if not s.tied:
        out["lm_head.weight"] = model.head.weight[:s.vocab]
    for i, b in enumerate(model.blocks):
        pre = f"model.layers.{i}."
        out[pre + "input_layernorm.weight"] = b.attn_norm.weight
        out[pre + "post_attention_layernorm.weight"] = b.mlp_norm.weight
        sizes = [s.q_width, s.kv_width, s.kv_width]
        for proj, w in zip(("q_proj", "k_proj", "v_proj"), b.wqkv.weight.split(sizes, dim=0)):
            out[pre + f"self_attn.{proj}.weight"] = w
        if b.wqkv.bias is not None:
            for proj, w in zip(("q_proj", "k_proj", "v_proj"), b.wqkv.bias.split(sizes, dim=0)):
                out[pre + f"self_attn.{proj}.bias"] = w
        if s.arch == "qwen3":
            out[pre + "self_attn.q_norm.weight"] = b.q_norm.weight
            out[pre + "self_attn.k_norm.weight"] = b.k_norm.weight
        out[pre + "self_attn.o_proj.weight"] = b.wo.weight
        gate, up = b.w_gate_up.weight.chunk(2, dim=0)
        out[pre + "mlp.gate_proj.weight"] = gate
        out[pre + "mlp.up_proj.weight"] = up
        out[pre + "mlp.down_proj.weight"] = b.w_down.weight
    state = hf.state_dict()
    # A tied lm_head is the embedding itself; every other tensor must come from the peer.
    expected = set(state) - ({"lm_head.weight"} if s.tied else set())
    if set(out) != expected:
        raise SystemExit(f"{s.arch}: names differ: missing {sorted(expected - set(out))}, "
                         f"extra {sorted(set(out) - expected)}")
    for name, w in out.items():
        if state[name].shape != w.shape:
            raise SystemExit(f"{s.arch}: {name} is {tuple(state[name].shape)} in transformers, "
                             f"{tuple(w.shape)} in the peer")
    with torch.no_grad():
        hf.load_state_dict({**state, **{k: v.detach().clone() for k, v in out.items()}})
        if s.tied and hf.lm_head.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr():
            raise SystemExit(f"{s.arch}: transformers did not tie the head")


def flex_vs_mask(model: peer.Model, tokens):
    """Largest logit difference between the compiled FlexAttention path and the dense-mask
    path, or the reason it could not run here."""
    try:
        model.set_attention("flex", torch.device("cpu"))
        with torch.no_grad():
            flex = model.logits(tokens)
        model.set_attention("sdpa-mask", torch.device("cpu"))
        with torch.no_grad():
            dense = model.logits(tokens)
        return f"{(flex - dense).abs().max().item():.2e}"
    except Exception as e:  # compile toolchains vary on CPU machines; the GPU check is the run
        return "skipped(" + type(e).__name__ + ")"
    finally:
        model.set_attention("sdpa-mask", torch.device("cpu"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tol", type=float, default=1e-5)
    p.add_argument("--no-flex", action="store_true", help="skip the compiled FlexAttention comparison")
    a = p.parse_args()
    import transformers
    print(f"torch {torch.__version__} transformers {transformers.__version__}", flush=True)
    ok = True
    for arch, extra in CASES:
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(1)
        s = tiny_shape(arch, extra)
        model = peer.Model(s).float().eval()
        randomise(model, gen)
        model.set_attention("sdpa-mask", torch.device("cpu"))
        counted = sum(q.numel() for q in model.parameters())
        hf = hf_model(s)
        copy_into_hf(model, hf)
        tokens = torch.randint(0, s.vocab, (2, s.seq), generator=gen)
        with torch.no_grad():
            ours = model.logits(tokens)[..., :s.vocab]
            theirs = hf(input_ids=tokens).logits
        diff = (ours - theirs).abs().max().item()
        case_ok = diff <= a.tol and counted == peer.param_count(s)
        ok &= case_ok
        extra_fields = ""
        if s.windowed:
            # The window must matter at this shape, or the check proves nothing about it.
            s_full = tiny_shape(arch, {**extra, "window": 0})
            hf_full = hf_model(s_full)
            hf_full.load_state_dict(hf.state_dict())
            with torch.no_grad():
                no_window = (hf_full(input_ids=tokens).logits - theirs).abs().max().item()
            extra_fields += f" window_effect={no_window:.2e}"
            case_ok_window = no_window > 100 * a.tol
            ok &= case_ok_window
            case_ok &= case_ok_window
            if not a.no_flex:
                flex = flex_vs_mask(model, tokens)
                extra_fields += f" flex_vs_mask={flex}"
                if not flex.startswith("skipped") and float(flex) > a.tol:
                    ok = case_ok = False
        print(f"CHECK arch={arch} tied={s.tied} head_dim={s.head_dim} q_width={s.q_width} "
              f"window={s.window} attention={model.attention.kind} params={counted} "
              f"params_counted={peer.param_count(s)} max_abs_logit_diff={diff:.2e} "
              f"max_abs_logit={theirs.abs().max().item():.2f}{extra_fields} ok={int(case_ok)}",
              flush=True)
    print(f"CHECK_ALL ok={int(ok)}", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
