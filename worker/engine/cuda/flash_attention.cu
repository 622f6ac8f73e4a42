// Fused causal attention (FlashAttention-2 style): the (T, T) score matrix never reaches global
// memory. Forward and backward run on the tensor cores (mma.sync m16n8k16, bf16 inputs, fp32
// accumulation) over shared-memory tiles; the softmax is computed online in fp32. On Hopper
// the forward at head sizes 64 and 128 runs on the warpgroup MMA instead (wgmma, namespace
// hopper below), and so does the backward's dK/dV kernel; dQ is mma.sync everywhere.
//
// Layout: the model's own, no head permutation and no copy of shared k/v heads anywhere. q, k,
// v are read straight from the qkv projection's output (B, T, (NH + 2 NKV) HS), rows
// [q (NH heads) | k (NKV heads) | v (NKV heads)], each head HS consecutive channels: element
// (b, h, t, d) of q is qkv[(b * T + t) * W + h * HS + d] (W = (NH + 2 NKV) HS), and query
// head h reads kv head h / G (G = NH / NKV, grouped-query attention): k at
// NH * HS + (h / G) * HS, v NKV * HS further. GPT-2 is NKV = NH (W = 3C, as
// AttentionSplitHeads). dq, dk, dv are written at the same places of dqkv. y and dy are
// (B, T, C), C = NH * HS: element (b, h, t, d) at (b * T + t) * C + h * HS + d. So one head is
// a (T, HS) matrix with row stride W or C; with HS a multiple of 8 every row starts 16-byte
// aligned. lse is fp32 (B * NH * T) in (b, h, t) order. scale = 1 / sqrt(HS).
//
// Work split (4 warps per block, each warp owning 32 query rows or 16 key rows):
//  - forward: a block per (query head, 128-query tile); it walks the key tiles up to the
//    diagonal, keeping the running max / sum and the output accumulator in registers. Scores
//    are kept in log2 units (scale * log2(e) folded in) so exp2 is one instruction.
//  - backward, three kernels, no atomics (deterministic):
//     1. D[r] = rowsum(dy * y) (the softmax backward's correction term), fp32 in `scratch`;
//     2. dK, dV: a block per (kv head, 64-key tile), walking the query tiles from the diagonal
//        on, for each of the G query heads of its group in turn (the group's sum stays in
//        registers: no atomics, no per-query-head partials). It computes the TRANSPOSED
//        products (keys as rows: S^T = K Q^T, dP^T = V dY^T), so P^T and dS^T come out of the
//        accumulators already in the register layout of the A operand of dV += P^T dY and
//        dK += dS^T Q: nothing goes back through shared memory;
//     3. dQ: a block per (query head, 128-query tile), like the forward: recompute S, P (from lse),
//        dP = dY V^T, dS, and dQ += dS K. Recomputing S and dP once more costs two small GEMMs
//        per tile but removes the fp32 dQ accumulator and its atomics.
//  - Causal masking is only evaluated on tiles that straddle the diagonal; the padding rows of
//    a ragged last tile are zero-filled in shared memory and never stored. In the dK/dV kernel
//    padded queries get lse = +inf, so their P is exactly 0.
//  - Document masking (doc_starts, packed sequences; ops.h): query q sees keys
//    [doc_starts[q], q]. doc_starts is nondecreasing in q, so the keys a query tile [q0, q1)
//    needs are [doc_starts[q0], q1) and the queries a key tile [k0, k1) is seen by are
//    [k0, e), e the first query with doc_starts >= k1: both contiguous. Tiles outside are
//    SKIPPED, never loaded or multiplied, which is what makes short documents cheap:
//     - forward and dQ: the walk starts at key tile doc_starts[q0] / kBk instead of 0, and a
//       warp skips the tiles that end before its first row's document (as it skips those past
//       its last row);
//     - dK/dV: the walk ends at the last query tile whose first query's document starts
//       before k1 (a binary search over the query tiles' first doc starts: nondecreasing).
//       The blocks compute it themselves, no extra kernel and no scratch, and take the key
//       tiles heaviest first (PlanKeyTile: short documents make their work uneven). The
//       mma.sync kernel's warps also skip the steps whose queries all start their documents
//       after the warp's last key.
//    The rows' doc starts are read once into registers (forward, dQ: each lane's rows) or
//    staged per step in shared memory with lse and D (dK/dV: the step's queries); only the
//    tiles that cross a document start (some row's start lies past the tile's first key) test
//    them per element, in a pass of their own after the causal one. Padded rows take the last
//    row's doc start, keeping it nondecreasing.
//    Every kernel is built twice (kDocs): without doc_starts the document code folds away and
//    the kernel is the plain causal one, as fast and with the same bits as before. With them,
//    where a short document leaves each block only a few tiles to walk, the latency of its
//    first loads bounds it: there the forward and dQ blocks take 64-query tiles and the Hopper
//    ones at HS 64 one warpgroup (64 queries or keys), for twice the blocks an SM; the dK/dV
//    blocks take their key tiles heaviest first; and the backward runs its dK/dV and dQ
//    kernels side by side. Each row's arithmetic stays the causal kernel's, so doc_starts all
//    zero gives the same bits as nullptr. Measured on an H200 (cuda_ops_bench --docmask,
//    Llama-3.2-1B's attention, T = 4096, documents of 150 to 450 tokens): forward + backward
//    0.184 ms against 0.915 ms causal, 5.0x.
//  - Sliding window (window w > 0, Mistral; ops.h): query q sees keys [q - w + 1, q], and with
//    documents [max(doc_starts[q], q - w + 1), q]. That lower bound is nondecreasing in q as a
//    doc start is, so the window IS the document code with another lower bound (DocStart
//    takes the max of the two): the same skipping (forward and dQ start their walk at the
//    key tile holding the tile's first query's bound; dK/dV ends a key tile's walk at the
//    query tile whose first query's bound passes the tile's end, i.e. about k1 + w - 1), the
//    same `before` pass on the tiles that cross some row's bound, in the same kDocs variant
//    (no third build of every kernel). A window of T or more is no window (Mask): it runs the
//    unmasked kernels. Only the block shapes differ where they must: a long window alone
//    (LongWalks: 1024 keys or more at HS 64 and 128) makes every block walk many tiles, as
//    causal ones do, so the forward and dQ kernels take the causal query tiles there (a third
//    build of those two kernels at those two head sizes, kLong), not the documents' short ones,
//    and the Hopper dK/dV kernel drops the documents' plan, staged starts and masking pass,
//    whose registers it does not have (its own kLong build, FlashBackwardKvWgmmaKernel).
//    Measured on an H200 (cuda_ops_bench --window, Mistral-7B's attention, T = 16384,
//    w = 4096): forward + backward 10.21-10.23 ms against 21.62-21.64 ms causal, 0.472-0.473
//    of it (the visible pairs are 0.437, whole 128-key tiles 0.448; mma.sync kernels alone
//    0.468-0.470). Per kernel (ncu): forward 0.47 of causal's, dQ 0.46, dK/dV 0.57 before its
//    kLong build.
//  - Tiles are staged with cp.async, double-buffered: the next tile loads while the current
//    one is multiplied.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): lane L holds, in its accumulator
// c[0..3], rows L/4 (c0, c1) and L/4 + 8 (c2, c3) at columns 2 * (L % 4) + {0, 1} of its 8
// column n-tile. Two adjacent n-tiles of an accumulator are exactly the A operand of a k = 16
// step, which is how P feeds P @ V without a shared-memory round trip.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/bf16.cuh"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/launch.cuh"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * internal::kWarpSize;
constexpr int kWarpRows = 16;                // rows of one mma tile
constexpr int kMinTile = kWarps * kWarpRows;  // rows of the smallest block tile (dK/dV's)
constexpr int kPad = 8;                      // bf16 of padding per shared-memory row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Tile sizes per head size.
//  - The forward and dQ kernels give each warp kMt mma tiles of queries (16 kMt rows): every
//    key (and value) fragment read from shared memory then feeds kMt products instead of one.
//    Shared-memory reads, not the tensor cores, bound these kernels: on an H200 at the
//    Llama-8B shape kMt = 2 made the forward 1.29x and the backward 1.25x faster than one tile
//    per warp. Their blocks own kQTile queries and walk kWalk (kQWalk) keys per step.
//  - The dK/dV kernel keeps one mma tile of keys per warp (its two (16, HS) fp32 accumulators
//    fill the registers), owns kKvTile keys and walks kKvWalk queries per step.
template <int kHs>
struct Tiles {
  static constexpr int kStride = kHs + kPad;  // shared-memory row stride (bf16): a row is
                                              // 16 bytes off the bank of the one above, so
                                              // ldmatrix's 8 rows hit 8 distinct bank groups
  static constexpr int kMt = 2;  // the blocks' kQTile: QueryTiles below
  static constexpr int kWalk = 64;
  // HS = 128: 64 keys a step cannot fit two (32, 64) fp32 products in registers next to the
  // (32, 128) dQ accumulator. 32 spills a few bytes, yet measured faster than 16 on an H200.
  static constexpr int kQWalk = kHs == 128 ? 32 : 64;
  static constexpr int kKvTile = kMinTile;
  static constexpr int kKvWalk = 64;
};

// The forward's and dQ's query tiles: kMt mma tiles a warp, kQTile queries a block. With
// documents one a warp (64-query tiles): a short document's blocks walk few key tiles, so the
// latency of each block's first loads bounds them, not the shared-memory reads that kMt = 2
// saves; half the rows halve a block's registers and shared memory, so twice the blocks share
// an SM and hide each other's latency, and smaller tiles reach less outside a document; the dQ
// kernel is held to 128 registers for four blocks an SM at HS <= 64 (it fits without spills).
// (The rows' arithmetic does not depend on kMt: doc_starts all zero gives the causal bits.)
// A long window without documents (kLong, LongWalks) makes every block walk many tiles again,
// as causal ones do, so it takes the causal tiles: Mistral-7B's attention (T = 16384, window
// 4096) on an H200 spent 0.57 of causal's time in the backward with 64-query dQ tiles (the
// work is 0.44 of it).
template <int kHs, bool kDocs, bool kLong = false>
struct QueryTiles {
  static constexpr int kMt = kDocs && !kLong ? 1 : Tiles<kHs>::kMt;
  static constexpr int kQTile = kWarps * kWarpRows * kMt;
};

// ---- PTX wrappers ----

__device__ inline uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ inline void CpAsync16(void* dst_shared, const void* src_global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(SharedAddress(dst_shared)),
               "l"(src_global)
               : "memory");
}

__device__ inline void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int kPending>
__device__ inline void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 bf16 matrices; lanes 8m..8m+7 give the row addresses of matrix m, and register m
// receives matrix m in the mma fragment layout (row L/4, columns 2 * (L % 4) + {0, 1}).
__device__ inline void LdMatrixX4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}

// The same, transposed on the way: register m holds column L/4, rows 2 * (L % 4) + {0, 1}.
__device__ inline void LdMatrixX4Trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}

// d (16x8, fp32) += a (16x16, bf16, row-major) @ b (16x8, bf16, column-major).
__device__ inline void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> bf16x2 (round to nearest even), the lower column in the low half.
__device__ inline uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- tile helpers (all threads of the block call them) ----

// Query head bh = b * NH + h and the kv head it reads, h / (NH / NKV): where they start in
// each layout (elements) and the layouts' row strides. Query heads h of one group are adjacent,
// so head h + 1 of a group is this one's q, y and lse shifted by kHs, kHs and T.
struct HeadBase {
  size_t q_off;  // q's (t = 0, d = 0) in (B, T, (NH + 2 NKV) HS)
  size_t k_off;  // k's; v's is k_off + NKV * HS
  size_t v_off;
  size_t rows;   // (t = 0, d = 0) in (B, T, NH * HS)
  size_t lse;    // row t = 0 in (B * NH * T)
  const bf16* q;
  const bf16* k;
  const bf16* v;
  int ld_qkv;  // (NH + 2 NKV) HS, the row stride of qkv and dqkv
  int ld_y;    // NH * HS, the row stride of y and dy
};

template <int kHs>
__device__ inline HeadBase HeadOffsets(const bf16* qkv, int bh, int nh, int nkv, int t) {
  const int bi = bh / nh;
  const int hi = bh % nh;
  const int kvh = hi / (nh / nkv);
  const int q_width = nh * kHs;
  const int kv_width = nkv * kHs;
  const int ld = q_width + 2 * kv_width;
  const size_t bt0 = static_cast<size_t>(bi) * t;  // row b * T + 0
  const size_t row0 = bt0 * static_cast<size_t>(ld);
  const size_t q = row0 + static_cast<size_t>(hi) * kHs;
  const size_t k = row0 + q_width + static_cast<size_t>(kvh) * kHs;
  return {q,
          k,
          k + kv_width,
          bt0 * q_width + static_cast<size_t>(hi) * kHs,
          static_cast<size_t>(bh) * t,
          qkv + q,
          qkv + k,
          qkv + k + kv_width,
          ld,
          q_width};
}

// The masks beyond causal (ops.h): query q sees keys [max(doc_starts[b, q], q - window + 1), q]
// (no doc_starts: 0; window 0: no window). Both bounds are nondecreasing in q, so their max
// is too, and that is all the tile skipping relies on: the kernels handle one lower bound per
// row, whether a document or a window set it. The kernels get it whole (the launchers pass it
// on unchanged); DocRow narrows it to one sequence.
struct KeyMask {
  const int32_t* doc_starts;  // (B, T) in the kernels' argument, one sequence's (T) in DocRow's
  int window;                 // > 0, or 0: none (the launchers map window >= T to 0)
  __host__ __device__ bool Masked() const { return doc_starts != nullptr || window > 0; }
};

// The first key row `row` of one sequence sees: the larger of its doc start and its window's
// first key, or 0 without either. Rows at or past t (a ragged tile's padding) take the last
// row's, so the starts of a tile stay nondecreasing and its last row's is its largest.
__device__ inline int DocStart(const KeyMask& doc, int row, int t) {
  const int r = min(row, t - 1);
  const int start = doc.doc_starts == nullptr ? 0 : __ldg(doc.doc_starts + r);
  return doc.window > 0 ? max(start, r - doc.window + 1) : start;
}

// Sequence b's mask in a kernel instantiated for masking (kDocs), else none: every kernel is
// built twice, and without a mask (kDocs false: no doc_starts, no window) all the masking code
// folds away (starts 0, no `before` pass, no search), leaving the plain causal kernel as it
// was, instruction for instruction, so its speed and bits are unchanged. The window shares the
// masked variant rather than adding a third: its code is the documents' code, the lower bound
// computed differently.
template <bool kDocs>
__device__ inline KeyMask DocRow(const KeyMask& mask, size_t b, int t) {
  if (!kDocs) return {nullptr, 0};
  return {mask.doc_starts == nullptr ? nullptr : mask.doc_starts + b * t, mask.window};
}

// The number of query tiles [first, first + count) (`tile` queries each) of which the first
// query's document starts before key_end: with doc_starts nondecreasing the tiles that pass
// are a prefix of [first, n_tiles), found by all kBlockThreads threads testing one tile each,
// a round per kBlockThreads tiles until a round has a miss. Called by every thread of the
// block (it holds barriers); the count is the same in all of them.
template <int kBlockThreads>
__device__ inline int CountQueryTiles(const KeyMask& doc, int first, int n_tiles, int tile, int t,
                                      int key_end) {
  int count = 0;
  for (int base = first; base < n_tiles; base += kBlockThreads) {
    const int i = base + static_cast<int>(threadIdx.x);
    const int hits = __syncthreads_count(i < n_tiles && DocStart(doc, i * tile, t) < key_end);
    count += hits;
    if (hits < kBlockThreads) break;
  }
  return count;
}

// Which key tile a dK/dV block takes and how many query tiles, from its diagonal on, see it.
struct KeyTilePlan {
  int tile;
  int count;
};

// The dK/dV kernels' plan with documents. A key tile's work is G times the query tiles that see
// it, which short documents make uneven (2 to 9 tiles of 64 at T = 4096 with ~300-token
// documents); with a block or two per SM, taken in key order the last wave's heavy blocks
// left SMs idle (Llama-3.2-1B's attention on an H200: 93 us in key order, 81 us heaviest
// first, with 128-key tiles). So the blocks take the key tiles heaviest first (longest
// processing time first): block `rank` of a sequence takes the key tile of that rank by count,
// ties in key order. Every block ranks them all itself, the same way (deterministic; no extra
// kernel, no scratch): one round of loads of each query tile's first doc start
// (nondecreasing, so a key tile's count is a binary search), then each tile's rank by
// comparing counts. Up to kPlanKeyTiles key tiles and kPlanQueryTiles query tiles
// (T = 16384 with 64-key tiles); longer sequences take the key tiles in order, each
// block counting its own (CountQueryTiles).
constexpr int kPlanQueryTiles = 512;
constexpr int kPlanKeyTiles = 256;
template <int kBlockThreads, int kKeys, int kBq>
__device__ KeyTilePlan PlanKeyTile(const KeyMask& doc, int t, int rank) {
  const int n_q = (t + kBq - 1) / kBq;
  const int n_k = (t + kKeys - 1) / kKeys;
  if (n_q > kPlanQueryTiles || n_k > kPlanKeyTiles) {
    const int k0 = rank * kKeys;
    return {rank, CountQueryTiles<kBlockThreads>(doc, k0 / kBq, n_q, kBq, t, min(k0 + kKeys, t))};
  }
  __shared__ int q_starts[kPlanQueryTiles];  // doc start of each query tile's first query
  __shared__ int counts[kPlanKeyTiles];      // query tiles that see each key tile
  __shared__ KeyTilePlan mine;
  for (int i = threadIdx.x; i < n_q; i += kBlockThreads) q_starts[i] = DocStart(doc, i * kBq, t);
  __syncthreads();
  for (int y = threadIdx.x; y < n_k; y += kBlockThreads) {
    // The first query tile whose first query starts its document at or after the tile's last
    // key sees none of it, nor does any later one; those before from y's diagonal on do.
    const int key_end = min((y + 1) * kKeys, t);
    int lo = 0, hi = n_q;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (q_starts[mid] < key_end) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    counts[y] = lo - y * kKeys / kBq;
  }
  __syncthreads();
  for (int y = threadIdx.x; y < n_k; y += kBlockThreads) {
    const int c = counts[y];
    int r = 0;
#pragma unroll 8
    for (int z = 0; z < n_k; ++z) r += counts[z] > c || (counts[z] == c && z < y);
    if (r == rank) mine = {y, c};
  }
  __syncthreads();
  return mine;
}

// Rows [q0, q0 + kRows) of one query head's lse (in log2 units) and D, and the rows' doc
// starts (DocStart), into shared memory, by the block's kBlockThreads threads: the dK/dV
// kernels' per-query values of a step. Padded queries get lse = +inf, which makes their P
// exactly 0, so they add nothing.
template <int kRows, int kBlockThreads>
__device__ inline void StageQueryStats(float* slse, float* sdsum, int* sstart, const float* lse_g,
                                       const float* dsum_g, const KeyMask& doc, int q0, int t) {
  for (int i = threadIdx.x; i < kRows; i += kBlockThreads) {
    const int row = q0 + i;
    slse[i] = row < t ? lse_g[row] * kLog2e : INFINITY;
    sdsum[i] = row < t ? dsum_g[row] : 0.0f;
    if (doc.Masked()) sstart[i] = DocStart(doc, row, t);  // else never read
  }
}

// A thread's share of a tile load: kCopies 16-byte chunks of one column, the k-th from row
// row + k * kPass of src (row stride ld elements, src already at the column) to
// dst + k * dst_step bytes. Rows at or past t are zero-filled; a tile wholly before t (whole)
// skips the check. The addresses advance by constants, one add per copy instead of a
// division, a bounds check and a multiply: the tile loads were what kept the attention
// kernels issue-bound.
template <int kCopies, int kPass>
__device__ inline void CopyColumnChunks(unsigned char* dst, int dst_step,
                                        const bf16* __restrict__ src, int row, int ld, int t,
                                        bool whole) {
  if (whole) {
    const bf16* from = src + static_cast<size_t>(row) * ld;
#pragma unroll
    for (int k = 0; k < kCopies; ++k) {
      CpAsync16(dst + k * dst_step, from + static_cast<size_t>(k) * kPass * ld);
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < kCopies; ++k) {
    const int r = row + k * kPass;
    if (r < t) {
      CpAsync16(dst + k * dst_step, src + static_cast<size_t>(r) * ld);
    } else {
      *reinterpret_cast<uint4*>(dst + k * dst_step) = make_uint4(0, 0, 0, 0);
    }
  }
}

// Rows [row0, row0 + kRows) of one head's (T, kHs) matrix, row stride ld elements (3C or C),
// -> shared (kRows, kStride). Rows at or past t are zero-filled, so a ragged last tile
// multiplies as zeros (never NaN garbage).
template <int kHs, int kRows>
__device__ inline void LoadTile(bf16* dst, const bf16* __restrict__ src, int row0, int t,
                                int ld) {
  // A thread copies the same 16-byte chunk of every kPass-th row.
  constexpr int kChunks = kHs / internal::kVec;  // 16-byte chunks per row
  constexpr int kPass = kThreads / kChunks;       // rows a pass of the block copies
  constexpr int kStride = Tiles<kHs>::kStride;
  static_assert(kThreads % kChunks == 0 && kRows % kPass == 0, "whole passes");
  const int col = (threadIdx.x % kChunks) * internal::kVec;
  const int r0 = threadIdx.x / kChunks;
  unsigned char* d = reinterpret_cast<unsigned char*>(dst + r0 * kStride + col);
  CopyColumnChunks<kRows / kPass, kPass>(d, kPass * kStride * static_cast<int>(sizeof(bf16)),
                                        src + col, row0 + r0, ld, t, row0 + kRows <= t);
}

// ---- warp-level products (each warp computes a strip of kMt mma tiles, 16 kMt rows) ----
// A lane's accumulator element (mt, nt, e) sits in strip row 16 mt + 8 (e / 2) + L / 4, i.e.
// row half r = 2 mt + e / 2 at row L / 4 + 8 r, column 8 nt + 2 (L % 4) + e % 2.

// acc (16 kMt, kN) += A B^T: A is the warp's 16 kMt rows (., kHs) at `a`, B is (kN, kHs) at
// `b`, both in shared memory with row stride kStride. (S = Q K^T, dP = dY V^T and their
// transposes.) Each B fragment is read once and used for all kMt tiles.
template <int kHs, int kMt, int kN>
__device__ inline void MmaABt(float (&acc)[kMt][kN / 8][4], const bf16* a, const bf16* b,
                              int lane) {
  constexpr int kStride = Tiles<kHs>::kStride;
#pragma unroll
  for (int kc = 0; kc < kHs / 16; ++kc) {
    uint32_t af[kMt][4];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      // Matrices: rows 0-7 / 8-15 (lane % 16) x columns 0-7 / 8-15 (lane / 16) of the 16x16.
      LdMatrixX4(af[mt], a + (mt * 16 + lane % 16) * kStride + kc * 16 + (lane / 16) * 8);
    }
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      uint32_t bf[4];
      // B's rows are the n index: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
      // (n 8-15, k 8-15) = the two k halves of n-tiles 2np and 2np + 1.
      LdMatrixX4(bf, b + (np * 16 + (lane / 16) * 8 + lane % 8) * kStride + kc * 16 +
                         ((lane / 8) % 2) * 8);
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        Mma(acc[mt][2 * np], af[mt], bf[0], bf[1]);
        Mma(acc[mt][2 * np + 1], af[mt], bf[2], bf[3]);
      }
    }
  }
}

// acc (16 kMt, kHs) += P B: P (16 kMt, kK) is a warp's accumulator (rounded to bf16 here), B
// is (kK, kHs) at `b` in shared memory, read transposed. (O += P V, dV += P^T dY,
// dK += dS^T Q, dQ += dS K.)
template <int kHs, int kMt, int kK>
__device__ inline void MmaPB(float (&acc)[kMt][kHs / 8][4], const float (&p)[kMt][kK / 8][4],
                             const bf16* b, int lane) {
  constexpr int kStride = Tiles<kHs>::kStride;
#pragma unroll
  for (int kc = 0; kc < kK / 16; ++kc) {
    uint32_t af[kMt][4];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      af[mt][0] = PackBf16(p[mt][2 * kc][0], p[mt][2 * kc][1]);
      af[mt][1] = PackBf16(p[mt][2 * kc][2], p[mt][2 * kc][3]);
      af[mt][2] = PackBf16(p[mt][2 * kc + 1][0], p[mt][2 * kc + 1][1]);
      af[mt][3] = PackBf16(p[mt][2 * kc + 1][2], p[mt][2 * kc + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < kHs / 16; ++dp) {
      uint32_t bf[4];
      // Matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15), each
      // transposed: the two k halves of n-tiles 2dp and 2dp + 1.
      LdMatrixX4Trans(bf, b + (kc * 16 + lane % 16) * kStride + dp * 16 + (lane / 16) * 8);
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        Mma(acc[mt][2 * dp], af[mt], bf[0], bf[1]);
        Mma(acc[mt][2 * dp + 1], af[mt], bf[2], bf[3]);
      }
    }
  }
}

// Stores a warp's (16 kMt, kHs) accumulator times `mul[r]` (r = row half) to rows
// row_lo + 8 r of a (T, kHs) matrix with row stride ld elements, skipping rows at or past t.
template <int kHs, int kMt>
__device__ inline void StoreRows(bf16* __restrict__ out, const float (&acc)[kMt][kHs / 8][4],
                                 const float (&mul)[2 * kMt], int row_lo, int t, int ld,
                                 int lane) {
#pragma unroll
  for (int r = 0; r < 2 * kMt; ++r) {
    const int row = row_lo + 8 * r;
    if (row >= t) continue;
    const int mt = r / 2;
    const int h = r % 2;
    bf16* dst = out + static_cast<size_t>(row) * ld + 2 * (lane % 4);
#pragma unroll
    for (int nt = 0; nt < kHs / 8; ++nt) {
      *reinterpret_cast<__nv_bfloat162*>(dst + nt * 8) = __floats2bfloat162_rn(
          acc[mt][nt][2 * h] * mul[r], acc[mt][nt][2 * h + 1] * mul[r]);
    }
  }
}

// Sets every element of a warp's (16 kMt, kN) accumulator to f(value, r, col, mt, nt, e):
// r is the row half (the lane's row L/4 + 8 r of the strip), col the column in [0, kN), and
// (mt, nt, e) the element's place in acc.
template <int kMt, int kN, typename F>
__device__ __forceinline__ void ForEachElement(float (&acc)[kMt][kN / 8][4], int lane, F f) {
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[mt][nt][e] =
            f(acc[mt][nt][e], 2 * mt + e / 2, nt * 8 + 2 * (lane % 4) + e % 2, mt, nt, e);
      }
    }
  }
}

// One step of a double-buffered walk: starts loading the next step's tiles into the other
// buffer when there is a next step (load_next), then waits until this step's tiles are in
// shared memory, block-wide.
template <typename LoadNext>
__device__ __forceinline__ void AwaitStep(bool has_next, LoadNext load_next) {
  if (has_next) {
    load_next();
    CpAsyncCommit();
    CpAsyncWait<1>();
  } else {
    CpAsyncWait<0>();
  }
  __syncthreads();
}

// Key tile `step` (kBk keys of k and of v) -> buffer `buf` of sk and sv.
template <int kHs, int kBk>
__device__ __forceinline__ void LoadKeyTile(bf16* sk, bf16* sv, const HeadBase& head, int step,
                                            int buf, int t) {
  constexpr int kStride = Tiles<kHs>::kStride;
  LoadTile<kHs, kBk>(sk + buf * kBk * kStride, head.k, step * kBk, t, head.ld_qkv);
  LoadTile<kHs, kBk>(sv + buf * kBk * kStride, head.v, step * kBk, t, head.ld_qkv);
}

// The walk of the forward and dQ kernels over key tiles [first, n_steps) (kBk keys each),
// double-buffered; the caller has loaded tile `first` into buffer 0. For each tile that
// reaches this warp's 16 kMt rows (tiles start on multiples of 16, so
// k0 <= warp_row + 16 kMt - 1 means the warp's last row sees at least key k0; a tile entirely
// above them contributes nothing) and ends at or after warp_start, the doc start of the warp's
// first row (the smallest of its rows; a tile before it is wholly masked for every row),
// computes the warp's scores s (16 kMt, kBk) = Q K^T and calls
// on_tile(s, k0, straddles, before, skb, svb): straddles says the tile crosses the diagonal of
// some row of the warp, before that it holds keys before some row's document (k0 <
// warp_last_start, the doc start of the warp's last row, its largest), each needing masking;
// skb / svb are the tile's keys and values in shared memory.
template <int kHs, int kMt, int kBk, bool kDocs, typename OnTile>
__device__ __forceinline__ void WalkKeyTiles(bf16* sk, bf16* sv, const bf16* sq_warp,
                                             const HeadBase& head, int first, int n_steps,
                                             int warp_row, int warp_start, int warp_last_start,
                                             int t, int lane, OnTile on_tile) {
  constexpr int kStride = Tiles<kHs>::kStride;
  for (int j = first; j < n_steps; ++j) {
    const int buf = (j - first) % 2;
    AwaitStep(j + 1 < n_steps, [&] { LoadKeyTile<kHs, kBk>(sk, sv, head, j + 1, 1 - buf, t); });
    const int k0 = j * kBk;
    if (k0 <= warp_row + kWarpRows * kMt - 1 && (!kDocs || k0 + kBk > warp_start)) {
      const bf16* skb = sk + buf * kBk * kStride;
      float s[kMt][kBk / 8][4] = {};
      MmaABt<kHs, kMt, kBk>(s, sq_warp, skb, lane);
      on_tile(s, k0, k0 + kBk - 1 > warp_row, kDocs && k0 < warp_last_start, skb,
              sv + buf * kBk * kStride);
    }
    __syncthreads();  // the buffer is refilled by the next step's prefetch
  }
}

// A warp's rows' doc starts for WalkKeyTiles and the masking: start[r] of the lane's row
// row_lo + 8 r, and the warp's first and last rows' (its smallest and largest).
template <int kRows>
struct RowStarts {
  int start[kRows];
  int warp_start;
  int warp_last_start;
};
template <int kRows>
__device__ inline RowStarts<kRows> ReadRowStarts(const KeyMask& doc, int warp_row, int row_lo,
                                                 int t) {
  RowStarts<kRows> rs;
#pragma unroll
  for (int r = 0; r < kRows; ++r) rs.start[r] = DocStart(doc, row_lo + 8 * r, t);
  rs.warp_start = DocStart(doc, warp_row, t);
  rs.warp_last_start = DocStart(doc, warp_row + 8 * kRows - 1, t);
  return rs;
}

// Sets the elements of a warp's (16 kMt, kN) tile of keys [k0, k0 + kN) that lie before the
// lane's row's document (row row_lo + 8 r, key < starts.start[r]) to `masked`. A pass of its
// own after the causal one, run only on the tiles that hold such keys (WalkKeyTiles' `before`,
// warp-uniform): the causal pass stays today's code, and without documents this never runs.
template <int kMt, int kN, int kRows>
__device__ __forceinline__ void MaskBeforeDocuments(float (&acc)[kMt][kN / 8][4], int lane,
                                                    int k0, const RowStarts<kRows>& starts,
                                                    float masked) {
  static_assert(kRows == 2 * kMt, "a lane's rows");
  ForEachElement<kMt, kN>(acc, lane, [&](float x, int r, int col, int, int, int) {
    return k0 + col < starts.start[r] ? masked : x;
  });
}

// ---- kernels ----
// Grids are (B * NH, tiles): blocks are scheduled x fastest, so with the heaviest tiles at
// y = 0 (the last query tile has the most keys; the first key tile the most queries) every
// head's long tile starts in the first wave and the short ones fill in behind.

template <int kHs, bool kDocs, bool kLong>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(bf16* __restrict__ y,          // (B, T, C)
                       float* __restrict__ lse,       // (B * NH * T)
                       const bf16* __restrict__ qkv,  // (B, T, (NH + 2 NKV) HS)
                       const KeyMask mask,            // doc_starts (B, T) or nullptr, window
                       int t, int nh, int nkv, float scale_log2) {
  using Cfg = Tiles<kHs>;
  constexpr int kStride = Cfg::kStride;
  constexpr int kMt = QueryTiles<kHs, kDocs, kLong>::kMt;
  constexpr int kQTile = QueryTiles<kHs, kDocs, kLong>::kQTile;
  constexpr int kRows = 2 * kMt;            // row halves a lane holds
  constexpr int kBk = Cfg::kWalk;           // keys per step
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sq = reinterpret_cast<bf16*>(smem);  // (kQTile, kStride)
  bf16* sk = sq + kQTile * kStride;          // 2 x (kBk, kStride), double-buffered
  bf16* sv = sk + 2 * kBk * kStride;         // 2 x (kBk, kStride)
  const int warp = threadIdx.x / internal::kWarpSize;
  const int lane = threadIdx.x % internal::kWarpSize;
  const HeadBase head = HeadOffsets<kHs>(qkv, blockIdx.x, nh, nkv, t);
  y += head.rows;
  lse += head.lse;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kQTile;
  const int warp_row = q0 + warp * kWarpRows * kMt;  // the warp's first query
  const int row_lo = warp_row + lane / 4;            // this lane's rows: row_lo + 8 r
  const KeyMask doc = DocRow<kDocs>(mask, blockIdx.x / nh, t);

  LoadTile<kHs, kQTile>(sq, head.q, q0, t, head.ld_qkv);
  // Keys [doc start of q0, q0 + kQTile): the tile's first row has its smallest doc start.
  const int first = DocStart(doc, q0, t) / kBk;
  LoadKeyTile<kHs, kBk>(sk, sv, head, first, 0, t);
  CpAsyncCommit();
  const int n_steps = (min(t, q0 + kQTile) + kBk - 1) / kBk;
  const RowStarts<kRows> starts = ReadRowStarts<kRows>(doc, warp_row, row_lo, t);

  float o[kMt][kHs / 8][4] = {};
  float m[kRows];  // running max (log2 units) of rows row_lo + 8 r
  float l[kRows];  // this lane's share of the running sum
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  WalkKeyTiles<kHs, kMt, kBk, kDocs>(
      sk, sv, sq + warp * kWarpRows * kMt * kStride, head, first, n_steps, warp_row,
      starts.warp_start, starts.warp_last_start, t, lane,
      [&](float(&s)[kMt][kBk / 8][4], int k0, bool straddles, bool before, const bf16*,
          const bf16* svb) {
        ForEachElement<kMt, kBk>(s, lane, [&](float x, int r, int col, int, int, int) {
          return straddles && k0 + col > row_lo + 8 * r ? -INFINITY : x * scale_log2;
        });
        if (before) MaskBeforeDocuments<kMt, kBk>(s, lane, k0, starts, -INFINITY);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const int mt = r / 2;
          const int h = r % 2;
          float mx = m[r];
#pragma unroll
          for (int nt = 0; nt < kBk / 8; ++nt) {
            mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
          }
          // The 4 lanes of a quad share a row.
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          // A row with no key yet keeps max -inf; subtracting 0 instead avoids -inf - -inf.
          const float base = mx == -INFINITY ? 0.0f : mx;
          const float corr = exp2f(m[r] - base);
          m[r] = mx;
          l[r] *= corr;
#pragma unroll
          for (int nt = 0; nt < kHs / 8; ++nt) {
            o[mt][nt][2 * h] *= corr;
            o[mt][nt][2 * h + 1] *= corr;
          }
#pragma unroll
          for (int nt = 0; nt < kBk / 8; ++nt) {
            s[mt][nt][2 * h] = exp2f(s[mt][nt][2 * h] - base);
            s[mt][nt][2 * h + 1] = exp2f(s[mt][nt][2 * h + 1] - base);
            l[r] += s[mt][nt][2 * h] + s[mt][nt][2 * h + 1];
          }
        }
        MmaPB<kHs, kMt, kBk>(o, s, svb, lane);  // O += P V
      });
  float inv[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv[r] = 1.0f / l[r];
    const int row = row_lo + 8 * r;
    if (lane % 4 == 0 && row < t) lse[row] = (m[r] + log2f(l[r])) * kLn2;
  }
  StoreRows<kHs, kMt>(y, o, inv, row_lo, t, head.ld_y, lane);
}

// dsum[b, h, t] = sum_d dy[b, h, t, d] * y[b, h, t, d]: one thread per 8-wide vector of the
// (B, T, C) inputs, in their order (coalesced); a head's HS channels are kHs / 8 consecutive
// vectors, aligned to kHs / 8 (C / 8 = NH * kHs / 8), so kHs / 8 adjacent lanes reduce one
// (b, t, h) row, written to dsum in the (B * NH * T) order of lse.
template <int kHs>
__global__ void RowDotKernel(float* __restrict__ dsum,       // (B * NH * T)
                             const bf16* __restrict__ dy,    // (B, T, C)
                             const bf16* __restrict__ y,     // (B, T, C)
                             int64_t vecs, int t, int nh) {  // vecs = B * T * C / 8
  constexpr int kLanes = kHs / internal::kVec;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  float acc = 0.0f;
  if (i < vecs) {
    float a[internal::kVec];
    float b[internal::kVec];
    internal::LoadVec(dy + i * internal::kVec, a);
    internal::LoadVec(y + i * internal::kVec, b);
#pragma unroll
    for (int e = 0; e < internal::kVec; ++e) acc += a[e] * b[e];
  }
  // Every lane takes part (the block size is a multiple of 32), so the shuffles are full.
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  }
  if (i < vecs && i % kLanes == 0) {
    const int64_t row_vecs = static_cast<int64_t>(nh) * kLanes;  // C / 8
    const int64_t bt = i / row_vecs;                             // b * T + t
    const int64_t h = (i % row_vecs) / kLanes;
    const int64_t bi = bt / t;
    const int64_t ti = bt % t;
    dsum[(bi * nh + h) * t + ti] = acc;
  }
}

template <int kHs, bool kDocs>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardKvKernel(bf16* __restrict__ dqkv,         // (B, T, (NH + 2 NKV) HS)
                          const bf16* __restrict__ qkv,    // (B, T, (NH + 2 NKV) HS)
                          const bf16* __restrict__ dy,     // (B, T, C)
                          const float* __restrict__ lse,   // (B * NH * T)
                          const float* __restrict__ dsum,  // (B * NH * T)
                          const KeyMask mask,              // doc_starts (B, T) or nullptr, window
                          int t, int nh, int nkv, float scale, float scale_log2) {
  using Cfg = Tiles<kHs>;
  constexpr int kStride = Cfg::kStride;
  constexpr int kTile = Cfg::kKvTile;     // keys per block
  constexpr int kBq = Cfg::kKvWalk;       // queries per step
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sk = reinterpret_cast<bf16*>(smem);  // (kTile, kStride)
  bf16* sv = sk + kTile * kStride;           // (kTile, kStride)
  bf16* sq = sv + kTile * kStride;           // 2 x (kBq, kStride)
  bf16* sdy = sq + 2 * kBq * kStride;        // 2 x (kBq, kStride)
  float* slse = reinterpret_cast<float*>(sdy + 2 * kBq * kStride);  // 2 x (kBq), log2 units
  float* sdsum = slse + 2 * kBq;                                     // 2 x (kBq)
  int* sstart = reinterpret_cast<int*>(sdsum + 2 * kBq);             // 2 x (kBq) doc starts
  const int warp = threadIdx.x / internal::kWarpSize;
  const int lane = threadIdx.x % internal::kWarpSize;
  // Block x = b * NKV + kv head; its group's query heads are b * NH + kv head * G + [0, G).
  const int group = nh / nkv;
  const int bi = blockIdx.x / nkv;
  const HeadBase head =
      HeadOffsets<kHs>(qkv, bi * nh + (blockIdx.x % nkv) * group, nh, nkv, t);
  const KeyMask doc = DocRow<kDocs>(mask, bi, t);
  bf16* dk = dqkv + head.k_off;
  bf16* dv = dqkv + head.v_off;
  dy += head.rows;
  lse += head.lse;
  dsum += head.lse;
  const int n_steps = (t + kBq - 1) / kBq;
  // The block's key tile and the query tiles [first, first + per_head) that see it: causally
  // tile blockIdx.y (tile 0 sees every query: heaviest first) and every query tile from its
  // diagonal on; with documents, PlanKeyTile's (heaviest first too).
  KeyTilePlan plan{static_cast<int>(blockIdx.y), 0};
  if constexpr (kDocs) plan = PlanKeyTile<kThreads, kTile, kBq>(doc, t, blockIdx.y);
  const int k0 = plan.tile * kTile;
  const int warp_key = k0 + warp * kWarpRows;
  const int key_lo = warp_key + lane / 4;  // this lane's keys: key_lo, key_lo + 8

  // Query tile at step_q0 of the group's query head g.
  const auto load_queries = [&](int g, int step_q0, int buf) {
    LoadTile<kHs, kBq>(sq + buf * kBq * kStride, head.q + g * kHs, step_q0, t, head.ld_qkv);
    LoadTile<kHs, kBq>(sdy + buf * kBq * kStride, dy + g * kHs, step_q0, t, head.ld_y);
    StageQueryStats<kBq, kThreads>(slse + buf * kBq, sdsum + buf * kBq, sstart + buf * kBq,
                                   lse + static_cast<size_t>(g) * t,
                                   dsum + static_cast<size_t>(g) * t, doc, step_q0, t);
  };
  LoadTile<kHs, kTile>(sk, head.k, k0, t, head.ld_qkv);
  LoadTile<kHs, kTile>(sv, head.v, k0, t, head.ld_qkv);
  const int first = k0 / kBq;  // the first query tile that reaches key k0
  const int per_head = kDocs ? plan.count : n_steps - first;
  load_queries(0, first * kBq, 0);
  CpAsyncCommit();
  // One walk over those query tiles of each of the G query heads in turn, so the prefetch
  // runs on across heads; dK and dV sum over the group in registers.
  const int walk = group * per_head;
  const int last = first + per_head;  // past the last query tile of a head

  float dk_acc[1][kHs / 8][4] = {};
  float dv_acc[1][kHs / 8][4] = {};
  // Step s is query tile i of the group's head g; (next_g, next_i) is step s + 1.
  for (int s = 0, g = 0, i = first; s < walk; ++s) {
    const int buf = s % 2;
    const bool head_done = i + 1 == last;
    const int next_g = head_done ? g + 1 : g;
    const int next_i = head_done ? first : i + 1;
    AwaitStep(s + 1 < walk, [&] { load_queries(next_g, next_i * kBq, 1 - buf); });
    const int q0 = i * kBq;
    g = next_g;
    i = next_i;
    const int* sstartb = sstart + buf * kBq;  // nondecreasing: [0] the least, [kBq - 1] most
    // Some query of the tile sees some key of the warp: causally, and within its document.
    if (q0 + kBq - 1 >= warp_key && (!kDocs || sstartb[0] <= warp_key + kWarpRows - 1)) {
      const bf16* sqb = sq + buf * kBq * kStride;
      const bf16* sdyb = sdy + buf * kBq * kStride;
      const float* slseb = slse + buf * kBq;
      const float* sdsumb = sdsum + buf * kBq;
      // P^T (16 keys, kBq queries) = exp(scale * K Q^T - lse[query]), 0 where key > query or
      // key < the query's doc start.
      float pt[1][kBq / 8][4] = {};
      MmaABt<kHs, 1, kBq>(pt, sk + warp * kWarpRows * kStride, sqb, lane);
      const bool straddles = warp_key + kWarpRows - 1 > q0;
      ForEachElement<1, kBq>(pt, lane, [&](float x, int r, int col, int, int, int) {
        const float p = exp2f(x * scale_log2 - slseb[col]);
        return straddles && key_lo + 8 * r > q0 + col ? 0.0f : p;
      });
      // Keys before a query's document: only where the step's last query (the largest start)
      // starts after the warp's first key. A pass of its own, as in the forward.
      if (kDocs && sstartb[kBq - 1] > warp_key) {
        ForEachElement<1, kBq>(pt, lane, [&](float p, int r, int col, int, int, int) {
          return key_lo + 8 * r < sstartb[col] ? 0.0f : p;
        });
      }
      float dpt[1][kBq / 8][4] = {};
      MmaABt<kHs, 1, kBq>(dpt, sv + warp * kWarpRows * kStride, sdyb, lane);  // dP^T = V dY^T
      MmaPB<kHs, 1, kBq>(dv_acc, pt, sdyb, lane);                              // dV += P^T dY
      // dS^T = P^T * (dP^T - D[query]) (the scale is applied to dK once, at the end).
      ForEachElement<1, kBq>(pt, lane, [&](float p, int, int col, int, int nt, int e) {
        return p * (dpt[0][nt][e] - sdsumb[col]);
      });
      MmaPB<kHs, 1, kBq>(dk_acc, pt, sqb, lane);  // dK += dS^T Q
    }
    __syncthreads();
  }
  const float dk_mul[2] = {scale, scale};
  const float dv_mul[2] = {1.0f, 1.0f};
  StoreRows<kHs, 1>(dk, dk_acc, dk_mul, key_lo, t, head.ld_qkv, lane);
  StoreRows<kHs, 1>(dv, dv_acc, dv_mul, key_lo, t, head.ld_qkv, lane);
}

template <int kHs, bool kDocs, bool kLong>
// (0 blocks an SM: no bound, as the causal kernel always had.)
__global__ void __launch_bounds__(kThreads, (kDocs && !kLong && kHs <= 64) ? 4 : 0)
    FlashBackwardQKernel(bf16* __restrict__ dqkv,         // (B, T, (NH + 2 NKV) HS), dq
                         const bf16* __restrict__ qkv,    // (B, T, (NH + 2 NKV) HS)
                         const bf16* __restrict__ dy,     // (B, T, C)
                         const float* __restrict__ lse,   // (B * NH * T)
                         const float* __restrict__ dsum,  // (B * NH * T)
                         const KeyMask mask,              // doc_starts (B, T) or nullptr, window
                         int t, int nh, int nkv, float scale, float scale_log2) {
  using Cfg = Tiles<kHs>;
  constexpr int kStride = Cfg::kStride;
  constexpr int kMt = QueryTiles<kHs, kDocs, kLong>::kMt;
  constexpr int kRows = 2 * kMt;
  constexpr int kTile = QueryTiles<kHs, kDocs, kLong>::kQTile;
  constexpr int kBk = Cfg::kQWalk;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sq = reinterpret_cast<bf16*>(smem);  // (kTile, kStride)
  bf16* sdy = sq + kTile * kStride;          // (kTile, kStride)
  bf16* sk = sdy + kTile * kStride;          // 2 x (kBk, kStride)
  bf16* sv = sk + 2 * kBk * kStride;         // 2 x (kBk, kStride)
  const int warp = threadIdx.x / internal::kWarpSize;
  const int lane = threadIdx.x % internal::kWarpSize;
  const HeadBase head = HeadOffsets<kHs>(qkv, blockIdx.x, nh, nkv, t);
  bf16* dq = dqkv + head.q_off;
  dy += head.rows;
  lse += head.lse;
  dsum += head.lse;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;
  const int warp_row = q0 + warp * kWarpRows * kMt;
  const int row_lo = warp_row + lane / 4;
  const KeyMask doc = DocRow<kDocs>(mask, blockIdx.x / nh, t);

  LoadTile<kHs, kTile>(sq, head.q, q0, t, head.ld_qkv);
  LoadTile<kHs, kTile>(sdy, dy, q0, t, head.ld_y);
  const int first = DocStart(doc, q0, t) / kBk;  // as the forward's walk
  LoadKeyTile<kHs, kBk>(sk, sv, head, first, 0, t);
  CpAsyncCommit();
  const RowStarts<kRows> starts = ReadRowStarts<kRows>(doc, warp_row, row_lo, t);
  float row_lse[kRows];  // log2 units
  float row_dsum[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int row = row_lo + 8 * r;
    // Padded rows are never stored; any finite value keeps them NaN-free.
    row_lse[r] = row < t ? lse[row] * kLog2e : 0.0f;
    row_dsum[r] = row < t ? dsum[row] : 0.0f;
  }
  const int n_steps = (min(t, q0 + kTile) + kBk - 1) / kBk;

  float dq_acc[kMt][kHs / 8][4] = {};
  const bf16* sdy_warp = sdy + warp * kWarpRows * kMt * kStride;
  WalkKeyTiles<kHs, kMt, kBk, kDocs>(
      sk, sv, sq + warp * kWarpRows * kMt * kStride, head, first, n_steps, warp_row,
      starts.warp_start, starts.warp_last_start, t, lane,
      [&](float(&s)[kMt][kBk / 8][4], int k0, bool straddles, bool before, const bf16* skb,
          const bf16* svb) {
        ForEachElement<kMt, kBk>(s, lane, [&](float x, int r, int col, int, int, int) {
          const float p = exp2f(x * scale_log2 - row_lse[r]);
          return straddles && k0 + col > row_lo + 8 * r ? 0.0f : p;  // P
        });
        if (before) MaskBeforeDocuments<kMt, kBk>(s, lane, k0, starts, 0.0f);
        float dp[kMt][kBk / 8][4] = {};
        MmaABt<kHs, kMt, kBk>(dp, sdy_warp, svb, lane);  // dP = dY V^T
        ForEachElement<kMt, kBk>(s, lane, [&](float p, int r, int, int mt, int nt, int e) {
          return p * (dp[mt][nt][e] - row_dsum[r]);  // dS / scale
        });
        MmaPB<kHs, kMt, kBk>(dq_acc, s, skb, lane);  // dQ += dS K
      });
  float mul[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) mul[r] = scale;
  StoreRows<kHs, kMt>(dq, dq_acc, mul, row_lo, t, head.ld_qkv, lane);
}

// ---- Hopper forward (sm_90a): wgmma ----
// The same walk as FlashForwardKernel at HS 64 and 128, on the warpgroup MMA: each of kGroups
// warpgroups owns 64 query rows of a kQTile-query tile and walks kBk keys a step. S = Q K^T
// reads Q and K from shared memory through descriptors (no ldmatrix, no per-warp fragments of
// K), the softmax runs on S in registers, and O += P V takes P from registers (the accumulator
// of S is, converted to bf16, wgmma's A fragment) and V from shared memory read N-major. Tiles
// sit in shared memory in wgmma's 128-byte swizzle: a tile of R rows is HS / 64 panels of
// (R, 64); a panel row is 128 bytes, and its 16-byte piece c is stored at piece c ^ (row % 8),
// so the 8 rows of a core matrix hit distinct banks. Loads are cp.async into kStages buffers.
// Only sm_90a code carries the body: other targets compile a trap, and the launcher only
// picks this kernel where the sm_90a code is what the GPU runs (HopperForwardRuns).
namespace hopper {

constexpr int kGroupThreads = 128;                  // a warpgroup
constexpr int kGroups = 2;
constexpr int kThreads = kGroups * kGroupThreads;
constexpr int kGroupRows = 64;                      // wgmma's M
constexpr int kQTile = kGroups * kGroupRows;
constexpr int kBk = 128;                            // keys a step: S is (64, 128) a warpgroup
constexpr int kStages = 3;                          // K and V buffers

// A block of the forward (kRows queries) and of the dK/dV kernel (kRows keys): kGroups
// warpgroups of kGroupRows rows each. With documents at HS 64, one warpgroup (64-row tiles):
// as in the mma.sync kernels (QueryTiles), a short document's blocks are bound by their first
// loads' latency, and with half the registers and shared memory two blocks share an SM and hide
// each other's (HS 128's buffers leave room for one block an SM either way); for dK/dV it also
// makes the blocks finer for PlanKeyTile to balance. The rows' arithmetic is the same
// (128-key tiles from 0 up to each row's; a 64-key tile at an odd multiple of 64 starts its
// walk a query tile later than within a 128-key tile, but that tile's P^T is all zeros for
// those keys), so doc_starts all zero still gives the causal bits.
template <int kHs, bool kDocs>
struct GroupBlock {
  static constexpr int kGroups = kDocs && kHs == 64 ? 1 : hopper::kGroups;
  static constexpr int kThreads = kGroups * kGroupThreads;
  static constexpr int kRows = kGroups * kGroupRows;
};

// Per head size (64 or 128): O is (64, kHs) a warpgroup, P V an m64n{kHs} product; a block
// of kQRows queries.
template <int kHs, int kQRows = kQTile>
struct Sizes {
  static_assert(kHs == 64 || kHs == 128, "head sizes 64 and 128");
  static constexpr int kQBytes = kQRows * kHs * 2;
  static constexpr int kKvBytes = kBk * kHs * 2;
  static constexpr size_t kSmemBytes = kQBytes + 2 * kStages * kKvBytes + 1024;  // + alignment
};

// The dK/dV kernel: each warpgroup owns 64 keys of a kKvKeys-key tile and walks kKvBq queries
// a step (S^T and dP^T are (64, kKvBq) a warpgroup).
constexpr int kKvKeys = kGroups * kGroupRows;
constexpr int kKvBq = 64;
constexpr int kKvStages = 3;  // Q and dO buffers
template <int kHs, int kKeys = kKvKeys>
struct KvSizes {
  static_assert(kHs == 64 || kHs == 128, "head sizes 64 and 128");
  static constexpr int kKeyBytes = kKeys * kHs * 2;  // K (or V)
  static constexpr int kStepBytes = kKvBq * kHs * 2;   // Q (or dO) of a step
  // + lse, D and the doc starts of each buffer's queries, + alignment
  static constexpr size_t kSmemBytes = 2 * kKeyBytes + 2 * kKvStages * kStepBytes +
                                       3 * kKvStages * kKvBq * sizeof(float) + 1024;
};

bool SupportedHeadSize(int hs) { return hs == 64 || hs == 128; }

static_assert(kBk == 128, "S is an m64n128 product");
static_assert(kBk == kQTile, "each warpgroup meets every key tile (no branch around a wgmma)");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // the helpers only the sm_90a body calls

constexpr int kPanelBytes = 128;             // a swizzled row: 64 bf16
constexpr int kCoreBytes = 8 * kPanelBytes;  // 8 rows: the swizzle's period

// The accumulator operands of an m64nN f32 wgmma: its N / 2 registers in the instruction, and
// their constraints (WEFT_WGMMA_D64("+f") for d[0..63] read and written). The N = 128 lists
// extend the N = 64 ones.
#define WEFT_WGMMA_R32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13," \
  " %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27," \
  " %28, %29, %30, %31"
#define WEFT_WGMMA_D32_REGS "{" WEFT_WGMMA_R32 "}"
#define WEFT_WGMMA_D64_REGS \
  "{" WEFT_WGMMA_R32 \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45" \
  ", %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59" \
  ", %60, %61, %62, %63" \
  "}"
#define WEFT_WGMMA_D32(c) \
  c(d[0]), c(d[1]), c(d[2]), c(d[3]), c(d[4]), c(d[5]), c(d[6]), c(d[7]), \
  c(d[8]), c(d[9]), c(d[10]), c(d[11]), c(d[12]), c(d[13]), c(d[14]), c(d[15]), \
  c(d[16]), c(d[17]), c(d[18]), c(d[19]), c(d[20]), c(d[21]), c(d[22]), c(d[23]), \
  c(d[24]), c(d[25]), c(d[26]), c(d[27]), c(d[28]), c(d[29]), c(d[30]), c(d[31])
#define WEFT_WGMMA_D64(c) \
  WEFT_WGMMA_D32(c), \
  c(d[32]), c(d[33]), c(d[34]), c(d[35]), c(d[36]), c(d[37]), c(d[38]), c(d[39]), \
  c(d[40]), c(d[41]), c(d[42]), c(d[43]), c(d[44]), c(d[45]), c(d[46]), c(d[47]), \
  c(d[48]), c(d[49]), c(d[50]), c(d[51]), c(d[52]), c(d[53]), c(d[54]), c(d[55]), \
  c(d[56]), c(d[57]), c(d[58]), c(d[59]), c(d[60]), c(d[61]), c(d[62]), c(d[63])

// d (64, 128) += A (64, 16) B (16, 128), both from shared memory (descriptors), both K-major
// (B read as the (128, 16) tile B^T).
__device__ inline void WgmmaSS(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WEFT_WGMMA_D64_REGS
               ", %64, %65, p, 1, 1, 0, 0;\n}\n"
               : WEFT_WGMMA_D64("+f")
               : "l"(a), "l"(b));
}

// d (64, 128) = A (64, 16) B (16, 128), as WgmmaSS but overwriting d, which is only written:
// with "+f" the compiler would materialize d's old values while earlier wgmmas are in flight.
__device__ inline void WgmmaSSFirst(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WEFT_WGMMA_D64_REGS
               ", %64, %65, p, 1, 1, 0, 0;\n}\n"
               : WEFT_WGMMA_D64("=f")
               : "l"(a), "l"(b));
}

// The (64, 64) forms of WgmmaSS and WgmmaSSFirst: the dK/dV kernel's S^T and dP^T, 64 keys by
// 64 queries.
__device__ inline void WgmmaSS(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WEFT_WGMMA_D32_REGS
               ", %32, %33, p, 1, 1, 0, 0;\n}\n"
               : WEFT_WGMMA_D32("+f")
               : "l"(a), "l"(b));
}
__device__ inline void WgmmaSSFirst(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WEFT_WGMMA_D32_REGS
               ", %32, %33, p, 1, 1, 0, 0;\n}\n"
               : WEFT_WGMMA_D32("=f")
               : "l"(a), "l"(b));
}

// d (64, 128) += A (64, 16) B (16, 128): A in registers (each warp's 16 rows in the
// mma.m16n8k16 A fragment), B from shared memory N-major ((16, 128), N contiguous).
__device__ inline void WgmmaRS(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WEFT_WGMMA_D64_REGS
               ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
               : WEFT_WGMMA_D64("+f")
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// The (64, 64) form of WgmmaRS, for head size 64.
__device__ inline void WgmmaRS(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WEFT_WGMMA_D32_REGS
               ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
               : WEFT_WGMMA_D32("+f")
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

__device__ inline void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ inline void WgmmaWaitAll() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// cp.async and st.shared write through the generic proxy, wgmma reads through the async one.
__device__ inline void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator across the asm statements
// around an in-flight wgmma, which do not name it.
template <int kN>
__device__ inline void Pin(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// A shared-memory matrix descriptor for the 128-byte swizzle. lbo: bytes between panels (read
// N-major only), sbo: bytes between groups of 8 rows.
__device__ inline uint64_t Descriptor(const void* p, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((SharedAddress(p) & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(lbo >> 4) << 16) | (static_cast<uint64_t>(sbo >> 4) << 32) |
         (1ull << 62);
}

// Rows [row0, row0 + kRows) of one head's (T, kHs) matrix, row stride ld elements, -> the
// swizzled tile at dst (1024-byte aligned). Rows at or past t are zero-filled. A thread copies
// the same 16-byte piece of every kPass-th row (CopyColumnChunks): its row's low 3 bits, and
// so its swizzled place in the row, never change.
template <int kHs, int kRows, int kBlockThreads = kThreads>
__device__ inline void LoadSwizzled(unsigned char* dst, const bf16* __restrict__ src, int row0,
                                    int t, int ld) {
  constexpr int kPieces = kHs / internal::kVec;  // 16-byte pieces per row
  constexpr int kPanelPieces = kPanelBytes / 16;
  constexpr int kPass = kBlockThreads / kPieces;  // rows a pass of the block copies
  static_assert(kPass % 8 == 0 && kRows % kPass == 0, "a thread's rows share their low 3 bits");
  const int piece = threadIdx.x % kPieces;
  const int r0 = threadIdx.x / kPieces;
  unsigned char* d = dst + (piece / kPanelPieces) * kRows * kPanelBytes + r0 * kPanelBytes +
                     ((piece % kPanelPieces) ^ (r0 % 8)) * 16;
  CopyColumnChunks<kRows / kPass, kPass>(d, kPass * kPanelBytes, src + piece * internal::kVec,
                                        row0 + r0, ld, t, row0 + kRows <= t);
}

// d = A B^T over the kHs channels, issued as wgmma SS products (the caller fences before and
// commits after): A is 64 rows at `a` of a swizzled tile of kARows rows, B is the rows at `b` of
// a tile of kBRows rows (64 or 128: d's kN / 2 columns), both K-major; each k-step takes 16
// channels, 32 bytes into a panel.
template <int kHs, int kARows, int kBRows, int kN>
__device__ inline void WgmmaABt(float (&d)[kN], const unsigned char* a, const unsigned char* b) {
#pragma unroll
  for (int ks = 0; ks < kHs / 16; ++ks) {
    const int panel = ks / (kPanelBytes / 32);
    const int at = (ks % (kPanelBytes / 32)) * 32;
    const uint64_t da = Descriptor(a + panel * kARows * kPanelBytes + at, 16, kCoreBytes);
    const uint64_t db = Descriptor(b + panel * kBRows * kPanelBytes + at, 16, kCoreBytes);
    if (ks == 0) {
      WgmmaSSFirst(d, da, db);
    } else {
      WgmmaSS(d, da, db);
    }
  }
}

#undef WEFT_WGMMA_R32
#undef WEFT_WGMMA_D32_REGS
#undef WEFT_WGMMA_D64_REGS
#undef WEFT_WGMMA_D32
#undef WEFT_WGMMA_D64

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <int kHs, bool kDocs>
__global__ void __launch_bounds__(GroupBlock<kHs, kDocs>::kThreads, 1)
    FlashForwardWgmmaKernel(bf16* __restrict__ y,          // (B, T, C)
                            float* __restrict__ lse,       // (B * NH * T)
                            const bf16* __restrict__ qkv,  // (B, T, (NH + 2 NKV) HS)
                            const KeyMask mask,            // doc_starts (B, T) or nullptr, window
                            int t, int nh, int nkv, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kBlockQ = GroupBlock<kHs, kDocs>::kRows;  // queries a block
  constexpr int kBlockThreads = GroupBlock<kHs, kDocs>::kThreads;
  constexpr int kQBytes = Sizes<kHs, kBlockQ>::kQBytes;
  constexpr int kKvBytes = Sizes<kHs, kBlockQ>::kKvBytes;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sq = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
  unsigned char* sk = sq + kQBytes;              // kStages x (kBk, kHs)
  unsigned char* sv = sk + kStages * kKvBytes;  // kStages x (kBk, kHs)
  const int group = threadIdx.x / kGroupThreads;
  const int warp = (threadIdx.x % kGroupThreads) / internal::kWarpSize;
  const int lane = threadIdx.x % internal::kWarpSize;
  const HeadBase head = HeadOffsets<kHs>(qkv, blockIdx.x, nh, nkv, t);
  y += head.rows;
  lse += head.lse;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBlockQ;
  const int group_row = q0 + group * kGroupRows;       // the warpgroup's first query
  const int row_lo = group_row + 16 * warp + lane / 4;  // this lane's rows: row_lo + 8 h
  const KeyMask doc = DocRow<kDocs>(mask, blockIdx.x / nh, t);

  LoadSwizzled<kHs, kBlockQ, kBlockThreads>(sq, head.q, q0, t, head.ld_qkv);
  // Keys [doc start of q0, q0 + kBlockQ), as the mma.sync forward's walk.
  const int first = DocStart(doc, q0, t) / kBk;
  LoadSwizzled<kHs, kBk, kBlockThreads>(sk, head.k, first * kBk, t, head.ld_qkv);
  LoadSwizzled<kHs, kBk, kBlockThreads>(sv, head.v, first * kBk, t, head.ld_qkv);
  CpAsyncCommit();
  const int n_steps = (min(t, q0 + kBlockQ) + kBk - 1) / kBk;
  // Doc starts of this lane's rows and of the warpgroup's last row (its largest): the tiles
  // before it hold keys of earlier documents for some row, masked like those past the
  // diagonal. The warpgroups multiply every tile of the block's walk (no branch around a
  // wgmma), a tile wholly before a warpgroup's rows' documents included: masked entirely.
  const int row_start[2] = {DocStart(doc, row_lo, t), DocStart(doc, row_lo + 8, t)};
  const int group_last_start = DocStart(doc, group_row + kGroupRows - 1, t);

  // Accumulator element i of a lane: row row_lo + 8 ((i / 2) % 2), column 8 (i / 4) +
  // 2 (lane % 4) + i % 2 (the mma.m16n8 layout, per warp, n-tile i / 4).
  float o[kHs / 2] = {};
  float m[2] = {-INFINITY, -INFINITY};  // running max (raw scores) of rows row_lo + 8 h
  float l[2] = {0.0f, 0.0f};            // this lane's share of the running sum
  const unsigned char* sq_group = sq + group * kGroupRows * kPanelBytes;
  // The pipeline, per warpgroup: step j issues S_j = Q K_j^T, then the loads of tile j + 1,
  // then waits for S_j and for P_{j-1} V_{j-1} (issued at the end of step j - 1, so it ran
  // behind the barrier and the loads), runs the softmax and issues P_j V_j without waiting.
  // Three buffers: tile j + 1 goes where tile j - 2 was, which every warpgroup's step j - 1
  // finished with (its wait on P_{j-2} V_{j-2}) before the barrier of step j.
  Pin(o);  // the zeros are made here, not sunk between wgmmas (which would serialize them)
  uint32_t p[kBk / 16][4];  // P_j as bf16 A fragments, read by the in-flight P_j V_j
  for (int j = first; j < n_steps; ++j) {
    const int buf = (j - first) % kStages;
    CpAsyncWait<0>();
    FenceProxyAsync();
    __syncthreads();  // tile j is in
    const int k0 = j * kBk;
    const unsigned char* skb = sk + buf * kKvBytes;
    const unsigned char* svb = sv + buf * kKvBytes;

    // No tile lies wholly above a warpgroup's rows (kBk a multiple of kBlockQ, tiles aligned),
    // so every warpgroup multiplies every tile: a branch around the wgmmas would make ptxas
    // serialize them.
    float s[64];
    WgmmaFence();
    WgmmaABt<kHs, kBlockQ, kBk>(s, sq_group, skb);
    WgmmaCommit();
    if (j + 1 < n_steps) {
      const int next = (j + 1 - first) % kStages;
      LoadSwizzled<kHs, kBk, kBlockThreads>(sk + next * kKvBytes, head.k, (j + 1) * kBk, t,
                                            head.ld_qkv);
      LoadSwizzled<kHs, kBk, kBlockThreads>(sv + next * kKvBytes, head.v, (j + 1) * kBk, t,
                                            head.ld_qkv);
      CpAsyncCommit();
    }
    WgmmaWaitAll();
    Pin(s);
    Pin(o);

    // Scores stay raw (unscaled) until the exponent, which folds the scale into one FMA;
    // only the tile on the diagonal is masked, and the tiles that cross a document start.
    if (k0 + kBk - 1 > group_row) {
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int col = k0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
        if (col > row_lo + 8 * ((i / 2) % 2)) s[i] = -INFINITY;
      }
    }
    if (kDocs && k0 < group_last_start) {
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int col = k0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
        if (col < row_start[(i / 2) % 2]) s[i] = -INFINITY;
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = m[h];
#pragma unroll
      for (int nt = 0; nt < kBk / 8; ++nt) {
        mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * h], s[4 * nt + 2 * h + 1]));
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // a quad shares a row
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row with no key yet keeps max -inf; subtracting 0 instead avoids -inf - -inf.
      const float base = mx == -INFINITY ? 0.0f : mx * scale_log2;
      const float corr = exp2f(m[h] * scale_log2 - base);
      m[h] = mx;
      l[h] *= corr;
#pragma unroll
      for (int nt = 0; nt < kHs / 8; ++nt) {
        o[4 * nt + 2 * h] *= corr;
        o[4 * nt + 2 * h + 1] *= corr;
      }
#pragma unroll
      for (int nt = 0; nt < kBk / 8; ++nt) {
        s[4 * nt + 2 * h] = exp2f(fmaf(s[4 * nt + 2 * h], scale_log2, -base));
        s[4 * nt + 2 * h + 1] = exp2f(fmaf(s[4 * nt + 2 * h + 1], scale_log2, -base));
        l[h] += s[4 * nt + 2 * h] + s[4 * nt + 2 * h + 1];
      }
    }

    // O += P V: 16 keys a step; V's 16 rows start 16 * 128 bytes further into each panel.
    // P's fragments are all made (and pinned) before the fence: made between the wgmmas, they
    // would have ptxas serialize them.
#pragma unroll
    for (int ks = 0; ks < kBk / 16; ++ks) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        p[ks][r] = PackBf16(s[8 * ks + 2 * r], s[8 * ks + 2 * r + 1]);
        asm volatile("" : "+r"(p[ks][r])::"memory");
      }
    }
    Pin(o);
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < kBk / 16; ++ks) {
      WgmmaRS(o, p[ks], Descriptor(svb + ks * 16 * kPanelBytes, kBk * kPanelBytes, kCoreBytes));
    }
    WgmmaCommit();
  }
  WgmmaWaitAll();
  Pin(o);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int row = row_lo + 8 * h;
    if (row >= t) continue;
    if (lane % 4 == 0) lse[row] = (m[h] * scale_log2 + log2f(l[h])) * kLn2;
    const float inv = 1.0f / l[h];
    bf16* dst = y + static_cast<size_t>(row) * head.ld_y + 2 * (lane % 4);
#pragma unroll
    for (int nt = 0; nt < kHs / 8; ++nt) {
      *reinterpret_cast<__nv_bfloat162*>(dst + nt * 8) =
          __floats2bfloat162_rn(o[4 * nt + 2 * h] * inv, o[4 * nt + 2 * h + 1] * inv);
    }
  }
#else
  __trap();  // never launched: HopperForwardRuns is false without sm_90a code
#endif
}

// dK and dV on the warpgroup MMA: the walk of FlashBackwardKvKernel (a block per kv head and
// key tile, over the query tiles of the group's query heads, dK and dV summed in registers).
// Each of the two warpgroups owns 64 keys of the block's 128 and every step takes kKvBq
// queries: S^T = K Q^T and dP^T = V dO^T from shared memory (both operands K-major), P^T and
// dS^T in registers, then dV += P^T dO and dK += dS^T Q with P^T and dS^T as A fragments and
// dO and Q read N-major, left in flight behind the next step's loads and products. Q, dO and
// the queries' lse and D come in kKvStages buffers.
// A long window alone (kLong, with kDocs; LongWalks) needs none of the documents' machinery: a
// key tile's walk ends at the query tile holding its last key's last viewer (k1 + w - 1), the
// key tiles in order are heaviest first already (only the last ones, which the sequence's end
// cuts, are lighter), and a pair is visible where 0 <= query - key < w, one unsigned compare.
// Staging each query's start and the separate masking pass cost the registers this kernel has
// none of (at HS 128 it spills even causal): on an H200 at Mistral-7B's attention (T = 16384,
// w = 4096) the kDocs build took 0.57 of causal's time (5.00 ms against 8.77), for 0.45 of its
// tiles; the mma.sync dK/dV kernel took 0.46.
template <int kHs, bool kDocs, bool kLong>
__global__ void __launch_bounds__(GroupBlock<kHs, kDocs && !kLong>::kThreads, 1)
    FlashBackwardKvWgmmaKernel(bf16* __restrict__ dqkv,         // (B, T, W), dk dv
                               const bf16* __restrict__ qkv,    // (B, T, W)
                               const bf16* __restrict__ dy,     // (B, T, C)
                               const float* __restrict__ lse,   // (B * NH * T)
                               const float* __restrict__ dsum,  // (B * NH * T)
                               const KeyMask mask,  // doc_starts (B, T) or nullptr, window
                               int t, int nh, int nkv, float scale, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(kDocs || !kLong, "a long window is a mask");
  constexpr bool kStarts = kDocs && !kLong;  // the queries' starts planned, staged and masked
  constexpr int kBlockKeys = GroupBlock<kHs, kStarts>::kRows;  // keys a block
  constexpr int kBlockThreads = GroupBlock<kHs, kStarts>::kThreads;
  using Cfg = KvSizes<kHs, kBlockKeys>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sk = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
  unsigned char* sv = sk + Cfg::kKeyBytes;
  unsigned char* sq = sv + Cfg::kKeyBytes;               // kKvStages x (kKvBq, kHs)
  unsigned char* sdo = sq + kKvStages * Cfg::kStepBytes;  // kKvStages x (kKvBq, kHs)
  float* slse = reinterpret_cast<float*>(sdo + kKvStages * Cfg::kStepBytes);  // log2 units
  float* sdsum = slse + kKvStages * kKvBq;
  int* sstart = reinterpret_cast<int*>(sdsum + kKvStages * kKvBq);  // the queries' doc starts
  const int group = threadIdx.x / kGroupThreads;
  const int warp = (threadIdx.x % kGroupThreads) / internal::kWarpSize;
  const int lane = threadIdx.x % internal::kWarpSize;
  // Block x = b * NKV + kv head; its group's query heads are b * NH + kv head * G + [0, G).
  const int heads = nh / nkv;
  const HeadBase head = HeadOffsets<kHs>(qkv, (blockIdx.x / nkv) * nh + (blockIdx.x % nkv) * heads,
                                         nh, nkv, t);
  const KeyMask doc = DocRow<kStarts>(mask, blockIdx.x / nkv, t);
  const int window = kLong ? mask.window : 0;
  dy += head.rows;
  lse += head.lse;
  dsum += head.lse;
  // The block's key tile, as FlashBackwardKvKernel's: blockIdx.y (heaviest first), or with
  // documents PlanKeyTile's.
  KeyTilePlan plan{static_cast<int>(blockIdx.y), 0};
  if constexpr (kStarts) {
    plan = PlanKeyTile<kBlockThreads, kBlockKeys, kKvBq>(doc, t, blockIdx.y);
  }
  const int k0 = plan.tile * kBlockKeys;
  const int group_key = k0 + group * kGroupRows;
  const int key_lo = group_key + 16 * warp + lane / 4;  // this lane's keys: key_lo + 8 h

  const auto load_queries = [&](int g, int q0, int buf) {
    LoadSwizzled<kHs, kKvBq, kBlockThreads>(sq + buf * Cfg::kStepBytes, head.q + g * kHs, q0, t,
                                            head.ld_qkv);
    LoadSwizzled<kHs, kKvBq, kBlockThreads>(sdo + buf * Cfg::kStepBytes, dy + g * kHs, q0, t,
                                            head.ld_y);
    StageQueryStats<kKvBq, kBlockThreads>(slse + buf * kKvBq, sdsum + buf * kKvBq,
                                     sstart + buf * kKvBq, lse + static_cast<size_t>(g) * t,
                                     dsum + static_cast<size_t>(g) * t, doc, q0, t);
  };
  LoadSwizzled<kHs, kBlockKeys, kBlockThreads>(sk, head.k, k0, t, head.ld_qkv);
  LoadSwizzled<kHs, kBlockKeys, kBlockThreads>(sv, head.v, k0, t, head.ld_qkv);
  const int first = k0 / kKvBq;  // the first query tile that reaches key k0
  const int n_tiles = (t + kKvBq - 1) / kKvBq;
  int per_head = kStarts ? plan.count : n_tiles - first;
  if constexpr (kLong) {  // through the tile of the block's last key's last viewer
    per_head = min(n_tiles, (k0 + kBlockKeys + window - 2) / kKvBq + 1) - first;
  }
  load_queries(0, first * kKvBq, 0);
  CpAsyncCommit();
  const int walk = heads * per_head;
  const int last = first + per_head;  // past the last query tile of a head

  // Accumulator element i of a lane: key row key_lo + 8 ((i / 2) % 2), column 8 (i / 4) +
  // 2 (lane % 4) + i % 2 (a query of the step for S^T, dP^T; a channel for dK, dV).
  float dk[kHs / 2] = {};
  float dv[kHs / 2] = {};
  Pin(dk);
  Pin(dv);
  uint32_t p[kKvBq / 16][4];   // P^T as bf16 A fragments, read by the in-flight dV product
  uint32_t ds[kKvBq / 16][4];  // dS^T (unscaled), read by the in-flight dK product
  const unsigned char* sk_group = sk + group * kGroupRows * kPanelBytes;
  const unsigned char* sv_group = sv + group * kGroupRows * kPanelBytes;
  for (int j = 0, g = 0, i = first; j < walk; ++j) {
    const int buf = j % kKvStages;
    CpAsyncWait<0>();
    FenceProxyAsync();
    __syncthreads();  // step j's queries are in; every warpgroup is done with step j - 2's
    const int q0 = i * kKvBq;
    const unsigned char* sqb = sq + buf * Cfg::kStepBytes;
    const unsigned char* sdob = sdo + buf * Cfg::kStepBytes;
    const float* slseb = slse + buf * kKvBq;
    const float* sdsumb = sdsum + buf * kKvBq;
    const int* sstartb = sstart + buf * kKvBq;

    float st[32];
    float dpt[32];
    WgmmaFence();
    WgmmaABt<kHs, kBlockKeys, kKvBq>(st, sk_group, sqb);    // S^T = K Q^T
    WgmmaABt<kHs, kBlockKeys, kKvBq>(dpt, sv_group, sdob);  // dP^T = V dO^T
    WgmmaCommit();
    // The next step's queries (of the next head once this one's are done).
    const bool head_done = i + 1 == last;
    const int next_g = head_done ? g + 1 : g;
    const int next_i = head_done ? first : i + 1;
    if (j + 1 < walk) {
      load_queries(next_g, next_i * kKvBq, (j + 1) % kKvStages);
      CpAsyncCommit();
    }
    g = next_g;
    i = next_i;
    WgmmaWaitAll();
    Pin(st);
    Pin(dpt);
    Pin(dk);
    Pin(dv);

    // P^T = exp(scale K Q^T - lse[query]), 0 where key > query (only the tiles that straddle
    // the diagonal hold such pairs) or key < the query's doc start (only where the step's
    // last query, its largest start, starts after the warpgroup's first key);
    // dS^T = P^T (dP^T - D[query]).
    // With a long window also 0 where query - key >= w (only where the step's last query's
    // window starts past the warpgroup's first key).
    const bool straddles = group_key + kGroupRows - 1 > q0;
    const bool edge = kLong && q0 + kKvBq - window > group_key;
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      const int col = 8 * (e / 4) + 2 * (lane % 4) + e % 2;
      const int key = key_lo + 8 * ((e / 2) % 2);
      float pe = exp2f(fmaf(st[e], scale_log2, -slseb[col]));
      if constexpr (kLong) {
        if ((straddles || edge) &&
            static_cast<unsigned>(q0 + col - key) >= static_cast<unsigned>(window)) {
          pe = 0.0f;
        }
      } else {
        if (straddles && key > q0 + col) pe = 0.0f;
      }
      st[e] = pe;
      dpt[e] = pe * (dpt[e] - sdsumb[col]);
    }
    if (kStarts && sstartb[kKvBq - 1] > group_key) {  // a pass of its own, as in mma.sync
#pragma unroll
      for (int e = 0; e < 32; ++e) {
        const int col = 8 * (e / 4) + 2 * (lane % 4) + e % 2;
        if (key_lo + 8 * ((e / 2) % 2) < sstartb[col]) {
          st[e] = 0.0f;
          dpt[e] = 0.0f;
        }
      }
    }
#pragma unroll
    for (int ks = 0; ks < kKvBq / 16; ++ks) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        p[ks][r] = PackBf16(st[8 * ks + 2 * r], st[8 * ks + 2 * r + 1]);
        ds[ks][r] = PackBf16(dpt[8 * ks + 2 * r], dpt[8 * ks + 2 * r + 1]);
        asm volatile("" : "+r"(p[ks][r]), "+r"(ds[ks][r])::"memory");
      }
    }
    Pin(dk);
    Pin(dv);
    WgmmaFence();
    // dV += P^T dO and dK += dS^T Q: 16 queries a k-step, 16 rows further into each panel.
#pragma unroll
    for (int ks = 0; ks < kKvBq / 16; ++ks) {
      WgmmaRS(dv, p[ks],
              Descriptor(sdob + ks * 16 * kPanelBytes, kKvBq * kPanelBytes, kCoreBytes));
    }
#pragma unroll
    for (int ks = 0; ks < kKvBq / 16; ++ks) {
      WgmmaRS(dk, ds[ks],
              Descriptor(sqb + ks * 16 * kPanelBytes, kKvBq * kPanelBytes, kCoreBytes));
    }
    WgmmaCommit();
  }
  WgmmaWaitAll();
  Pin(dk);
  Pin(dv);
  bf16* dk_out = dqkv + head.k_off;
  bf16* dv_out = dqkv + head.v_off;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = key_lo + 8 * h;
    if (key >= t) continue;
    const size_t at = static_cast<size_t>(key) * head.ld_qkv + 2 * (lane % 4);
#pragma unroll
    for (int nt = 0; nt < kHs / 8; ++nt) {
      *reinterpret_cast<__nv_bfloat162*>(dk_out + at + nt * 8) =
          __floats2bfloat162_rn(dk[4 * nt + 2 * h] * scale, dk[4 * nt + 2 * h + 1] * scale);
      *reinterpret_cast<__nv_bfloat162*>(dv_out + at + nt * 8) =
          __floats2bfloat162_rn(dv[4 * nt + 2 * h], dv[4 * nt + 2 * h + 1]);
    }
  }
#else
  __trap();  // never launched: HopperForwardRuns is false without sm_90a code
#endif
}

}  // namespace hopper

// ---- launchers ----

bool SupportedHeadSize(int hs) { return hs == 16 || hs == 32 || hs == 64 || hs == 128; }

absl::Status CheckShape(int b, int nh, int nkv, int t, int hs, const char* op) {
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(b, op, "b"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(nh, op, "nh"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(nkv, op, "nkv"));
  if (nh % nkv != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": nkv = ", nkv, " does not divide nh = ", nh));
  }
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(t, op, "t"));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPositive(hs, op, "hs"));
  if (!SupportedHeadSize(hs)) {
    return absl::UnimplementedError(
        absl::StrCat(op, ": head size hs = ", hs, " is not supported (16, 32, 64 or 128)"));
  }
  const int64_t heads = static_cast<int64_t>(b) * nh;
  // The grids' y is the number of tiles: the most with the smallest tile.
  if (heads > 0x7fffffff || (t + kMinTile - 1) / kMinTile > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": b * nh = ", heads, " or t = ", t, " exceeds the grid limits"));
  }
  // Row strides ((NH + 2 NKV) HS) and the RowDot grid are ints.
  const int64_t c = (static_cast<int64_t>(nh) + 2 * static_cast<int64_t>(nkv)) * hs;
  const int64_t vecs = heads * t * (hs / internal::kVec);
  if (c > 0x7fffffff ||
      (vecs + internal::kBlockSize - 1) / internal::kBlockSize > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": (nh + 2 nkv) * hs = ", c, " or b * nh * t = ", heads * t,
                     " is too large"));
  }
  return absl::OkStatus();
}

// A tile kernel's launch, opting it into more than the default 48 KiB of dynamic shared memory.
template <typename... Params, typename... Args>
absl::Status LaunchTiles(void (*kernel)(Params...), dim3 grid, size_t smem_bytes,
                         cudaStream_t stream, Args... args) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem_bytes)) != cudaSuccess) {
    cudaGetLastError();  // not sticky; say why instead
    int device = 0, limit = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    // Ampere's sm_86/sm_89 parts (A10, A40, L40S) allow 99 KiB a block; A100 and Hopper more.
    return absl::FailedPreconditionError(absl::StrCat(
        "flash attention: a block needs ", smem_bytes / 1024, " KiB of shared memory, GPU ",
        device, " allows ", limit / 1024, " KiB (a smaller head size, or an A100/H100 class GPU)"));
  }
  return internal::Launch(kernel, grid, kThreads, smem_bytes, stream, args...);
}

// Whether the masked forward and dQ kernels take the causal tiles (QueryTiles' kLong): a
// window alone, long enough that every block walks many key tiles (32 steps of dQ's at
// HS 128), at the head sizes the models run with a window (only HS 64 and 128 are built so).
// With documents the walks are as short as the documents, which the host does not know.
constexpr int kLongWindow = 1024;
bool LongWalks(const KeyMask& mask, int hs) {
  return mask.doc_starts == nullptr && mask.window >= kLongWindow && hs >= 64;
}

template <int kHs, bool kDocs, bool kLong>
absl::Status LaunchForward(bf16* y, float* lse, const bf16* qkv, const KeyMask& mask, int b, int nh,
                           int nkv, int t, cudaStream_t stream) {
  using Cfg = Tiles<kHs>;
  constexpr int kQTile = QueryTiles<kHs, kDocs, kLong>::kQTile;
  const size_t smem = (kQTile + 4 * Cfg::kWalk) * Cfg::kStride * sizeof(bf16);
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(kHs));
  const dim3 grid(b * nh, (t + kQTile - 1) / kQTile);
  return LaunchTiles(FlashForwardKernel<kHs, kDocs, kLong>, grid, smem, stream, y, lse, qkv, mask,
                     t, nh, nkv, scale_log2);
}

template <int kHs>
absl::Status LaunchForward(bf16* y, float* lse, const bf16* qkv, const KeyMask& mask, int b, int nh,
                           int nkv, int t, cudaStream_t stream) {
  if (!mask.Masked()) {
    return LaunchForward<kHs, false, false>(y, lse, qkv, mask, b, nh, nkv, t, stream);
  }
  if constexpr (kHs >= 64) {
    if (LongWalks(mask, kHs)) {
      return LaunchForward<kHs, true, true>(y, lse, qkv, mask, b, nh, nkv, t, stream);
    }
  }
  return LaunchForward<kHs, true, false>(y, lse, qkv, mask, b, nh, nkv, t, stream);
}

// Whether the Hopper forward runs on the current device: an sm_90 GPU running this build's
// sm_90a code for it (not the sm_80 PTX compiled at load, which carries no body), with the
// kernel's 225 KiB of shared memory a block at head size 128 (every sm_90 part has 227).
// Asked once per device.
bool HopperForwardRuns() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  constexpr int kDevices = 64;
  static std::atomic<int8_t> known[kDevices] = {};  // 0: not asked yet, 1: no, 2: yes
  if (device >= 0 && device < kDevices && known[device].load() != 0) {
    return known[device].load() == 2;
  }
  int major = 0, smem = 0;
  cudaFuncAttributes attr{};
  const bool runs =
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      major == 9 &&
      cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
          cudaSuccess &&
      static_cast<size_t>(smem) >= hopper::Sizes<128>::kSmemBytes &&
      cudaFuncGetAttributes(&attr, hopper::FlashForwardWgmmaKernel<128, false>) == cudaSuccess &&
      attr.binaryVersion >= 90 && attr.ptxVersion >= 90;
  cudaGetLastError();
  if (device >= 0 && device < kDevices) known[device].store(runs ? 2 : 1);
  return runs;
}

template <int kHs>
absl::Status LaunchForwardHopper(bf16* y, float* lse, const bf16* qkv, const KeyMask& mask, int b,
                                 int nh, int nkv, int t, cudaStream_t stream) {
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(kHs));
  const auto launch = [&](auto docs) {
    using Block = hopper::GroupBlock<kHs, decltype(docs)::value>;
    constexpr size_t kSmem = hopper::Sizes<kHs, Block::kRows>::kSmemBytes;
    const auto kernel = hopper::FlashForwardWgmmaKernel<kHs, decltype(docs)::value>;
    WEFT_BF16_RETURN_IF_ERROR(internal::AllowSharedBytes(kernel, kSmem));
    return internal::Launch(kernel, dim3(b * nh, (t + Block::kRows - 1) / Block::kRows),
                            Block::kThreads, kSmem, stream, y, lse, qkv, mask, t, nh, nkv,
                            scale_log2);
  };
  return mask.Masked() ? launch(std::true_type{}) : launch(std::false_type{});
}

// A second stream of the calling host thread on the current device, and the two events that
// fork it from a caller's stream and join it back: made on first use, kept for the thread's
// life (one set per thread and device, so one thread's calls, which are ordered, never record
// an event while another call still needs its earlier record).
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr;
  cudaEvent_t join = nullptr;
};
absl::Status ThreadSideStream(SideStream* out) {
  int device = 0;
  WEFT_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  constexpr int kDevices = 64;
  if (device < 0 || device >= kDevices) {
    return absl::FailedPreconditionError(
        absl::StrCat("flash attention backward: device ", device, " beyond ", kDevices));
  }
  thread_local SideStream sides[kDevices];
  SideStream& side = sides[device];
  if (side.stream == nullptr) {
    SideStream made;
    WEFT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&made.stream, cudaStreamNonBlocking));
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&made.fork, cudaEventDisableTiming));
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&made.join, cudaEventDisableTiming));
    side = made;
  }
  *out = side;
  return absl::OkStatus();
}

template <int kHs>
absl::Status LaunchBackward(bool hopper, bf16* dqkv, const bf16* dy, const bf16* y,
                            const float* lse, const bf16* qkv, const KeyMask& mask, float* dsum,
                            int b, int nh, int nkv, int t, cudaStream_t stream) {
  using Cfg = Tiles<kHs>;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHs));
  const float scale_log2 = scale * kLog2e;
  const int64_t vecs = static_cast<int64_t>(b) * t * nh * (kHs / internal::kVec);
  WEFT_BF16_RETURN_IF_ERROR(internal::Launch(
      RowDotKernel<kHs>, static_cast<int>((vecs + internal::kBlockSize - 1) / internal::kBlockSize),
      internal::kBlockSize, 0, stream, dsum, dy, y, vecs, t, nh));
  // dK, dV: a block per (kv head, key tile); dQ: a block per (query head, query tile).
  // With documents the two run side by side: both only read what the forward and RowDot wrote
  // and they write disjoint parts of dqkv. Short documents leave each latency-bound with an
  // uneven last wave (few blocks an SM, each walking few tiles), which the other's blocks fill
  // (on an H200, Llama-3.2-1B's attention at T = 4096 with ~300-token documents: 132 us for
  // the backward's kernels side by side, 139 us one after the other). So the dK/dV kernel
  // goes on the thread's side stream, forked from `stream` after RowDot and joined back before
  // this returns: to the caller it is still all on `stream`. Without documents they run one
  // after the other on `stream`, as they always have, and so with a long window alone
  // (LongWalks): its blocks walk long, as causal ones, and side by side measured no faster
  // (Mistral-7B's attention, T = 16384, window 4096, on an H200: 9.02-9.05 ms one after the
  // other, 9.08-9.12 side by side).
  cudaStream_t kv_stream = stream;
  SideStream side;
  const bool side_by_side = mask.Masked() && !LongWalks(mask, kHs);
  if (side_by_side) {
    WEFT_BF16_RETURN_IF_ERROR(ThreadSideStream(&side));
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(side.fork, stream));
    WEFT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side.stream, side.fork, 0));
    kv_stream = side.stream;
  }
  bool kv_done = false;
  if constexpr (kHs == 64 || kHs == 128) {
    if (hopper) {
      const auto launch = [&](auto docs, auto long_walks) {
        constexpr bool kDocs = decltype(docs)::value;
        constexpr bool kLong = decltype(long_walks)::value;
        using Block = hopper::GroupBlock<kHs, kDocs && !kLong>;
        constexpr size_t kSmem = hopper::KvSizes<kHs, Block::kRows>::kSmemBytes;
        const auto kernel = hopper::FlashBackwardKvWgmmaKernel<kHs, kDocs, kLong>;
        WEFT_BF16_RETURN_IF_ERROR(internal::AllowSharedBytes(kernel, kSmem));
        return internal::Launch(kernel, dim3(b * nkv, (t + Block::kRows - 1) / Block::kRows),
                                Block::kThreads, kSmem, kv_stream, dqkv, qkv, dy, lse,
                                static_cast<const float*>(dsum), mask, t, nh, nkv, scale,
                                scale_log2);
      };
      if (!mask.Masked()) {
        WEFT_BF16_RETURN_IF_ERROR(launch(std::false_type{}, std::false_type{}));
      } else if (LongWalks(mask, kHs)) {
        WEFT_BF16_RETURN_IF_ERROR(launch(std::true_type{}, std::true_type{}));
      } else {
        WEFT_BF16_RETURN_IF_ERROR(launch(std::true_type{}, std::false_type{}));
      }
      kv_done = true;
    }
  }
  if (!kv_done) {
    // + two buffers of the queries' lse, D and doc starts
    const size_t kv_smem = (2 * Cfg::kKvTile + 4 * Cfg::kKvWalk) * Cfg::kStride * sizeof(bf16) +
                           6 * Cfg::kKvWalk * sizeof(float);
    const auto kernel =
        mask.Masked() ? FlashBackwardKvKernel<kHs, true> : FlashBackwardKvKernel<kHs, false>;
    WEFT_BF16_RETURN_IF_ERROR(LaunchTiles(
        kernel, dim3(b * nkv, (t + Cfg::kKvTile - 1) / Cfg::kKvTile), kv_smem, kv_stream, dqkv, qkv,
        dy, lse, static_cast<const float*>(dsum), mask, t, nh, nkv, scale, scale_log2));
  }
  int q_tile = QueryTiles<kHs, false>::kQTile;
  auto q_kernel = FlashBackwardQKernel<kHs, false, false>;
  if (mask.Masked()) {
    q_tile = QueryTiles<kHs, true>::kQTile;
    q_kernel = FlashBackwardQKernel<kHs, true, false>;
    if constexpr (kHs >= 64) {
      if (LongWalks(mask, kHs)) {
        q_tile = QueryTiles<kHs, true, true>::kQTile;
        q_kernel = FlashBackwardQKernel<kHs, true, true>;
      }
    }
  }
  const size_t q_smem = (2 * q_tile + 4 * Cfg::kQWalk) * Cfg::kStride * sizeof(bf16);
  const absl::Status q_status =
      LaunchTiles(q_kernel, dim3(b * nh, (t + q_tile - 1) / q_tile), q_smem, stream, dqkv, qkv, dy,
                  lse, static_cast<const float*>(dsum), mask, t, nh, nkv, scale, scale_log2);
  if (side_by_side) {  // join, whatever became of the dQ launch
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(side.join, side.stream));
    WEFT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, side.join, 0));
  }
  return q_status;
}

}  // namespace

bool FlashAttentionSupported(int hs) { return SupportedHeadSize(hs); }

size_t FlashAttentionBackwardScratchFloats(int b, int nh, int t, int hs) {
  (void)hs;
  return static_cast<size_t>(std::max(b, 0)) * std::max(nh, 0) * std::max(t, 0);
}

bool FlashAttentionHopperForward(int hs) {
  return hopper::SupportedHeadSize(hs) && HopperForwardRuns();
}

namespace {

// Into *hopper, whether `kernel` means the Hopper (wgmma) kernels at head size hs on this
// device (kAuto: wherever they run); FAILED_PRECONDITION, naming `op`, for kHopper where they
// do not.
absl::Status UseHopper(FlashAttentionKernel kernel, int hs, const char* op, bool* hopper) {
  const bool runs = FlashAttentionHopperForward(hs);
  if (kernel == FlashAttentionKernel::kHopper && !runs) {
    return absl::FailedPreconditionError(absl::StrCat(
        op, ": the Hopper (wgmma) kernels need head size 64 or 128 (hs = ", hs,
        ") and an sm_90 GPU running this build's sm_90a code"));
  }
  *hopper = runs && kernel != FlashAttentionKernel::kMmaSync;
  return absl::OkStatus();
}

absl::Status CheckWindow(int window, const char* op) {
  if (window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": window = ", window, " is negative (0: no window)"));
  }
  return absl::OkStatus();
}

// The kernels' mask. A window of T or more hides no key of any row: it runs as no window, on
// the plain causal kernels (or the documents' alone), not on the masked ones for nothing.
KeyMask Mask(const int32_t* doc_starts, int window, int t) {
  return {doc_starts, window >= t ? 0 : window};
}

}  // namespace

absl::Status FlashAttentionForward(bf16* y, float* lse, const bf16* qkv, const int32_t* doc_starts,
                                   int window, int b, int nh, int nkv, int t, int hs,
                                   cudaStream_t stream) {
  return FlashAttentionForwardWith(FlashAttentionKernel::kAuto, y, lse, qkv, doc_starts, window, b,
                                   nh, nkv, t, hs, stream);
}

absl::Status FlashAttentionForwardWith(FlashAttentionKernel kernel, bf16* y, float* lse,
                                       const bf16* qkv, const int32_t* doc_starts, int window,
                                       int b, int nh, int nkv, int t, int hs, cudaStream_t stream) {
  constexpr const char* kOp = "flash attention forward";
  WEFT_BF16_RETURN_IF_ERROR(CheckShape(b, nh, nkv, t, hs, kOp));
  WEFT_BF16_RETURN_IF_ERROR(CheckWindow(window, kOp));
  WEFT_BF16_RETURN_IF_ERROR(
      internal::CheckPointers(kOp, {internal::Aligned16(y, "y"), internal::NotNull(lse, "lse"),
                                    internal::Aligned16(qkv, "qkv")}));
  bool hopper = false;
  WEFT_BF16_RETURN_IF_ERROR(UseHopper(kernel, hs, kOp, &hopper));
  const KeyMask doc = Mask(doc_starts, window, t);
  if (hopper) {
    return hs == 128 ? LaunchForwardHopper<128>(y, lse, qkv, doc, b, nh, nkv, t, stream)
                     : LaunchForwardHopper<64>(y, lse, qkv, doc, b, nh, nkv, t, stream);
  }
  switch (hs) {
    case 16:
      return LaunchForward<16>(y, lse, qkv, doc, b, nh, nkv, t, stream);
    case 32:
      return LaunchForward<32>(y, lse, qkv, doc, b, nh, nkv, t, stream);
    case 64:
      return LaunchForward<64>(y, lse, qkv, doc, b, nh, nkv, t, stream);
    default:
      return LaunchForward<128>(y, lse, qkv, doc, b, nh, nkv, t, stream);
  }
}

absl::Status FlashAttentionBackward(bf16* dqkv, const bf16* dy, const bf16* y, const float* lse,
                                    const bf16* qkv, const int32_t* doc_starts, int window,
                                    float* scratch, int b, int nh, int nkv, int t, int hs,
                                    cudaStream_t stream) {
  return FlashAttentionBackwardWith(FlashAttentionKernel::kAuto, dqkv, dy, y, lse, qkv, doc_starts,
                                    window, scratch, b, nh, nkv, t, hs, stream);
}

absl::Status FlashAttentionBackwardWith(FlashAttentionKernel kernel, bf16* dqkv, const bf16* dy,
                                        const bf16* y, const float* lse, const bf16* qkv,
                                        const int32_t* doc_starts, int window, float* scratch,
                                        int b, int nh, int nkv, int t, int hs,
                                        cudaStream_t stream) {
  constexpr const char* kOp = "flash attention backward";
  WEFT_BF16_RETURN_IF_ERROR(CheckShape(b, nh, nkv, t, hs, kOp));
  WEFT_BF16_RETURN_IF_ERROR(CheckWindow(window, kOp));
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      kOp, {internal::Aligned16(dqkv, "dqkv"), internal::Aligned16(dy, "dy"),
            internal::Aligned16(y, "y"), internal::NotNull(lse, "lse"),
            internal::Aligned16(qkv, "qkv"), internal::NotNull(scratch, "scratch")}));
  if (dqkv == qkv) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": dqkv must not alias qkv (still read while dqkv is written)"));
  }
  bool hopper = false;
  WEFT_BF16_RETURN_IF_ERROR(UseHopper(kernel, hs, kOp, &hopper));
  const KeyMask doc = Mask(doc_starts, window, t);
  switch (hs) {
    case 16:
      return LaunchBackward<16>(false, dqkv, dy, y, lse, qkv, doc, scratch, b, nh, nkv, t, stream);
    case 32:
      return LaunchBackward<32>(false, dqkv, dy, y, lse, qkv, doc, scratch, b, nh, nkv, t, stream);
    case 64:
      return LaunchBackward<64>(hopper, dqkv, dy, y, lse, qkv, doc, scratch, b, nh, nkv, t,
                                stream);
    default:
      return LaunchBackward<128>(hopper, dqkv, dy, y, lse, qkv, doc, scratch, b, nh, nkv, t,
                                 stream);
  }
}

}  // namespace weft::engine::cuda
