// The char-LM trainer's test text, shared by the suites that train it (test_checkpoints,
// test_transformer, test_micro_batches): a seeded random text over 12 characters, small enough
// that a step takes milliseconds, the validation text the training text itself.
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

}  // namespace tapegrad::testing
