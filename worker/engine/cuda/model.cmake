# weft_model_cuda: the GPU models (cuBLASLt GEMMs + the bf16 layers of weft_engine_cuda) behind
# the CudaModel interface (model.h), created by model_factory.cc and driven unit by unit by the
# worker's ZeRO-3 engine. One <arch>_model.{h,cc} per architecture.
add_library(weft_model_cuda STATIC matmul.cc fp8_linear.cc model_factory.cc model_util.cc gpt2_model.cc
  llama_model.cc reduce.cu wire_codec.cu)
set_target_properties(weft_model_cuda PROPERTIES CUDA_STANDARD 17 CUDA_EXTENSIONS OFF)
target_compile_options(weft_model_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
target_link_libraries(weft_model_cuda PUBLIC weft_engine_cuda weft_model_arch weft_common
  CUDA::cudart ${CMAKE_DL_LIBS} absl::status absl::statusor absl::strings)
# cuBLAS and cuBLASLt are dlopened by matmul.cc (see there why); their headers are the
# toolkit's.
target_include_directories(weft_model_cuda SYSTEM PUBLIC ${CUDAToolkit_INCLUDE_DIRS})
