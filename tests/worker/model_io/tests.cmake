# worker/model_io: model files, host buffers, safetensors files (unit, no child processes).
weft_test(host_buffer_test unit SOURCES worker/model_io/host_buffer_test.cc LIBS weft_model_io)
weft_test(model_file_test unit SOURCES worker/model_io/model_file_test.cc LIBS weft_model_io
  DEPENDS weft_sentencepiece)
target_compile_definitions(model_file_test PRIVATE WEFT_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
weft_test(safetensors_test unit SOURCES worker/model_io/safetensors_test.cc LIBS weft_model_io)
# Chatting with a model file (sample --chat): template choice, prompt ids, where a reply stops.
weft_test(chat_sample_test unit SOURCES worker/model_io/chat_sample_test.cc LIBS weft_model_io)
target_compile_definitions(chat_sample_test PRIVATE WEFT_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
