# CPU training engine: per-op and whole-model gradient checks, determinism, AdamW and the LR
# schedule, an overfitting sanity run. Paths are relative to tests/.
weft_test(engine_ops_test unit SOURCES worker/engine/ops_test.cc LIBS weft_engine)
weft_test(engine_gpt_test unit SOURCES worker/engine/gpt_test.cc LIBS weft_engine)
weft_test(engine_adamw_test unit SOURCES worker/engine/adamw_test.cc LIBS weft_engine)
