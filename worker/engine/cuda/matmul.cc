#include "worker/engine/cuda/matmul.h"

#include <dlfcn.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/cuda/cuda_check.h"

namespace weft::engine::cuda {
namespace {

// cuBLAS and cuBLASLt are opened with dlopen on first use instead of being linked. Linked,
// their thread-local storage (about 100 KiB for cuBLASLt) joins the static TLS block that every
// thread of the process must fit in its stack, and threads created with small fixed stacks
// then fail to start: civetweb's (the Prometheus endpoint) did, with EINVAL from
// pthread_create. Opened later, the libraries' TLS is allocated per thread on demand.
struct CublasApi {
#define WEFT_CUBLAS_FN(name) decltype(&::name) name = nullptr
  WEFT_CUBLAS_FN(cublasLtCreate);
  WEFT_CUBLAS_FN(cublasLtDestroy);
  WEFT_CUBLAS_FN(cublasLtMatmulDescCreate);
  WEFT_CUBLAS_FN(cublasLtMatmulDescDestroy);
  WEFT_CUBLAS_FN(cublasLtMatmulDescSetAttribute);
  WEFT_CUBLAS_FN(cublasLtMatrixLayoutCreate);
  WEFT_CUBLAS_FN(cublasLtMatrixLayoutDestroy);
  WEFT_CUBLAS_FN(cublasLtMatmulPreferenceCreate);
  WEFT_CUBLAS_FN(cublasLtMatmulPreferenceDestroy);
  WEFT_CUBLAS_FN(cublasLtMatmulPreferenceSetAttribute);
  WEFT_CUBLAS_FN(cublasLtMatmulAlgoGetHeuristic);
  WEFT_CUBLAS_FN(cublasLtMatmul);
  WEFT_CUBLAS_FN(cublasCreate_v2);
  WEFT_CUBLAS_FN(cublasDestroy_v2);
  WEFT_CUBLAS_FN(cublasSetStream_v2);
  WEFT_CUBLAS_FN(cublasSetWorkspace_v2);
  // Overloaded in C++ (an _64 variant); the C entry point's type.
  cublasStatus_t (*cublasGemmStridedBatchedEx)(
      cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
      const void*, cudaDataType, int, long long, const void*, cudaDataType, int, long long,
      const void*, void*, cudaDataType, int, long long, int, cublasComputeType_t,
      cublasGemmAlgo_t) = nullptr;
  WEFT_CUBLAS_FN(cublasGetStatusName);
  WEFT_CUBLAS_FN(cublasGetStatusString);
#undef WEFT_CUBLAS_FN
};

// The libraries of the CUDA major version this was built against.
constexpr const char* kCublasLtLibrary = "libcublasLt.so.13";
constexpr const char* kCublasLibrary = "libcublas.so.13";

absl::StatusOr<const CublasApi*> LoadCublas() {
  static const absl::StatusOr<const CublasApi*> api = []() -> absl::StatusOr<const CublasApi*> {
    void* lt = dlopen(kCublasLtLibrary, RTLD_NOW | RTLD_GLOBAL);
    if (lt == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("cannot load ", kCublasLtLibrary, ": ",
                                                        dlerror()));
    }
    void* blas = dlopen(kCublasLibrary, RTLD_NOW | RTLD_GLOBAL);
    if (blas == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("cannot load ", kCublasLibrary, ": ",
                                                        dlerror()));
    }
    auto* table = new CublasApi;  // lives as long as the process, like the libraries
    std::string missing;
    const auto resolve = [&](void* lib, auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
    };
#define WEFT_RESOLVE(lib, name) resolve(lib, table->name, #name)
    WEFT_RESOLVE(lt, cublasLtCreate);
    WEFT_RESOLVE(lt, cublasLtDestroy);
    WEFT_RESOLVE(lt, cublasLtMatmulDescCreate);
    WEFT_RESOLVE(lt, cublasLtMatmulDescDestroy);
    WEFT_RESOLVE(lt, cublasLtMatmulDescSetAttribute);
    WEFT_RESOLVE(lt, cublasLtMatrixLayoutCreate);
    WEFT_RESOLVE(lt, cublasLtMatrixLayoutDestroy);
    WEFT_RESOLVE(lt, cublasLtMatmulPreferenceCreate);
    WEFT_RESOLVE(lt, cublasLtMatmulPreferenceDestroy);
    WEFT_RESOLVE(lt, cublasLtMatmulPreferenceSetAttribute);
    WEFT_RESOLVE(lt, cublasLtMatmulAlgoGetHeuristic);
    WEFT_RESOLVE(lt, cublasLtMatmul);
    WEFT_RESOLVE(blas, cublasCreate_v2);
    WEFT_RESOLVE(blas, cublasDestroy_v2);
    WEFT_RESOLVE(blas, cublasSetStream_v2);
    WEFT_RESOLVE(blas, cublasSetWorkspace_v2);
    WEFT_RESOLVE(blas, cublasGemmStridedBatchedEx);
    WEFT_RESOLVE(blas, cublasGetStatusName);
    WEFT_RESOLVE(blas, cublasGetStatusString);
#undef WEFT_RESOLVE
    if (!missing.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuBLAS libraries lack symbols: ", missing));
    }
    return table;
  }();
  return api;
}

// The loaded table; only called after Blas::Create succeeded, which loaded it.
const CublasApi& Api() { return **LoadCublas(); }

absl::Status BlasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", Api().cublasGetStatusName(status), " (",
                                          Api().cublasGetStatusString(status), ")"));
}

#define WEFT_BLAS_RETURN_IF_ERROR(expr)                                            \
  do {                                                                             \
    const cublasStatus_t weft_blas_status_ = (expr);                               \
    if (weft_blas_status_ != CUBLAS_STATUS_SUCCESS) return BlasStatus(weft_blas_status_, #expr); \
  } while (0)

absl::Status CheckDims(const char* op, int a, int b, int c) {
  if (a <= 0 || b <= 0 || c <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dimensions must be positive, got ", a, ", ", b, ", ", c));
  }
  return absl::OkStatus();
}

// A Linear GEMM's checks: its buffers are not null (`names` lists them for the message), then
// its dimensions.
absl::Status CheckLinear(const char* op, const char* names,
                         std::initializer_list<const void*> buffers, int n, int c, int oc) {
  for (const void* buffer : buffers) {
    if (buffer == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", names, " must not be null"));
    }
  }
  return CheckDims(op, n, c, oc);
}

// The GELU epilogues' aux matrix is accessed in vectors: its leading dimension is a multiple
// of 8.
absl::Status CheckMultipleOf8(const char* op, const char* name, int x) {
  if (x % 8 == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, " must be a multiple of 8, got ", x));
}

}  // namespace

Blas::Blas(const BlasOptions& options) : options_(options) {}

Blas::~Blas() {
  const auto destroy = [](Plan& plan) {
    if (plan.desc != nullptr) Api().cublasLtMatmulDescDestroy(plan.desc);
    if (plan.a != nullptr) Api().cublasLtMatrixLayoutDestroy(plan.a);
    if (plan.b != nullptr) Api().cublasLtMatrixLayoutDestroy(plan.b);
    if (plan.d != nullptr) Api().cublasLtMatrixLayoutDestroy(plan.d);
  };
  for (auto& [key, plan] : plans_) destroy(*plan);
  for (auto& [key, plan] : fp8_plans_) destroy(*plan);
  if (handle_ != nullptr) Api().cublasDestroy_v2(handle_);
  if (lt_ != nullptr) Api().cublasLtDestroy(lt_);
  if (workspace_ != nullptr) cudaFree(workspace_);
}

absl::StatusOr<std::unique_ptr<Blas>> Blas::Create(const BlasOptions& options) {
  if (absl::StatusOr<const CublasApi*> api = LoadCublas(); !api.ok()) return api.status();
  std::unique_ptr<Blas> blas(new Blas(options));
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtCreate(&blas->lt_));
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasCreate_v2(&blas->handle_));
  WEFT_CUDA_RETURN_IF_ERROR(cudaMalloc(&blas->workspace_, options.workspace_bytes));
  WEFT_BLAS_RETURN_IF_ERROR(
      Api().cublasSetWorkspace_v2(blas->handle_, blas->workspace_, options.workspace_bytes));
  // Tensor-core math with fp32 accumulation is what CUBLAS_COMPUTE_32F asks for below; the
  // pointer mode stays host (alpha and beta are host scalars).
  return blas;
}

absl::StatusOr<Blas::Plan*> Blas::GetPlan(const PlanKey& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  const auto [trans_a, trans_b, m, n, k, d_fp32, epilogue_kind, accumulate] = key;
  const bool with_bias = epilogue_kind == kBias || epilogue_kind == kGeluAuxBias;
  auto plan = std::make_unique<Plan>();
  WEFT_BLAS_RETURN_IF_ERROR(
      Api().cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulDescSetAttribute(
      plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulDescSetAttribute(
      plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (epilogue_kind != kPlain) {
    const cublasLtEpilogue_t epilogue = epilogue_kind == kBias         ? CUBLASLT_EPILOGUE_BIAS
                                        : epilogue_kind == kGeluAuxBias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                        : CUBLASLT_EPILOGUE_DGELU;
    WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  }
  if (epilogue_kind == kGeluAuxBias || epilogue_kind == kDGelu) {
    // The pre-activation has D's shape: column-major (m, n), leading dimension m.
    const int64_t aux_ld = m;
    WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    const cudaDataType_t aux_type = CUDA_R_16BF;
    WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof(aux_type)));
  }
  if (with_bias) {
    const cudaDataType_t bias_type = CUDA_R_16BF;
    WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  // Stored shapes (column-major): op(A) is (m, k), op(B) is (k, n), D is (m, n).
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, trans_a ? k : m,
                                                       trans_a ? m : k, trans_a ? k : m));
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, trans_b ? n : k,
                                                       trans_b ? k : n, trans_b ? n : k));
  WEFT_BLAS_RETURN_IF_ERROR(
      Api().cublasLtMatrixLayoutCreate(&plan->d, d_fp32 ? CUDA_R_32F : CUDA_R_16BF, m, n, m));
  WEFT_RETURN_IF_ERROR(ChooseAlgorithm(
      plan.get(),
      absl::StrCat("m=", m, " n=", n, " k=", k, d_fp32 ? " fp32" : " bf16", " output, epilogue ",
                   epilogue_kind, accumulate ? ", accumulating" : "")));
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status Blas::ChooseAlgorithm(Plan* plan, const std::string& what) {
  cublasLtMatmulPreference_t preference = nullptr;
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulPreferenceCreate(&preference));
  const size_t workspace = options_.workspace_bytes;
  Api().cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                       &workspace, sizeof(workspace));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = Api().cublasLtMatmulAlgoGetHeuristic(
      lt_, plan->desc, plan->a, plan->b, plan->d, plan->d, preference, 1, &result, &found);
  Api().cublasLtMatmulPreferenceDestroy(preference);
  WEFT_BLAS_RETURN_IF_ERROR(status);
  if (found == 0) {
    return absl::UnimplementedError(absl::StrCat("cuBLASLt has no algorithm for ", what));
  }
  plan->algo = result.algo;
  return absl::OkStatus();
}

namespace {

cudaDataType_t Fp8Type(int format) {
  return static_cast<Fp8Format>(format) == Fp8Format::kE4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

}  // namespace

absl::StatusOr<Blas::Plan*> Blas::GetFp8Plan(const Fp8PlanKey& key) {
  auto it = fp8_plans_.find(key);
  if (it != fp8_plans_.end()) return it->second.get();
  const auto [a_format, b_format, m, n, k, d_fp32, bias, accumulate, fast_accum] = key;
  auto plan = std::make_unique<Plan>();
  WEFT_BLAS_RETURN_IF_ERROR(
      Api().cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = CUBLAS_OP_T;
  const cublasOperation_t op_b = CUBLAS_OP_N;
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulDescSetAttribute(
      plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulDescSetAttribute(
      plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  const int8_t fast = fast_accum ? 1 : 0;
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulDescSetAttribute(
      plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  if (bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    const cudaDataType_t bias_type = CUDA_R_16BF;
    WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  // Column-major: A stored (k, m) and transposed, B stored (k, n), D (m, n).
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatrixLayoutCreate(&plan->a, Fp8Type(a_format), k, m, k));
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatrixLayoutCreate(&plan->b, Fp8Type(b_format), k, n, k));
  WEFT_BLAS_RETURN_IF_ERROR(
      Api().cublasLtMatrixLayoutCreate(&plan->d, d_fp32 ? CUDA_R_32F : CUDA_R_16BF, m, n, m));
  WEFT_RETURN_IF_ERROR(ChooseAlgorithm(
      plan.get(), absl::StrCat("FP8 ", Fp8FormatName(static_cast<Fp8Format>(a_format)), " x ",
                               Fp8FormatName(static_cast<Fp8Format>(b_format)), " m=", m, " n=", n,
                               " k=", k, d_fp32 ? " fp32" : " bf16", " output",
                               bias ? ", bias" : "", accumulate ? ", accumulating" : "")));
  Plan* raw = plan.get();
  fp8_plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status Blas::LtMatmul(const PlanKey& key, void* d, const bf16* a, const bf16* b,
                            const bf16* bias, cudaStream_t stream, const bf16* aux,
                            const void* c) {
  absl::StatusOr<Plan*> plan = GetPlan(key);
  if (!plan.ok()) return plan.status();
  if (bias != nullptr) {
    WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulDescSetAttribute(
        (*plan)->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (aux != nullptr) {
    WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulDescSetAttribute(
        (*plan)->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  }
  const float alpha = 1.0f;
  const float beta = std::get<7>(key) ? 1.0f : 0.0f;
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmul(lt_, (*plan)->desc, &alpha, a, (*plan)->a, b,
                                           (*plan)->b, &beta, c != nullptr ? c : d, (*plan)->d,
                                           d, (*plan)->d,
                                           &(*plan)->algo, workspace_, options_.workspace_bytes,
                                           stream));
  return absl::OkStatus();
}

absl::Status Blas::LinearForward(bf16* out, const bf16* inp, const bf16* weight,
                                 const bf16* bias, int n, int c, int oc, cudaStream_t stream) {
  WEFT_RETURN_IF_ERROR(
      CheckLinear("LinearForward", "out, inp and weight", {out, inp, weight}, n, c, oc));
  // Column-major: out^T (OC, N) = weight (OC, C) [stored as (C, OC)]^T-op x inp^T (C, N).
  return LtMatmul({true, false, oc, n, c, false, bias != nullptr ? kBias : kPlain, false}, out,
                  weight, inp, bias, stream);
}

absl::Status Blas::LinearForwardResidual(bf16* out, const bf16* inp, const bf16* weight,
                                         const bf16* bias, const bf16* residual, int n, int c,
                                         int oc, cudaStream_t stream) {
  WEFT_RETURN_IF_ERROR(CheckLinear("LinearForwardResidual", "out, inp, weight and residual",
                                   {out, inp, weight, residual}, n, c, oc));
  // As LinearForward, with C = the residual (laid out as out) and beta = 1.
  return LtMatmul({true, false, oc, n, c, false, bias != nullptr ? kBias : kPlain, true}, out,
                  weight, inp, bias, stream, nullptr, residual);
}

absl::Status Blas::LinearForwardGelu(bf16* out, bf16* pre, const bf16* inp, const bf16* weight,
                                     const bf16* bias, int n, int c, int oc,
                                     cudaStream_t stream) {
  constexpr const char* kOp = "LinearForwardGelu";
  WEFT_RETURN_IF_ERROR(
      CheckLinear(kOp, "out, pre, inp, weight and bias", {out, pre, inp, weight, bias}, n, c, oc));
  WEFT_RETURN_IF_ERROR(CheckMultipleOf8(kOp, "oc", oc));
  return LtMatmul({true, false, oc, n, c, false, kGeluAuxBias, false}, out, weight, inp, bias,
                  stream, pre);
}

absl::Status Blas::LinearBackwardInputGelu(bf16* dinp, const bf16* dout, const bf16* weight,
                                           const bf16* pre, int n, int c, int oc,
                                           cudaStream_t stream) {
  constexpr const char* kOp = "LinearBackwardInputGelu";
  WEFT_RETURN_IF_ERROR(
      CheckLinear(kOp, "dinp, dout, weight and pre", {dinp, dout, weight, pre}, n, c, oc));
  WEFT_RETURN_IF_ERROR(CheckMultipleOf8(kOp, "c", c));
  return LtMatmul({false, false, c, n, oc, false, kDGelu, false}, dinp, weight, dout, nullptr,
                  stream, pre);
}

absl::Status Blas::LinearBackwardInput(bf16* dinp, const bf16* dout, const bf16* weight, int n,
                                       int c, int oc, cudaStream_t stream) {
  WEFT_RETURN_IF_ERROR(
      CheckLinear("LinearBackwardInput", "dinp, dout and weight", {dinp, dout, weight}, n, c, oc));
  // dinp^T (C, N) = weight^T (C, OC) x dout^T (OC, N).
  return LtMatmul({false, false, c, n, oc, false, kPlain, false}, dinp, weight, dout, nullptr,
                  stream);
}

absl::Status Blas::LinearBackwardWeight(float* dweight, const bf16* dout, const bf16* inp, int n,
                                        int c, int oc, bool accumulate, cudaStream_t stream) {
  WEFT_RETURN_IF_ERROR(
      CheckLinear("LinearBackwardWeight", "dweight, dout and inp", {dweight, dout, inp}, n, c, oc));
  // dweight^T (C, OC) (+)= inp^T (C, N) x dout (N, OC).
  return LtMatmul({false, true, c, oc, n, true, kPlain, accumulate}, dweight, inp, dout, nullptr,
                  stream);
}

absl::Status Blas::Fp8Matmul(const char* op, void* d, bool d_fp32, const Fp8Operand& a,
                             const Fp8Operand& b, const bf16* bias, int n, int k, int m,
                             bool accumulate, bool fast_accum, cudaStream_t stream, const void* c) {
  WEFT_RETURN_IF_ERROR(CheckLinear(op, "out, a, b and their scale_inv",
                                   {d, a.data, b.data, a.scale_inv, b.scale_inv}, n, k, m));
  for (const auto& [name, x] : {std::pair<const char*, int>{"n", n}, {"k", k}, {"m", m}}) {
    if (x % 16 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", name, " = ", x, " must be a multiple of 16 (FP8 GEMMs)"));
    }
  }
  for (const auto& [name, p] : {std::pair<const char*, const void*>{"a.scale_inv", a.scale_inv},
                                {"b.scale_inv", b.scale_inv}}) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": ", name, " is not 16-byte aligned (cuBLASLt refuses such scale pointers)"));
    }
  }
  if (a.format == Fp8Format::kE5M2 && b.format == Fp8Format::kE5M2) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": a and b are both E5M2 (cuBLASLt has no E5M2 x E5M2 kernel)"));
  }
  if (fp8_capable_ < 0) {
    int device = 0, major = 0, minor = 0;
    WEFT_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    WEFT_CUDA_RETURN_IF_ERROR(
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    WEFT_CUDA_RETURN_IF_ERROR(
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    fp8_capable_ = major * 10 + minor >= 89 ? 1 : 0;
  }
  if (fp8_capable_ == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        op, ": FP8 GEMMs need compute capability 8.9 or later (Ada, Hopper, Blackwell)"));
  }
  // Column-major: D (M, N) = A^T B with A = b stored (K, M), B = a stored (K, N).
  absl::StatusOr<Plan*> plan =
      GetFp8Plan({static_cast<int>(b.format), static_cast<int>(a.format), m, n, k, d_fp32,
                  bias != nullptr, accumulate, fast_accum});
  if (!plan.ok()) return plan.status();
  cublasLtMatmulDesc_t desc = (*plan)->desc;
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulDescSetAttribute(
      desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b.scale_inv, sizeof(b.scale_inv)));
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulDescSetAttribute(
      desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a.scale_inv, sizeof(a.scale_inv)));
  if (bias != nullptr) {
    WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasLtMatmul(
      lt_, desc, &alpha, b.data, (*plan)->a, a.data, (*plan)->b, &beta, c != nullptr ? c : d,
      (*plan)->d, d, (*plan)->d, &(*plan)->algo, workspace_, options_.workspace_bytes, stream));
  return absl::OkStatus();
}

absl::Status Blas::Fp8Linear(bf16* out, const Fp8Operand& a, const Fp8Operand& b, const bf16* bias,
                             const bf16* residual, int n, int k, int m, bool fast_accum,
                             cudaStream_t stream) {
  return Fp8Matmul("Fp8Linear", out, false, a, b, bias, n, k, m, residual != nullptr, fast_accum,
                   stream, residual);
}

absl::Status Blas::Fp8LinearF32(float* out, const Fp8Operand& a, const Fp8Operand& b, int n, int k,
                                int m, bool accumulate, cudaStream_t stream) {
  return Fp8Matmul("Fp8LinearF32", out, true, a, b, nullptr, n, k, m, accumulate, false, stream);
}

absl::Status Blas::Batched(bool trans_a, bool trans_b, int m, int n, int k, const bf16* a,
                           int64_t stride_a, const bf16* b, int64_t stride_b, bf16* c,
                           int64_t stride_c, int batch, cudaStream_t stream) {
  if (a == nullptr || b == nullptr || c == nullptr) {
    return absl::InvalidArgumentError("attention GEMM: null buffer");
  }
  if (absl::Status s = CheckDims("attention GEMM", m, n, k); !s.ok()) return s;
  if (batch <= 0) return absl::InvalidArgumentError("attention GEMM: batch must be positive");
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasSetStream_v2(handle_, stream));
  const float alpha = 1.0f;
  const float beta = 0.0f;
  WEFT_BLAS_RETURN_IF_ERROR(Api().cublasGemmStridedBatchedEx(
      handle_, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
      &alpha, a, CUDA_R_16BF, trans_a ? k : m, stride_a, b, CUDA_R_16BF, trans_b ? n : k,
      stride_b, &beta, c, CUDA_R_16BF, m, stride_c, batch, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status Blas::AttentionScores(bf16* scores, const bf16* q, const bf16* k, int batch, int t,
                                   int hs, cudaStream_t stream) {
  // scores^T (T, T) = k [(HS, T) stored]^T-op x q^T (HS, T): element (j, i) = q_i . k_j.
  const int64_t qk = static_cast<int64_t>(t) * hs;
  return Batched(true, false, t, t, hs, k, qk, q, qk, scores, static_cast<int64_t>(t) * t, batch,
                 stream);
}

absl::Status Blas::AttentionApply(bf16* y, const bf16* att, const bf16* v, int batch, int t,
                                  int hs, cudaStream_t stream) {
  // y^T (HS, T) = v^T (HS, T) x att^T (T, T).
  const int64_t tv = static_cast<int64_t>(t) * hs;
  return Batched(false, false, hs, t, t, v, tv, att, static_cast<int64_t>(t) * t, y, tv, batch,
                 stream);
}

absl::Status Blas::AttentionApplyTransposed(bf16* dv, const bf16* att, const bf16* dy, int batch,
                                            int t, int hs, cudaStream_t stream) {
  // dv^T (HS, T) = dy^T (HS, T) x att (T, T).
  const int64_t tv = static_cast<int64_t>(t) * hs;
  return Batched(false, true, hs, t, t, dy, tv, att, static_cast<int64_t>(t) * t, dv, tv, batch,
                 stream);
}

}  // namespace weft::engine::cuda
