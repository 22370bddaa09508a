// llama.cpp's tokenizer on one text, through its C API: the fallback of make_tokenizer_ids.py for a
// llama.cpp build that has libllama but not the llama-tokenize tool.
//
//   llama_tokenize_ids MODEL.gguf < text     prints [id, id, ...] of
//   llama_tokenize(vocab, text, add_special = the vocabulary's add_bos, parse_special = true),
//   which is what `llama-tokenize -m MODEL.gguf --ids --no-escape --stdin` prints.
#include "llama.h"

#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

static void quiet(ggml_log_level, const char *, void *) {}

int main(int argc, char ** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s MODEL.gguf < text\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params params = llama_model_default_params();
    params.vocab_only = true;  // the vocabulary is all a tokenizer needs
    llama_model * model = llama_model_load_from_file(argv[1], params);
    if (model == nullptr) {
        std::fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());

    const bool add_special = llama_vocab_get_add_bos(vocab);
    std::vector<llama_token> ids(text.size() + 8);
    int n = llama_tokenize(vocab, text.data(), (int) text.size(), ids.data(), (int) ids.size(), add_special, true);
    if (n < 0) {  // the buffer was too small: -n is the count needed
        ids.resize(-n);
        n = llama_tokenize(vocab, text.data(), (int) text.size(), ids.data(), (int) ids.size(), add_special, true);
    }
    std::printf("[");
    for (int i = 0; i < n; ++i) {
        std::printf(i ? ", %d" : "%d", ids[i]);
    }
    std::printf("]\n");
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
