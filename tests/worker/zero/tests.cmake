# worker/zero: the shard layout, the ZeRO engines (CPU against itself and a real coordinator
# store, GPU against the CPU engine), the memory plans and the hybrid sharding groups.
weft_test(zero_cpu_test integration SOURCES worker/zero/zero_cpu_test.cc
  LIBS weft_worker_lib weft_coordinator_lib)
weft_test(shard_layout_test unit SOURCES worker/zero/shard_layout_test.cc LIBS weft_worker_lib)
weft_test(sharding_groups_test unit SOURCES worker/zero/sharding_groups_test.cc LIBS weft_worker_lib)
weft_test(sharding_choice_test unit SOURCES worker/zero/sharding_choice_test.cc LIBS weft_zero)
# Forks children (gtest death tests) that run under a memory limit.
weft_test(zero_engine_test integration SOURCES worker/zero/zero_engine_test.cc LIBS weft_worker_lib)
weft_test(memory_plan_test unit SOURCES worker/zero/memory_plan_test.cc LIBS weft_worker_lib)
# The GPU engine's buffer plan at real model shapes: CUDA-free, so it runs in CI.
weft_test(gpu_memory_plan_test unit SOURCES worker/zero/gpu_memory_plan_test.cc LIBS weft_zero)
# The GPU engine against the CPU engine and across GPU counts; skips without a GPU. Built where
# the CUDA engine and NCCL are (a CUDA build without NCCL has neither).
if(TARGET weft_model_cuda AND TARGET weft_comm_nccl)
  weft_test(zero_cuda_test gpu SOURCES worker/zero/zero_cuda_test.cc
    LIBS weft_worker_lib weft_coordinator_lib weft_test_in_process_comm)
  # The families' example jobs (examples/), whose memory plans it checks.
  target_compile_definitions(zero_cuda_test PRIVATE WEFT_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
endif()
