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
weft_test(range_collectives_test integration
  SOURCES worker/comm/range_collectives_test.cc LIBS weft_comm weft_coordinator_lib)
