# Tests of worker/comm (paths relative to tests/).
weft_test(communicator_test unit
  SOURCES worker/comm/communicator_test.cc LIBS weft_comm weft_coordinator_lib)
weft_test(gloo_collectives_test integration
  SOURCES worker/comm/gloo_collectives_test.cc LIBS weft_comm weft_coordinator_lib)
weft_test(gloo_failure_test integration
  SOURCES worker/comm/gloo_failure_test.cc LIBS weft_comm weft_coordinator_lib)
if(TARGET weft_comm_nccl)
  weft_test(nccl_communicator_test gpu
    SOURCES worker/comm/nccl_communicator_test.cc LIBS weft_comm_nccl weft_coordinator_lib)
endif()
weft_test(hybrid_communicator_test integration
  SOURCES worker/comm/hybrid_communicator_test.cc LIBS weft_comm weft_coordinator_lib)
weft_test(wire_codec_test integration
  SOURCES worker/comm/wire_codec_test.cc LIBS weft_comm weft_coordinator_lib)
weft_test(range_collectives_test integration
  SOURCES worker/comm/range_collectives_test.cc LIBS weft_comm weft_coordinator_lib)
# Ranks of one process on one GPU with NCCL's stream semantics (a test utility for the GPU
# engine's world > 1 code), and its own test.
if(TARGET weft_comm_nccl AND TARGET weft_model_cuda)
  add_library(weft_test_in_process_comm STATIC worker/comm/in_process_cuda_communicator.cc
    worker/comm/in_process_cuda_delay.cu)
  # As weft_engine_cuda: a dialect CMake knows for nvcc (the .cu needs no more than C++17).
  set_target_properties(weft_test_in_process_comm PROPERTIES CUDA_STANDARD 17
    CUDA_EXTENSIONS OFF)
  target_link_libraries(weft_test_in_process_comm PUBLIC weft_comm_nccl weft_model_cuda
    CUDA::cudart absl::status absl::statusor absl::strings)
  weft_test(in_process_cuda_communicator_test gpu
    SOURCES worker/comm/in_process_cuda_communicator_test.cc LIBS weft_test_in_process_comm)
endif()
