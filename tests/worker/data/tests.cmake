# worker/data: token datasets, dataset manifests, token sampling, tokenizers (unit, no
# child processes).
weft_test(token_dataset_test unit SOURCES worker/data/token_dataset_test.cc LIBS weft_data)
weft_test(manifest_test unit SOURCES worker/data/manifest_test.cc LIBS weft_data)
weft_test(sharded_dataset_test unit SOURCES worker/data/sharded_dataset_test.cc LIBS weft_data)
weft_test(sampler_test unit SOURCES worker/data/sampler_test.cc LIBS weft_data)
weft_test(tokenizer_test unit SOURCES worker/data/tokenizer_test.cc LIBS weft_tokenizer
  DEPENDS weft_sentencepiece)
weft_test(bpe_tokenizer_test unit SOURCES worker/data/bpe_tokenizer_test.cc LIBS weft_tokenizer
  DEPENDS weft_sentencepiece)
target_compile_definitions(bpe_tokenizer_test PRIVATE WEFT_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
weft_test(documents_test unit SOURCES worker/data/documents_test.cc LIBS weft_data)
# Chat templates against transformers' renderings, ids and assistant masks
# (tests/fixtures/chat/make_chat_fixtures.py).
weft_test(chat_template_test unit SOURCES worker/data/chat_template_test.cc LIBS weft_tokenizer
  DEPENDS weft_sentencepiece)
target_compile_definitions(chat_template_test PRIVATE WEFT_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
# The byte-level BPE trainer: hand-worked merges and ties, its files read back by the
# tokenizer over the fixture corpus, its refusals.
weft_test(bpe_trainer_test unit SOURCES worker/data/bpe_trainer_test.cc LIBS weft_tokenizer
  DEPENDS weft_sentencepiece)
target_compile_definitions(bpe_trainer_test PRIVATE WEFT_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
# The ids Weft gives a corpus, for tests/fixtures/tokenizers/check_trained.py (bpe_trained_hf_test).
add_executable(bpe_encode_records worker/data/bpe_encode_records.cc)
target_link_libraries(bpe_encode_records PRIVATE weft_tokenizer)
add_dependencies(bpe_encode_records weft_sentencepiece)
