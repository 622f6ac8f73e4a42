# weft_gpt_cuda: the GPU model (cuBLASLt GEMMs + the bf16 layers of weft_engine_cuda),
# driven unit by unit by the worker's ZeRO-3 engine.
add_library(weft_gpt_cuda STATIC matmul.cc gpt_cuda.cc reduce.cu)
set_target_properties(weft_gpt_cuda PROPERTIES CUDA_STANDARD 17 CUDA_EXTENSIONS OFF)
target_compile_options(weft_gpt_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
target_link_libraries(weft_gpt_cuda PUBLIC weft_engine_cuda weft_engine weft_common
  CUDA::cudart ${CMAKE_DL_LIBS} absl::status absl::statusor absl::strings)
# cuBLAS and cuBLASLt are dlopened by matmul.cc (see there why); their headers are the
# toolkit's.
target_include_directories(weft_gpt_cuda SYSTEM PUBLIC ${CUDAToolkit_INCLUDE_DIRS})
