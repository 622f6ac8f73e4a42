# CPU training engine (GPT-2 and Llama): per-op and whole-model gradient checks, determinism, AdamW and the LR
# schedule, an overfitting sanity run. Paths are relative to tests/.
weft_test(engine_ops_test unit SOURCES worker/engine/ops_test.cc LIBS weft_engine_cpu)
weft_test(engine_llama_ops_test unit SOURCES worker/engine/cpu/llama_ops_test.cc
  LIBS weft_engine_cpu)
weft_test(engine_gpt_test unit SOURCES worker/engine/gpt_test.cc LIBS weft_engine_cpu)
weft_test(engine_llama_model_test unit SOURCES worker/engine/cpu/llama_model_test.cc
  LIBS weft_engine_cpu)
# Activation checkpointing levels against kNone, bit for bit, and their memory.
weft_test(engine_cpu_checkpointing_test unit SOURCES worker/engine/cpu/checkpointing_test.cc
  LIBS weft_engine_cpu)
weft_test(engine_adamw_test unit SOURCES worker/engine/adamw_test.cc LIBS weft_engine_cpu)
weft_test(engine_model_arch_test unit SOURCES worker/engine/model_arch_test.cc
  LIBS weft_engine_cpu weft_common)

# CUDA bf16 ops against the CPU ops; skip themselves without a GPU.
if(TARGET weft_engine_cuda)
  # weft_model_cuda for Blas: the projection GEMM with the residual in its epilogue.
  weft_test(engine_cuda_bf16_ops_test gpu SOURCES worker/engine/cuda/bf16_ops_test.cc
    LIBS weft_engine_cuda weft_engine_cpu weft_model_cuda)
  weft_test(engine_cuda_flash_attention_test gpu SOURCES worker/engine/cuda/flash_attention_test.cc
    LIBS weft_engine_cuda weft_engine_cpu)
  weft_test(engine_cuda_llama_ops_test gpu SOURCES worker/engine/cuda/llama_ops_test.cc
    LIBS weft_engine_cuda weft_engine_cpu)
endif()
# The compressed all-reduce's GPU encodings against the CPU ones (weft_comm); the FP8 casts
# and GEMMs against host references.
if(TARGET weft_model_cuda)
  weft_test(engine_cuda_fp8_test gpu SOURCES worker/engine/cuda/fp8_test.cc
    LIBS weft_model_cuda weft_engine_cuda)
  weft_test(engine_cuda_wire_codec_test gpu SOURCES worker/engine/cuda/wire_codec_test.cc
    LIBS weft_model_cuda weft_comm)
endif()
