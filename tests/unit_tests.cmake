# Unit tests: one process each, no network, no child processes; fast (label "unit").
weft_test(job_spec_test unit SOURCES common/job_spec_test.cc LIBS weft_common)
weft_test(daemon_test unit SOURCES common/daemon_test.cc LIBS weft_common)
weft_test(status_context_test unit SOURCES common/status_context_test.cc LIBS weft_common)
weft_test(utf8_test unit SOURCES common/utf8_test.cc LIBS weft_common)
# Every examples/*.pb.txt parses and passes NormalizeJobSpec.
weft_test(examples_test unit SOURCES examples/examples_test.cc LIBS weft_common)
target_compile_definitions(examples_test PRIVATE WEFT_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
weft_test(decisions_test unit SOURCES coordinator/decisions_test.cc LIBS weft_coordinator_lib)
weft_test(memory_store_test unit SOURCES coordinator/memory_store_test.cc LIBS weft_coordinator_lib)
weft_test(state_db_test unit SOURCES coordinator/state_db_test.cc LIBS weft_coordinator_lib)
weft_test(deadline_timer_test unit SOURCES coordinator/deadline_timer_test.cc LIBS weft_coordinator_lib)
weft_test(coordinator_test unit SOURCES coordinator/coordinator_test.cc LIBS weft_coordinator_lib)
weft_test(job_logs_test unit SOURCES coordinator/job_logs_test.cc LIBS weft_coordinator_lib)
weft_test(parked_call_test unit SOURCES coordinator/parked_call_test.cc LIBS weft_coordinator_lib)
# trainctl data prepare's library: inputs, shards, manifest, idempotence, every bad input.
weft_test(data_prepare_test unit SOURCES trainctl/data_prepare_test.cc LIBS weft_data_prepare
  DEPENDS weft_sentencepiece)
target_compile_definitions(data_prepare_test PRIVATE WEFT_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
