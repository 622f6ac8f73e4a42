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
# The export's tokenizer files; with python3 and `tokenizers` importable, also their encodings.
weft_test(hf_tokenizer_test unit SOURCES worker/hf/hf_tokenizer_test.cc LIBS weft_hf)
target_compile_definitions(hf_tokenizer_test PRIVATE
  WEFT_HF_TOKENIZER_CHECK="${CMAKE_CURRENT_SOURCE_DIR}/worker/hf/check_hf_tokenizer.py"
  WEFT_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
