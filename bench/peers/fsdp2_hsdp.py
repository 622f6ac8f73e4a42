"""Peer benchmark: PyTorch FSDP2 with hybrid sharding (HSDP) across hosts.

  torchrun --nnodes H --nproc_per_node G ... bench/peers/fsdp2_hsdp.py [--mesh hsdp|full]
      [--accum N] [--mb 8] [--compile] [--ac] [--reduce-dtype fp32|bf16] [--steps S]
      [--warmup W] [--hosts H] [--device cuda|cpu] [shape flags: peer_models.add_shape_args]
  (bench/peers/sim_peers.sh runs it across the simulated hosts of bench/sim_cluster.sh.)

The mesh: --mesh hsdp (default) is a 2-D device mesh (hosts, gpus_per_host) named
("replicate", "shard"): every parameter is sharded over the GPUs of a host and replicated
across hosts, so parameter all-gathers and gradient reduce-scatters stay inside a host (NVLink)
and only the gradient all-reduce of each shard crosses the network. --mesh full is one flat
mesh over all ranks (ZeRO-3 across hosts). Hosts = --hosts, else WORLD_SIZE / LOCAL_WORLD_SIZE
(torchrun's --nnodes).

Sharding units: the embedding, each block, and the final norm with the head, then the root;
the last group is not resharded after forward since backward needs it at once. Parameters in
bf16 for compute, fp32 sharded master copy, gradients reduced in --reduce-dtype (fp32 default).

Gradient accumulation: the fair configuration for FSDP2. Micro-steps before the last run with
set_requires_gradient_sync(False), so gradients accumulate unsharded on each GPU and the
reduce-scatter / cross-host all-reduce happen once per optimizer step, as a step of Weft's
with grad_accum_steps does. (Parameters are still all-gathered within the host each
micro-step.) Gradients are clipped to norm 1.0 (--clip), AdamW (fused on GPU), lr 3e-4,
betas (0.9, 0.95), weight decay 0.1, like the bench's Weft job.

--compile compiles each block (torch.compile per block, the usual pairing with FSDP2); --ac
recomputes each block's activations in backward. Data are random tokens, fixed per rank:
throughput only.

Prints on rank 0, with tokens/s counted over --steps optimizer steps after --warmup ones:
  RESULT peer=fsdp2_hsdp mesh=M hosts=H gpus_per_host=G accum=N tok_s_per_gpu=T step_ms=S
    mfu=F maxmem_GiB=X loss=L arch=A params=P mb=B seq=T compile=0|1 ac=0|1 reduce=fp32|bf16
MFU: peer_models.flops_per_token (Weft's worker/mfu.h accounting) over a 989 TFLOP/s peak.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_models  # noqa: E402


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    peer_models.add_shape_args(p)
    p.add_argument("--mesh", default="hsdp", choices=["hsdp", "full"])
    p.add_argument("--hosts", type=int, default=0, help="default: WORLD_SIZE / LOCAL_WORLD_SIZE")
    p.add_argument("--mb", type=int, default=8, help="micro-batch per GPU")
    p.add_argument("--accum", type=int, default=1, help="micro-steps per optimizer step")
    p.add_argument("--steps", type=int, default=6, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=2, help="optimizer steps before timing")
    p.add_argument("--reduce-dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--clip", type=float, default=1.0, help="gradient norm clip (0: none)")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--ac", action="store_true", help="activation checkpointing per block")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: gloo, for testing the script without GPUs")
    return p.parse_args()


def main():
    a = parse()
    shape = peer_models.shape_from_args(a)
    cuda = a.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device(a.device, torch.cuda.current_device()) if cuda else torch.device("cpu")
    hosts = a.hosts or world // local_world
    if world % hosts:
        raise SystemExit(f"world {world} does not split into {hosts} hosts")
    per_host = world // hosts

    # Built on the meta device, sharded, then materialised shard by shard: a model larger than
    # one GPU never exists whole.
    with torch.device("meta"):
        model = peer_models.build(shape)
    nparams = peer_models.count_parameters(model)
    if nparams != peer_models.param_count(shape):  # the MFU would not be Weft's
        raise SystemExit(f"model has {nparams} parameters, Weft's count is "
                         f"{peer_models.param_count(shape)}")
    model.checkpoint_blocks = a.ac
    if a.compile:
        for block in model.blocks:
            block.compile()

    if a.mesh == "hsdp":
        mesh = init_device_mesh(a.device, (hosts, per_host), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(a.device, (world,), mesh_dim_names=("shard",))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                              reduce_dtype=torch.float32 if a.reduce_dtype == "fp32" else torch.bfloat16)
    shard = dict(mesh=mesh, mp_policy=mp)
    if not model.tied:  # a tied head must share its unit with the embedding: the root's
        fully_shard(model.embed, **shard)
    for block in model.blocks:
        fully_shard(block, **shard)
    if not model.tied:
        fully_shard([model.final_norm, model.head], reshard_after_forward=False, **shard)
    fully_shard(model, **shard)
    model.to_empty(device=dev)
    torch.manual_seed(1234)
    peer_models.init_weights(model)

    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=cuda)
    x, y = peer_models.random_batch(shape, a.mb, dev, rank)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    loss_sum = torch.zeros((), device=dev)
    t0 = None
    for step in range(a.warmup + a.steps):
        if step == a.warmup:
            sync()
            dist.barrier()
            t0 = time.perf_counter()
        loss_sum.zero_()
        for micro in range(a.accum):
            model.set_requires_gradient_sync(micro == a.accum - 1)
            loss = model(x, y) / a.accum
            loss.backward()
            loss_sum += loss.detach()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync()
    elapsed = time.perf_counter() - t0
    step_s = elapsed / max(a.steps, 1)
    speed = peer_models.speed_fields(shape, a.mb, a.accum, step_s, cuda)
    if rank == 0:
        print(f"RESULT peer=fsdp2_hsdp mesh={a.mesh} hosts={hosts} gpus_per_host={per_host} "
              f"accum={a.accum} {speed} loss={loss_sum.item():.3f} "
              f"arch={shape.arch} params={nparams} mb={a.mb} seq={shape.seq} "
              f"compile={int(a.compile)} ac={int(a.ac)} reduce={a.reduce_dtype}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
