// The char-LM trainer's test text, shared by the suites that train it (test_checkpoints,
// test_transformer, test_micro_batches, test_charlm_promises): a seeded random text over 12
// characters, small enough that a step takes milliseconds, the validation text the training text
// itself; and the small models of the checkpoint suites.
#pragma once

#include "models/charlm.hpp"

#include <cstdint>
#include <random>

namespace tapegrad::testing {

inline Corpus random_corpus(std::uint64_t seed, std::size_t length) {
    Corpus corpus;
    corpus.alphabet = "abcdefghijk ";
    std::mt19937_64 generator(seed);
    for (std::size_t k = 0; k < length; ++k) corpus.train.push_back(generator() % corpus.alphabet.size());
    corpus.validation = corpus.train;
    return corpus;
}

// A char-LM small enough that a step and a save take milliseconds: 16 parameters, 49 files.
inline CharLmSettings small_charlm() { return {.layers = 1, .width = 16, .heads = 2, .context = 16, .batch = 4}; }

// The decoder at the small size (models/llama.hpp through the same trainer): grouped-query
// attention, 2 query heads over 1 key/value head, a SwiGLU MLP of width 24, tied output.
inline CharLmSettings small_llama() {
    CharLmSettings settings = small_charlm();
    settings.model = CharLmModel::llama;
    settings.kv_heads = 1;
    settings.hidden = 24;
    return settings;
}

}  // namespace tapegrad::testing
