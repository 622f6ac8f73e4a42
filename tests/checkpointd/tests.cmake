# checkpointd tests; paths relative to tests/.
weft_test(crc32c_test unit SOURCES checkpointd/crc32c_test.cc LIBS weft_checkpointd_lib)
weft_test(chunk_codec_test unit SOURCES checkpointd/chunk_codec_test.cc LIBS weft_checkpointd_lib)
weft_test(checkpointd_decisions_test unit
  SOURCES checkpointd/decisions_test.cc LIBS weft_checkpointd_lib)
weft_test(checkpointd_store_test unit SOURCES checkpointd/store_test.cc LIBS weft_checkpointd_lib)
weft_test(checkpointd_process_test integration
  SOURCES checkpointd/checkpointd_process_test.cc LIBS weft_checkpointd_lib
  DEPENDS weft-checkpointd)
