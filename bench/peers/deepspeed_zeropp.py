"""Peer benchmark: DeepSpeed ZeRO-3, with or without ZeRO++, on the models of peer_models.py.

  torchrun --nnodes H --nproc_per_node G ... bench/peers/deepspeed_zeropp.py [--hpz] [--qw]
      [--qg] [--accum N] [--mb 8] [--ac] [--compile] [--steps S] [--warmup W] [--hosts H]
      [--optimizer auto|fused|torch] [--reduce-bucket E] [--prefetch-bucket E]
      [shape flags: peer_models.add_shape_args]
  (bench/peers/sim_peers.sh runs it across the simulated hosts of bench/sim_cluster.sh;
  deepspeed must be importable: bench/peers/install_deepspeed.sh.)

ZeRO++ (each flag one of its three parts):
  --hpz  zero_hpz_partition_size = GPUs per host: a second, host-local copy of each
         parameter shard, so backward's all-gathers stay inside the host (costs memory).
         With one GPU per host it is a no-op and is dropped.
  --qw   zero_quantized_weights: forward all-gathers move int8 weights.
  --qg   zero_quantized_gradients: gradients reduced as int4 through two all-to-alls (inside
         the host, then across hosts) instead of a reduce-scatter. DeepSpeed takes the GPUs per
         host from torch.cuda.device_count(), so each host's processes must see just its own
         GPUs (CUDA_VISIBLE_DEVICES, as sim_peers.sh sets), and it needs two hosts at least:
         on one host it is dropped.
The quantizer and FusedAdam are CUDA ops DeepSpeed compiles just in time (nvcc, ninja): into
TORCH_EXTENSIONS_DIR (default /tmp/weft-torch-extensions, shared by the ranks and the runs of
one machine) for TORCH_CUDA_ARCH_LIST (default 9.0, Hopper), so only the first run of a machine
builds them (install_deepspeed.sh --build-ops builds them beforehand). --optimizer auto uses
DeepSpeed's FusedAdam when it builds, else torch's fused AdamW; the RESULT line says which.

The rest of the configuration: bf16 parameters and compute with fp32 master weights and
optimizer state (DeepSpeed's bf16 mode), AdamW lr 3e-4, betas (0.9, 0.95), weight decay 0.1,
gradient clipping 1.0, like the bench's Weft job; overlap_comm and contiguous_gradients on;
reduce_bucket_size 2 blocks' parameters (large enough for full-bandwidth reductions, small
enough to overlap backward), stage3_prefetch_bucket_size 1 block (the next block is gathered
while this one computes), stage3_param_persistence_threshold 1e5 (norm weights stay gathered);
--reduce-bucket / --prefetch-bucket override (elements). Parameters are created partitioned
(deepspeed.zero.Init) and initialised one module at a time, so a model larger than a GPU works.
Gradient accumulation: ZeRO-3 reduces gradients on every micro-step (DeepSpeed has no no-sync
mode for stage 3), which ZeRO++'s qg makes cheaper; accumulation is --accum micro-steps per
optimizer step.

Prints on rank 0, tokens/s counted over --steps optimizer steps after --warmup ones:
  RESULT peer=deepspeed_zero3 zeropp=hpz+qw+qg|...|none hosts=H gpus_per_host=G accum=N
    tok_s_per_gpu=T step_ms=S mfu=F maxmem_GiB=X loss=L optimizer=fused_adam|torch_adamw
    [dropped=hpz,qg] arch=A params=P mb=B seq=T compile=0|1 ac=0|1
MFU: peer_models.flops_per_token (Weft's worker/mfu.h accounting) over a 989 TFLOP/s peak.
"""
import argparse
import os
import sys
import time

# Before deepspeed is imported: where and for which GPU its JIT ops are built.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", "/tmp/weft-torch-extensions")
# DeepSpeed parses each entry as numbers: "9.0a" (the GPU machine's environment may set it)
# fails its op builder, so the arch-specific suffix goes.
os.environ["TORCH_CUDA_ARCH_LIST"] = os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0").replace("a", "")
os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_models  # noqa: E402


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    peer_models.add_shape_args(p)
    p.add_argument("--hosts", type=int, default=0, help="default: WORLD_SIZE / LOCAL_WORLD_SIZE")
    p.add_argument("--mb", type=int, default=8, help="micro-batch per GPU")
    p.add_argument("--accum", type=int, default=1, help="micro-steps per optimizer step")
    p.add_argument("--steps", type=int, default=6, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=2, help="optimizer steps before timing")
    p.add_argument("--hpz", action="store_true", help="ZeRO++ hierarchical partitioning")
    p.add_argument("--qw", action="store_true", help="ZeRO++ quantized weights")
    p.add_argument("--qg", action="store_true", help="ZeRO++ quantized gradients")
    p.add_argument("--optimizer", default="auto", choices=["auto", "fused", "torch"])
    p.add_argument("--reduce-bucket", type=int, default=0, help="elements (default: 2 blocks)")
    p.add_argument("--prefetch-bucket", type=int, default=0, help="elements (default: 1 block)")
    p.add_argument("--clip", type=float, default=1.0, help="gradient norm clip (0: none)")
    p.add_argument("--compile", action="store_true", help="DeepSpeed's engine.compile()")
    p.add_argument("--ac", action="store_true", help="activation checkpointing per block")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: DeepSpeed's CPU accelerator over gloo, for testing the script "
                        "without GPUs (no --qw/--qg: their kernels are CUDA's)")
    return p.parse_args()


def block_numel(s):
    c = s.dim
    if s.arch == "llama":
        return 2 * c + c * (c + 2 * s.kv_heads * s.head_dim) + c * c + 3 * c * s.ffn
    return 12 * c * c + 13 * c


def fused_adam_builds():
    """Whether DeepSpeed's FusedAdam op builds (or is built) here; the error when not."""
    from deepspeed.ops.op_builder import FusedAdamBuilder
    try:
        FusedAdamBuilder().load(verbose=False)
        return True, ""
    except Exception as e:  # a compiler error, a missing nvcc: fall back, and say so
        return False, str(e).splitlines()[0] if str(e) else type(e).__name__


def main():
    a = parse()
    shape = peer_models.shape_from_args(a)
    cuda = a.device == "cuda"
    if not cuda:
        os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if cuda:
        torch.cuda.set_device(local_rank)
        torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    hosts = a.hosts or world // local_world
    if world % hosts:
        raise SystemExit(f"world {world} does not split into {hosts} hosts")
    per_host = world // hosts

    dropped = []
    hpz, qg = a.hpz, a.qg
    if hpz and per_host == 1:
        hpz = False
        dropped.append("hpz")
    if qg and hosts == 1:
        qg = False
        dropped.append("qg")
    if qg and cuda and torch.cuda.device_count() != per_host:
        raise SystemExit(f"--qg: this process sees {torch.cuda.device_count()} GPUs, but a host "
                         f"has {per_host}: DeepSpeed would group the wrong ranks (set "
                         "CUDA_VISIBLE_DEVICES to the host's GPUs)")
    zeropp = "+".join(n for n, on in (("hpz", hpz), ("qw", a.qw), ("qg", qg)) if on) or "none"

    if a.optimizer == "torch" or not cuda:
        fused, why = False, "asked for"
    else:
        # Every rank loads the op (the first builds it under a file lock, the rest wait).
        fused, why = fused_adam_builds()
        if not fused and a.optimizer == "fused":
            raise SystemExit(f"FusedAdam does not build: {why}")
        if not fused and rank == 0:
            print(f"deepspeed_zeropp: FusedAdam unavailable ({why}); torch's fused AdamW instead",
                  flush=True)
    adam = {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
    if not fused:
        adam.update(torch_adam=True, fused=cuda)

    block = block_numel(shape)
    config = {
        "train_micro_batch_size_per_gpu": a.mb,
        "gradient_accumulation_steps": a.accum,
        "train_batch_size": a.mb * a.accum * world,
        "bf16": {"enabled": True},
        "gradient_clipping": a.clip,
        "optimizer": {"type": "AdamW", "params": adam},
        "zero_optimization": {
            "stage": 3,
            "overlap_comm": True,
            "contiguous_gradients": True,
            "reduce_bucket_size": a.reduce_bucket or 2 * block,
            "stage3_prefetch_bucket_size": a.prefetch_bucket or block,
            "stage3_param_persistence_threshold": 100_000,
            "zero_hpz_partition_size": per_host if hpz else 1,
            "zero_quantized_weights": a.qw,
            "zero_quantized_gradients": qg,
        },
        "steps_per_print": 1 << 30,  # no DeepSpeed progress lines
        "wall_clock_breakdown": False,
    }

    with deepspeed.zero.Init(config_dict_or_path=config):
        model = peer_models.build(shape)
    nparams = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    if nparams != peer_models.param_count(shape):  # the MFU would not be Weft's
        raise SystemExit(f"model has {nparams} parameters, Weft's count is "
                         f"{peer_models.param_count(shape)}")
    # Initialised module by module: gathers one module's parameters at a time, rank 0's
    # values kept.
    torch.manual_seed(1234)
    peer_models.mark_residual_outputs(model)
    for m in model.modules():
        own = list(m.parameters(recurse=False))
        if own:
            with deepspeed.zero.GatheredParameters(own, modifier_rank=0):
                peer_models.init_module(m, shape)
    model.reset_buffers(dev)
    model.checkpoint_blocks = a.ac

    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    if a.compile:
        engine.compile()

    x, y = peer_models.random_batch(shape, a.mb, dev, rank)

    loss_sum = torch.zeros((), device=dev)
    t0 = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
        loss_sum.zero_()
        for _ in range(a.accum):
            loss = engine(x, y)
            engine.backward(loss)  # scaled by 1 / accum inside
            engine.step()  # the optimizer runs on the last micro-step of each step only
            loss_sum += loss.detach() / a.accum
    if cuda:
        torch.cuda.synchronize()
    step_s = (time.perf_counter() - t0) / max(a.steps, 1)
    speed = peer_models.speed_fields(shape, a.mb, a.accum, step_s, cuda)
    if rank == 0:
        print(f"RESULT peer=deepspeed_zero3 zeropp={zeropp} hosts={hosts} gpus_per_host={per_host} "
              f"accum={a.accum} {speed} loss={loss_sum.item():.3f} "
              f"optimizer={'fused_adam' if fused else 'torch_adamw'} "
              + (f"dropped={','.join(dropped)} " if dropped else "")
              + f"arch={shape.arch} params={nparams} mb={a.mb} seq={shape.seq} "
              f"compile={int(a.compile)} ac={int(a.ac)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
