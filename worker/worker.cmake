# The ZeRO engines, the trained-model file and the weft-worker process.
# weft_model: the trained-model file and the checkpoint schema, which trainctl needs too.
add_library(weft_model STATIC model_io.cc checkpoint_schema.cc host_buffer.cc)
target_link_libraries(weft_model PUBLIC weft_engine_cpu weft_data weft_tokenizer weft_common)
add_dependencies(weft_model weft_sentencepiece)  # loaded at run time, see worker/data

add_library(weft_worker_lib STATIC shard_layout.cc zero_engine.cc memory_plan.cc
  zero_cpu.cc generation_run.cc agent.cc worker_metrics.cc checkpointer.cc device_backend.cc
  mfu.cc run_sequencer.cc host_identity.cc sharding_groups.cc step_failures.cc log_relay.cc
  step_reports.cc)
target_link_libraries(weft_worker_lib PUBLIC weft_model weft_hf weft_comm weft_client)
# The GPU engine (ZeRO-3 over NCCL) where CUDA was found; weft-worker --device cuda:K.
# Without NCCL (comm/CMakeLists.txt says so at configure time) there is no GPU engine either.
if(WEFT_HAVE_CUDA AND TARGET weft_comm_nccl)
  target_sources(weft_worker_lib PRIVATE zero_cuda.cc)
  target_link_libraries(weft_worker_lib PUBLIC weft_model_cuda weft_comm_nccl CUDA::cudart)
  target_compile_definitions(weft_worker_lib PUBLIC WEFT_WORKER_HAVE_CUDA)
endif()

add_executable(weft-worker main.cc)
target_link_libraries(weft-worker PRIVATE weft_thread_stack)
target_link_libraries(weft-worker PRIVATE weft_worker_lib CLI11::CLI11)
