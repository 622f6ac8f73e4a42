# worker/hf: Hugging Face config, mapping, import and export. The import test runs ZeroCpuEngine
# ranks as threads over Gloo on loopback (integration).
weft_test(hf_config_test unit SOURCES worker/hf/hf_config_test.cc LIBS weft_hf)
weft_test(hf_import_test integration SOURCES worker/hf/hf_import_test.cc
  LIBS weft_hf weft_worker_lib weft_coordinator_lib)
# The CPU models against transformers' numbers (tests/fixtures/hf).
weft_test(hf_reference_test unit SOURCES worker/hf/hf_reference_test.cc
  LIBS weft_hf weft_engine_cpu)
target_compile_definitions(hf_reference_test PRIVATE
  WEFT_HF_FIXTURES="${CMAKE_CURRENT_SOURCE_DIR}/fixtures/hf")
