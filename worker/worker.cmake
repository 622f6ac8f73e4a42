# The ZeRO engine, the trained-model file and the weft-worker process.
if(TARGET weft_engine AND TARGET weft_comm AND TARGET weft_data)
  add_library(weft_model STATIC model_io.cc)
  target_link_libraries(weft_model PUBLIC weft_engine weft_data weft_common)

  add_library(weft_worker_lib STATIC zero.cc generation_run.cc agent.cc worker_metrics.cc
    checkpointer.cc)
  target_link_libraries(weft_worker_lib PUBLIC weft_model weft_comm weft_client)

  add_executable(weft-worker main.cc)
  target_link_libraries(weft-worker PRIVATE weft_worker_lib CLI11::CLI11)
endif()
