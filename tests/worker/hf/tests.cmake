# worker/hf: Hugging Face config, mapping, import and export. The import test runs ZeroCpuEngine
# ranks as threads over Gloo on loopback (integration).
weft_test(hf_config_test unit SOURCES worker/hf/hf_config_test.cc LIBS weft_hf)
weft_test(hf_import_test integration SOURCES worker/hf/hf_import_test.cc
  LIBS weft_hf weft_worker_lib weft_coordinator_lib)
