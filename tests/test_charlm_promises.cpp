// The char-LM's documented promises (models/charlm.hpp) asserted where test_checkpoints and the
// training suites did not make them bite (issue 49, item 2): what a checkpoint's manifest holds and
// in which order, what a resume refuses in a damaged or foreign checkpoint (no format line, another
// corpus's alphabet, a parameter file of another dtype or shape, a truncated or missing file) and
// what it accepts (a manifest from before float training), which directory a resume read, the
// dtype of the files a float32 and a bfloat16 run write; the trainer's validation windows, its
// last step's tape, a float run's start and the GPT-2 model's sampling past the context; and the
// text pipeline a run starts from (clean_text, load_corpus's split, training_batch's windows, the
// family's name). The layouts an interrupted save leaves, and the recovery from each, are
// test_checkpoints'.
#define BOOST_TEST_MODULE charlm_promises
#include "support.hpp"
#include "charlm_corpus.hpp"
#include "models/charlm.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace tapegrad;
namespace fs = std::filesystem;

namespace {

using testing::small_charlm;  // (tests/charlm_corpus.hpp)
using testing::small_llama;

// A scratch directory of its own, removed at the end.
struct Scratch {
    fs::path root;
    explicit Scratch(const std::string& name)
        : root(fs::temp_directory_path() / fmt::format("tapegrad_charlm_promises_{}_{}", name, ::getpid())) {
        fs::remove_all(root);
        fs::create_directories(root);
    }
    ~Scratch() { fs::remove_all(root); }
};

std::vector<std::string> manifest_lines(const fs::path& checkpoint) {
    std::ifstream manifest(checkpoint / "manifest.txt");
    std::vector<std::string> lines;
    for (std::string line; std::getline(manifest, line);) lines.push_back(line);
    return lines;
}

void write_manifest(const fs::path& checkpoint, const std::vector<std::string>& lines) {
    std::ofstream manifest(checkpoint / "manifest.txt");
    for (const std::string& line : lines) manifest << line << "\n";
}

void write_bytes(const fs::path& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}

// A checkpoint after two steps of the small GPT-2 model, and the trainer that saved it.
struct Saved {
    Scratch scratch;
    Corpus corpus = testing::random_corpus(11, 2000);
    CharLmTrainer trainer{small_charlm(), corpus};
    fs::path checkpoint = scratch.root / "run";

    explicit Saved(const std::string& name) : scratch(name) {
        trainer.step();
        trainer.step();
        trainer.save(checkpoint);
    }
    // The first parameter's file.
    fs::path first_parameter_file() const { return checkpoint / ("param." + parameter_names(trainer.network())[0] + ".npy"); }
};

}  // namespace

// ---- checkpoints --------------------------------------------------------------------------------

// The manifest: the format line, the step count, the alphabet, the model family and its sizes, the
// scalar type, then one line per parameter, in that order, for both families.
BOOST_AUTO_TEST_CASE(the_manifest_lists_its_lines_in_the_documented_order) {
    const Scratch scratch("order");
    const Corpus corpus = testing::random_corpus(11, 2000);
    for (const CharLmSettings& settings : {small_charlm(), small_llama()}) {
        const std::string family(char_lm_model_name(settings.model));
        BOOST_TEST_CONTEXT(family) {
            CharLmTrainer trainer(settings, corpus);
            trainer.step();
            trainer.save(scratch.root / family);
            std::vector<std::string> keys;
            for (const std::string& line : manifest_lines(scratch.root / family)) keys.push_back(line.substr(0, line.find(' ')));
            std::vector<std::string> expected{"tapegrad-charlm-checkpoint", "steps_done", "alphabet", "model"};
            for (const auto& [key, value] : sizes_of(trainer.network())) expected.push_back(key);
            expected.push_back("dtype");
            expected.insert(expected.end(), parameter_names(trainer.network()).size(), "parameter");
            BOOST_TEST(keys == expected);
            const std::vector<std::string> lines = manifest_lines(scratch.root / family);
            BOOST_TEST(lines[0] == "tapegrad-charlm-checkpoint 1");
            BOOST_TEST(lines[1] == "steps_done 1");
            BOOST_TEST(lines[2] == "alphabet " + charlm_files::hex(corpus.alphabet));
            BOOST_TEST(lines[3] == "model " + family);
        }
    }
}

// A checkpoint written before float training has no dtype line: it holds float64, so a double run
// resumes it exactly and a float32 run refuses it as float64.
BOOST_AUTO_TEST_CASE(a_manifest_without_a_dtype_line_is_float64) {
    Saved saved("dtype");
    std::vector<std::string> lines = manifest_lines(saved.checkpoint);
    std::erase_if(lines, [](const std::string& line) { return line.starts_with("dtype "); });
    BOOST_TEST_REQUIRE(lines.size() + 1 == manifest_lines(saved.checkpoint).size());
    write_manifest(saved.checkpoint, lines);
    CharLmTrainer resumed(small_charlm(), saved.corpus);
    resumed.load(saved.checkpoint);
    BOOST_TEST(resumed.steps_done() == 2u);
    BOOST_TEST((resumed.parameters() == saved.trainer.parameters()));
    BasicCharLmTrainer<float> single(small_charlm(), saved.corpus);
    const std::string refusal = testing::message_of<value_error>([&] { single.load(saved.checkpoint); });
    BOOST_TEST(refusal.find("holds float64 parameters and moments, this run trains in float32") != std::string::npos,
               refusal);
}

// A manifest without the format line is not a checkpoint: an io_error naming the manifest, even
// when every other line is there.
BOOST_AUTO_TEST_CASE(a_manifest_without_its_format_line_is_refused) {
    Saved saved("format");
    std::vector<std::string> lines = manifest_lines(saved.checkpoint);
    BOOST_TEST_REQUIRE(lines[0].starts_with("tapegrad-charlm-checkpoint "));
    lines.erase(lines.begin());
    write_manifest(saved.checkpoint, lines);
    CharLmTrainer resumed(small_charlm(), saved.corpus);
    BOOST_TEST(testing::message_of<io_error>([&] { resumed.load(saved.checkpoint); }) ==
               "charlm: '" + (saved.checkpoint / "manifest.txt").string() + "' is not a tapegrad char-LM checkpoint");
}

// Another corpus is refused even when only its alphabet differs: the same size (so every
// parameter's shape agrees), one character changed; the message names both alphabets.
BOOST_AUTO_TEST_CASE(a_checkpoint_of_another_alphabet_of_the_same_size_is_refused) {
    Saved saved("alphabet");
    Corpus other = saved.corpus;
    other.alphabet.back() = '!';
    BOOST_TEST_REQUIRE(other.alphabet.size() == saved.corpus.alphabet.size());
    CharLmTrainer resumed(small_charlm(), other);
    const std::string refusal = testing::message_of<value_error>([&] { resumed.load(saved.checkpoint); });
    BOOST_TEST(refusal.find("is for another model or corpus") != std::string::npos, refusal);
    BOOST_TEST(refusal.find("alphabet " + charlm_files::hex(saved.corpus.alphabet) + "; this run") != std::string::npos,
               refusal);
    BOOST_TEST(refusal.find("alphabet " + charlm_files::hex(other.alphabet) + ")") != std::string::npos, refusal);
}

// A parameter file must be what the manifest says: one of float32 in a float64 checkpoint is
// refused by name (not silently widened), one of another shape is refused naming the parameter,
// its shape and the model's.
BOOST_AUTO_TEST_CASE(a_parameter_file_of_another_dtype_or_shape_is_refused_by_name) {
    Saved saved("parameter");
    const fs::path file = saved.first_parameter_file();
    const Tensor<double> original = load_npy(file);
    write_bytes(file, npy_bytes(original, NpyDtype::float32));
    CharLmTrainer resumed(small_charlm(), saved.corpus);
    BOOST_TEST(testing::message_of<value_error>([&] { resumed.load(saved.checkpoint); }) ==
               "charlm: '" + file.string() + "' is not float64 as its manifest says");

    write_bytes(file, npy_bytes(Tensor<double>(Shape{1, 1}, 0.5)));
    const std::string name = parameter_names(saved.trainer.network())[0];
    BOOST_TEST(testing::message_of<value_error>([&] { resumed.load(saved.checkpoint); }) ==
               fmt::format("charlm: checkpoint parameter {} is [1x1], the model needs {}", name,
                           original.shape().to_string()));
}

// A damaged checkpoint whose manifest is there (a file truncated, or missing): the resume fails
// with an io_error naming the file, and the fault.
BOOST_AUTO_TEST_CASE(a_truncated_or_missing_parameter_file_is_refused_naming_the_file) {
    Saved saved("damaged");
    const fs::path file = saved.first_parameter_file();
    const std::string bytes = read_file_bytes(file, "test");
    write_bytes(file, bytes.substr(0, bytes.size() - 3));
    CharLmTrainer resumed(small_charlm(), saved.corpus);
    const std::string truncated = testing::message_of<io_error>([&] { resumed.load(saved.checkpoint); });
    BOOST_TEST(truncated.find("'" + file.string() + "'") != std::string::npos, truncated);
    BOOST_TEST(truncated.find("(truncated data)") != std::string::npos, truncated);
    fs::remove(file);
    BOOST_TEST(testing::message_of<io_error>([&] { resumed.load(saved.checkpoint); }) ==
               "charlm: cannot open '" + file.string() + "': No such file or directory");
}

// load returns the directory it actually read: DIR itself, or the complete DIR.partial an
// interrupted save left beside it (the newer), or DIR.previous when only that is complete.
BOOST_AUTO_TEST_CASE(a_resume_returns_the_directory_it_read) {
    Saved saved("returned");
    const fs::path partial = saved.checkpoint.string() + ".partial", previous = saved.checkpoint.string() + ".previous";
    CharLmTrainer resumed(small_charlm(), saved.corpus);
    BOOST_TEST(resumed.load(saved.checkpoint) == saved.checkpoint);
    fs::copy(saved.checkpoint, partial);
    BOOST_TEST(resumed.load(saved.checkpoint) == partial);
    fs::remove_all(partial);
    fs::rename(saved.checkpoint, previous);
    BOOST_TEST(resumed.load(saved.checkpoint) == previous);
}

// A float32 run writes float32 files, and so does a bfloat16 run (its parameters and moments are
// float32); a double run float64 ones. Every file of each checkpoint is checked.
BOOST_AUTO_TEST_CASE(each_run_writes_files_of_its_parameters_type) {
    const Scratch scratch("file_dtypes");
    const Corpus corpus = testing::random_corpus(11, 2000);
    CharLmSettings bf16 = small_charlm();
    bf16.products = ProductPrecision::bfloat16;
    BasicCharLmTrainer<float>(small_charlm(), corpus).save(scratch.root / "float32");
    BasicCharLmTrainer<float>(bf16, corpus).save(scratch.root / "bfloat16");
    CharLmTrainer(small_charlm(), corpus).save(scratch.root / "float64");
    for (const auto& [name, dtype] : {std::pair{"float32", NpyDtype::float32}, std::pair{"bfloat16", NpyDtype::float32},
                                      std::pair{"float64", NpyDtype::float64}}) {
        std::size_t files = 0;
        for (const fs::directory_entry& entry : fs::directory_iterator(scratch.root / name)) {
            if (entry.path().extension() != ".npy") continue;
            ++files;
            BOOST_TEST((parse_npy_header(read_file_bytes(entry.path(), "test")).dtype == dtype), entry.path().string());
        }
        BOOST_TEST(files == 3 * parameter_names(CharLmGpt2(small_charlm(), corpus.alphabet.size()).config).size(), name);
    }
}

// ---- the trainer ---------------------------------------------------------------------------------

namespace {

// The family's mean loss of `count` sequences at the trainer's parameters, on a tape of its own:
// the reference the trainer's losses are held to.
double mean_loss_of(const CharLmTrainer& trainer, std::span<const std::size_t> tokens,
                    std::span<const std::size_t> targets, std::size_t count) {
    Tape<double> tape;
    std::vector<Var<double>> leaves;
    const std::vector<std::string> names = parameter_names(trainer.network());
    for (std::size_t i = 0; i < names.size(); ++i) leaves.push_back(tape.leaf(trainer.parameters()[i], names[i]));
    return std::visit(
        [&](const auto& family) {
            return family.loss(std::span<const Var<double>>(leaves), tokens, targets, count).value().item();
        },
        trainer.network());
}

}  // namespace

// validation_loss(max_windows): the mean loss over windows of the validation text, at most
// max_windows of them spread evenly over it (window w of n at w·available/n), 0 or more than there
// are meaning all; batches of B windows, the mean over them weighted by their windows. 2000
// characters hold 124 windows of 16: 5 of them (0, 24, 49, 74, 99: two batches, of 4 and 1) are
// held to the mean of their own losses, and all of them likewise. The mean of batch means and
// the mean of window losses round differently: 1e-12 relative holds them together.
BOOST_AUTO_TEST_CASE(validation_loss_spreads_its_windows_evenly_over_the_text) {
    const Corpus corpus = testing::random_corpus(11, 2000);
    CharLmTrainer trainer(small_charlm(), corpus);
    const std::size_t T = small_charlm().context, available = (corpus.validation.size() - 1) / T;
    BOOST_TEST_REQUIRE(available == 124u);
    const auto mean_over = [&](std::size_t count) {
        double total = 0;
        for (std::size_t w = 0; w < count; ++w) {
            const std::size_t start = w * available / count * T;
            const std::span<const std::size_t> text(corpus.validation);
            total += mean_loss_of(trainer, text.subspan(start, T), text.subspan(start + 1, T), 1);
        }
        return total / static_cast<double>(count);
    };
    BOOST_TEST(trainer.validation_loss(5) == mean_over(5), boost::test_tools::tolerance(1e-12));
    const double all = trainer.validation_loss();
    BOOST_TEST(all == mean_over(available), boost::test_tools::tolerance(1e-12));
    BOOST_TEST(trainer.validation_loss(1000) == all);
    BOOST_TEST(trainer.validation_loss(5) != all);  // the five are not all of them
}

// The tape of the last step as it ran, with its loss J and the leaves' gradients on it; with
// several micro-batches, the first one's tape and its mean loss (the first half of the batch's
// sequences here), which is not the step's loss (the mean of both halves).
BOOST_AUTO_TEST_CASE(the_last_step_tape_is_the_first_micro_batchs) {
    const Corpus corpus = testing::random_corpus(11, 2000);
    CharLmTrainer one(small_charlm(), corpus);
    const double loss = one.step();
    BOOST_TEST(one.last_step_loss().value().item() == loss);
    BOOST_TEST(one.last_step_tape().holds_gradients_of(one.last_step_loss()));

    CharLmSettings halves = small_charlm();
    halves.micro_batches = 2;
    CharLmTrainer two(halves, corpus);
    const CharBatch batch = training_batch(corpus, halves, 0);
    const std::size_t first = batch.size / 2 * halves.context;
    const double first_half = mean_loss_of(two, std::span<const std::size_t>(batch.tokens).first(first),
                                           std::span<const std::size_t>(batch.targets).first(first), batch.size / 2);
    const double step_loss = two.step();
    BOOST_TEST(two.last_step_loss().value().item() == first_half, boost::test_tools::tolerance(1e-12));
    BOOST_TEST(step_loss != first_half);
    BOOST_TEST(two.last_step_tape().holds_gradients_of(two.last_step_loss()));
}

// A float trainer starts from the double initialisation rounded to float, both families: the
// same draw, not one of its own.
BOOST_AUTO_TEST_CASE(a_float_trainer_starts_from_the_double_draw_rounded) {
    const Corpus corpus = testing::random_corpus(11, 2000);
    for (const CharLmSettings& settings : {small_charlm(), small_llama()}) {
        const BasicCharLmTrainer<float> single(settings, corpus);
        const CharLmTrainer twice(settings, corpus);
        BOOST_TEST_REQUIRE(single.parameters().size() == twice.parameters().size());
        for (std::size_t i = 0; i < twice.parameters().size(); ++i) {
            BOOST_TEST((single.parameters()[i] == tensor_cast<float>(twice.parameters()[i])), i);
        }
    }
}

// The GPT-2 model samples through its memory of rows past the context (16) as the decoder does
// through its cache (test_checkpoints): the memory starts again from the last half of the context,
// so 40 characters come out, each of the alphabet, the same for the same seed (a memory never
// started again would pass the learned positions and be refused).
BOOST_AUTO_TEST_CASE(the_gpt2_model_samples_past_the_context) {
    const Corpus corpus = testing::random_corpus(11, 2000);
    CharLmTrainer trainer(small_charlm(), corpus);
    trainer.step();
    const std::string text = trainer.sample("abc", 40, 5);
    BOOST_TEST(text.size() == 40u);
    BOOST_TEST(text.find_first_not_of(corpus.alphabet) == std::string::npos, text);
    BOOST_TEST(trainer.sample("abc", 40, 5) == text);
}

// ---- the text a run trains on -------------------------------------------------------------------

// clean_text keeps printable ASCII and newlines, makes a tab a space, keeps of an overstruck
// character ("_\bx") what was struck over it, and drops every other byte (a carriage return, DEL,
// UTF-8's bytes, a backspace with nothing before it).
BOOST_AUTO_TEST_CASE(clean_text_keeps_printable_ascii_and_what_was_struck_over) {
    BOOST_TEST(clean_text(std::string("\bA\tb_\bc\r\n\x7f" "d\xc3\xa9" "e~ ", 16)) == "A bc\nde~ ");
}

// The files are read in the order given and cleaned; characters 9000-9999, 19000-19999, ... (every
// tenth block of 1000) are validation text, the rest training text; the alphabet is the characters
// that occur, sorted. Two files of 12,500 characters: the second's content starts at 12,500.
BOOST_AUTO_TEST_CASE(load_corpus_splits_every_tenth_block_of_1000_for_validation) {
    const Scratch scratch("corpus");
    const auto text_of = [](std::size_t from, std::size_t count) {
        std::string text;
        for (std::size_t k = from; k < from + count; ++k) text += static_cast<char>('a' + k / 1000 % 26);
        return text;
    };
    write_bytes(scratch.root / "one", text_of(0, 12500));
    write_bytes(scratch.root / "two", "\r" + text_of(12500, 12500));  // the carriage return is cleaned away
    const Corpus corpus = load_corpus({scratch.root / "one", scratch.root / "two"});
    BOOST_TEST(corpus.alphabet == "abcdefghijklmnopqrstuvwxy");
    const std::string all = text_of(0, 25000);
    std::string train, validation;
    for (std::size_t k = 0; k < all.size(); ++k) (k / 1000 % 10 == 9 ? validation : train) += all[k];
    BOOST_TEST_REQUIRE(corpus.validation.size() == 2000u);
    BOOST_TEST_REQUIRE(corpus.train.size() == 23000u);
    std::string read_validation, read_train;
    for (const std::size_t token : corpus.validation) read_validation += corpus.alphabet[token];
    for (const std::size_t token : corpus.train) read_train += corpus.alphabet[token];
    BOOST_TEST((read_validation == validation));  // 'j' (9000-9999) and 't' (19000-19999)
    BOOST_TEST((read_train == train));
    BOOST_TEST(testing::message_of<io_error>([&] { (void)load_corpus({scratch.root / "absent"}); })
                   .starts_with("charlm: corpus file: cannot open '"));
    BOOST_TEST(testing::message_of<value_error>([&] { (void)corpus.token_of('z'); }) ==
               "charlm: character 'z' does not occur in the corpus");
}

// The batch of a step: B windows of T + 1 characters of the training text, tokens the first T and
// targets the last T of each; drawn from (seed, step) alone, so the same step gives the same batch
// (a resumed run draws what the uninterrupted one drew) and another step or seed another batch.
// A training text of T + 1 characters or fewer holds no window to draw from, and is refused.
BOOST_AUTO_TEST_CASE(a_steps_batch_is_windows_drawn_from_its_seed_and_step) {
    const Corpus corpus = testing::random_corpus(5, 500);
    const CharLmSettings settings = small_charlm();
    const CharBatch batch = training_batch(corpus, settings, 7);
    BOOST_TEST(batch.size == settings.batch);
    BOOST_TEST_REQUIRE(batch.tokens.size() == settings.batch * settings.context);
    BOOST_TEST_REQUIRE(batch.targets.size() == settings.batch * settings.context);
    for (std::size_t b = 0; b < batch.size; ++b) {
        // Find the window's start in the text: its T + 1 characters follow one another there.
        const auto first = batch.tokens.begin() + static_cast<std::ptrdiff_t>(b * settings.context);
        const auto target = batch.targets.begin() + static_cast<std::ptrdiff_t>(b * settings.context);
        bool found = false;
        for (std::size_t start = 0; start + settings.context + 1 <= corpus.train.size() && !found; ++start) {
            const auto at = corpus.train.begin() + static_cast<std::ptrdiff_t>(start);
            found = std::equal(first, first + static_cast<std::ptrdiff_t>(settings.context), at) &&
                    std::equal(target, target + static_cast<std::ptrdiff_t>(settings.context), at + 1);
        }
        BOOST_TEST(found, "window " << b << " is not T + 1 consecutive characters of the training text");
    }
    const CharBatch again = training_batch(corpus, settings, 7);
    BOOST_TEST((again.tokens == batch.tokens && again.targets == batch.targets));
    BOOST_TEST((training_batch(corpus, settings, 8).tokens != batch.tokens));
    CharLmSettings reseeded = settings;
    reseeded.seed = 2;
    BOOST_TEST((training_batch(corpus, reseeded, 7).tokens != batch.tokens));
    const Corpus short_text = testing::random_corpus(5, settings.context + 1);
    BOOST_TEST(testing::message_of<value_error>([&] { (void)training_batch(short_text, settings, 0); }) ==
               "charlm: the training text is shorter than one window");
    BOOST_TEST(training_batch(testing::random_corpus(5, settings.context + 2), settings, 0).size == settings.batch);
}

// The families by the names a command line gives: "gpt2" and "llama", anything else refused by name.
BOOST_AUTO_TEST_CASE(a_family_is_named_gpt2_or_llama) {
    BOOST_TEST((char_lm_model_from("gpt2") == CharLmModel::gpt2));
    BOOST_TEST((char_lm_model_from("llama") == CharLmModel::llama));
    BOOST_TEST(testing::message_of<usage_error>([] { (void)char_lm_model_from("Llama"); }) ==
               "the char-LM's model must be 'gpt2' or 'llama', not 'Llama'");
}
