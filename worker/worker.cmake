# The weft-worker process: its agent, the generation run, checkpoints, metrics and reports.
add_library(weft_worker_lib STATIC generation_run.cc agent.cc worker_metrics.cc checkpointer.cc
  device_backend.cc mfu.cc run_sequencer.cc host_identity.cc step_failures.cc log_relay.cc
  step_reports.cc sharding_auto.cc)
target_link_libraries(weft_worker_lib PUBLIC weft_zero weft_model_io weft_hf weft_comm
  weft_client)

add_executable(weft-worker main.cc)
target_link_libraries(weft-worker PRIVATE weft_thread_stack)
target_link_libraries(weft-worker PRIVATE weft_worker_lib CLI11::CLI11)
