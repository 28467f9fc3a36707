// Checkpoint recovery of the char-LM trainer (models/charlm.hpp: find_checkpoint, the save and its
// settling of what an interrupted save left), over every layout of DIR, DIR.partial and
// DIR.previous a killed save can leave: each absent, complete, without its manifest, or with half
// of its files. Three real checkpoints after 1, 2 and 3 steps (distinct steps and parameters) are
// placed as DIR.previous, DIR and DIR.partial: the order of their ages in any layout a save leaves
// (a complete DIR.partial is the last save's, DIR.previous was DIR before it). For each layout:
// find_checkpoint and load take the newest complete one, or refuse by name when none is complete;
// and a save of step 4 killed (SIGKILL, through the save's test pause hook, in a forked child)
// half way through its files leaves the newest complete checkpoint of the layout findable, killed
// between its two renames leaves step 4 findable, and run to its end leaves step 4 in DIR alone;
// a save whose second rename fails puts DIR.previous back as DIR. The same trainer trains the
// LLaMA-style decoder (CharLmSettings::model): its parameter count at the defaults against the
// GPT-2 model's, its checkpoints (family and sizes in the manifest, an exact resume), the refusal
// of a checkpoint of the other family or of other decoder sizes (a manifest without a model line
// is GPT-2's, as every one written before the decoder), and its sampling through its cache.
#define BOOST_TEST_MODULE checkpoints
#include "support.hpp"
#include "charlm_corpus.hpp"
#include "models/charlm.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

using namespace tapegrad;
namespace fs = std::filesystem;

namespace {

using testing::small_charlm;
using testing::small_llama;

std::vector<std::string> manifest_lines(const fs::path& checkpoint) {
    std::ifstream manifest(checkpoint / "manifest.txt");
    std::vector<std::string> lines;
    for (std::string line; std::getline(manifest, line);) lines.push_back(line);
    return lines;
}

bool has_line(const std::vector<std::string>& lines, const std::string& line) {
    return std::find(lines.begin(), lines.end(), line) != lines.end();
}

// A copy of the checkpoint `saved` as `target`, its manifest without the line of `key`.
void copy_without_manifest_line(const fs::path& saved, const fs::path& target, const std::string& key) {
    fs::remove_all(target);
    fs::copy(saved, target);
    std::string text;
    for (const std::string& line : manifest_lines(saved)) {
        if (!line.starts_with(key + " ")) text += line + "\n";
    }
    std::ofstream(target / "manifest.txt") << text;
}

// What one of DIR, DIR.partial, DIR.previous holds. A save writes the manifest last, so a directory
// holding a manifest holds every file; "half_files" is a save killed during its files.
enum class Slot { absent, complete, without_manifest, half_files };
constexpr std::array all_slots{Slot::absent, Slot::complete, Slot::without_manifest, Slot::half_files};

std::string slot_name(Slot slot) {
    switch (slot) {
        case Slot::absent: return "absent";
        case Slot::complete: return "complete";
        case Slot::without_manifest: return "without manifest";
        case Slot::half_files: return "half of the files";
    }
    return "?";
}

// The steps of the checkpoints placed in each name (their ages: DIR.partial newest).
constexpr std::size_t previous_steps = 1, current_steps = 2, partial_steps = 3, saving_steps = 4;

struct Layout {
    Slot current, partial, previous;  // DIR, DIR.partial, DIR.previous

    std::string text() const {
        return fmt::format("DIR {}, DIR.partial {}, DIR.previous {}", slot_name(current), slot_name(partial),
                           slot_name(previous));
    }
    // The steps of the newest complete checkpoint, if any.
    std::optional<std::size_t> newest_complete() const {
        if (partial == Slot::complete) return partial_steps;
        if (current == Slot::complete) return current_steps;
        if (previous == Slot::complete) return previous_steps;
        return std::nullopt;
    }
};

std::vector<Layout> every_layout() {
    std::vector<Layout> layouts;
    for (const Slot current : all_slots) {
        for (const Slot partial : all_slots) {
            for (const Slot previous : all_slots) layouts.push_back({current, partial, previous});
        }
    }
    return layouts;
}

// Copies the complete checkpoint `source` to `target` as `slot` says (half_files: the first half
// of the .npy files in name order, as a save killed at its pause point holds half of them).
void place(const fs::path& source, const fs::path& target, Slot slot) {
    if (slot == Slot::absent) return;
    std::vector<fs::path> files;
    for (const fs::directory_entry& entry : fs::directory_iterator(source)) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    std::erase_if(files, [&](const fs::path& file) { return slot != Slot::complete && file.filename() == "manifest.txt"; });
    if (slot == Slot::half_files) files.resize(files.size() / 2);
    fs::create_directories(target);
    for (const fs::path& file : files) fs::copy_file(file, target / file.filename());
}

// The three checkpoints (after 1, 2, 3 steps) saved once by the real save, their parameters, and a
// trainer at step 4 that saves over each layout; all in a scratch directory removed at the end.
struct Fixture {
    fs::path root = fs::temp_directory_path() / fmt::format("tapegrad_checkpoints_{}", ::getpid());
    Corpus corpus = testing::random_corpus(11, 2000);
    CharLmTrainer trainer{small_charlm(), corpus};
    std::map<std::size_t, std::vector<Tensor<double>>> parameters_at;  // by steps done

    Fixture() {
        fs::remove_all(root);
        for (const std::size_t steps : {previous_steps, current_steps, partial_steps}) {
            trainer.step();
            trainer.save(source(steps));
            parameters_at[steps] = trainer.parameters();
        }
        trainer.step();
        parameters_at[saving_steps] = trainer.parameters();
    }
    ~Fixture() { fs::remove_all(root); }

    fs::path source(std::size_t steps) const { return root / fmt::format("saved_after_{}", steps); }
    fs::path checkpoint() const { return root / "run" / "DIR"; }
    fs::path with_suffix(const std::string& suffix) const { return checkpoint().string() + suffix; }

    // A fresh DIR, DIR.partial and DIR.previous as the layout says.
    void lay_out(const Layout& layout) const {
        fs::remove_all(root / "run");
        fs::create_directories(root / "run");
        place(source(current_steps), checkpoint(), layout.current);
        place(source(partial_steps), with_suffix(".partial"), layout.partial);
        place(source(previous_steps), with_suffix(".previous"), layout.previous);
    }
};

// The steps_done of the checkpoint find_checkpoint(directory) finds, from its manifest.
std::size_t steps_found(const fs::path& directory) {
    return std::stoul(charlm_files::read_manifest(find_checkpoint(directory)).at("steps_done"));
}

// No complete checkpoint: find_checkpoint and load refuse with an io_error naming DIR and the two
// names an interrupted save leaves beside it.
void expect_refused(const Fixture& fixture) {
    const std::string message = testing::message_of<io_error>([&] { find_checkpoint(fixture.checkpoint()); });
    for (const std::string& word : {fixture.checkpoint().string(), std::string("no checkpoint"),
                                   fixture.with_suffix(".partial").string(), fixture.with_suffix(".previous").string()}) {
        BOOST_TEST(message.find(word) != std::string::npos, "'" << word << "' missing from: " << message);
    }
    CharLmTrainer resumed(small_charlm(), fixture.corpus);
    BOOST_TEST(testing::message_of<io_error>([&] { resumed.load(fixture.checkpoint()); }) == message);
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_three_checkpoints_are_distinguishable) {
    const Fixture fixture;
    for (const std::size_t steps : {previous_steps, current_steps, partial_steps}) {
        BOOST_TEST(steps_found(fixture.source(steps)) == steps);
    }
    BOOST_TEST(!(fixture.parameters_at.at(previous_steps) == fixture.parameters_at.at(current_steps)));
    BOOST_TEST(!(fixture.parameters_at.at(current_steps) == fixture.parameters_at.at(partial_steps)));
    BOOST_TEST(!(fixture.parameters_at.at(partial_steps) == fixture.parameters_at.at(saving_steps)));
}

// What a checkpoint holds beside the files, and what load refuses: the manifest names every
// parameter with its shape; a checkpoint of another model size, or of another scalar type than
// the run's, and a manifest without one of its fields, are refused by name (a resume never
// converts or guesses).
BOOST_AUTO_TEST_CASE(the_manifest_names_every_parameter_and_load_refuses_what_does_not_match) {
    const Fixture fixture;
    const fs::path saved = fixture.source(current_steps);
    const TransformerConfig config = CharLmGpt2(small_charlm(), fixture.corpus.alphabet.size()).config;
    const std::vector<std::string> names = parameter_names(config);
    const std::vector<Shape> shapes = parameter_shapes(config);
    std::vector<std::string> parameter_lines = manifest_lines(saved);
    std::erase_if(parameter_lines, [](const std::string& line) { return !line.starts_with("parameter "); });
    BOOST_TEST_REQUIRE(parameter_lines.size() == names.size());
    for (std::size_t i = 0; i < names.size(); ++i) {
        BOOST_TEST(parameter_lines[i] == fmt::format("parameter {} {}", names[i], shapes[i].to_string()));
    }

    CharLmSettings wider = small_charlm();
    wider.width = 32;
    CharLmTrainer other_size(wider, fixture.corpus);
    const std::string size_refusal = testing::message_of<value_error>([&] { other_size.load(saved); });
    BOOST_TEST(size_refusal.find("is for another model or corpus") != std::string::npos, size_refusal);

    BasicCharLmTrainer<float> single(small_charlm(), fixture.corpus);
    const std::string dtype_refusal = testing::message_of<value_error>([&] { single.load(saved); });
    BOOST_TEST(dtype_refusal.find("holds float64 parameters and moments, this run trains in float32: resume it with "
                                  "--dtype float64") != std::string::npos, dtype_refusal);

    const fs::path damaged = fixture.root / "damaged";
    copy_without_manifest_line(saved, damaged, "heads");
    CharLmTrainer resumed(small_charlm(), fixture.corpus);
    const std::string lacking = testing::message_of<io_error>([&] { resumed.load(damaged); });
    BOOST_TEST(lacking.find("checkpoint manifest lacks 'heads'") != std::string::npos, lacking);
}

// Every layout: the newest complete checkpoint is found and loaded (its steps and its parameters),
// or, with none complete, a clear io_error.
BOOST_AUTO_TEST_CASE(recovery_takes_the_newest_complete_checkpoint_of_every_layout) {
    const Fixture fixture;
    for (const Layout& layout : every_layout()) {
        BOOST_TEST_CONTEXT(layout.text()) {
            fixture.lay_out(layout);
            const std::optional<std::size_t> newest = layout.newest_complete();
            if (!newest) {
                expect_refused(fixture);
                continue;
            }
            BOOST_TEST(steps_found(fixture.checkpoint()) == *newest);
            CharLmTrainer resumed(small_charlm(), fixture.corpus);
            resumed.load(fixture.checkpoint());
            BOOST_TEST(resumed.steps_done() == *newest);
            BOOST_TEST((resumed.parameters() == fixture.parameters_at.at(*newest)));
        }
    }
}

namespace {

struct PausedSave {
    bool paused;  // the child announced the pause
    int status;   // its wait status
};

// Runs trainer.save(directory) in a forked child with the save's test pause at `point` ("files" or
// "renamed") for `milliseconds`, calls at_pause(child) when it announces the pause, and waits for it.
template <class AtPause>
PausedSave save_paused(const CharLmTrainer& trainer, const fs::path& directory, const std::string& point,
                       unsigned milliseconds, AtPause at_pause) {
    int pipe_ends[2];
    BOOST_REQUIRE(::pipe(pipe_ends) == 0);
    const pid_t child = ::fork();
    BOOST_REQUIRE(child >= 0);
    if (child == 0) {
        ::dup2(pipe_ends[1], STDERR_FILENO);
        ::close(pipe_ends[0]);
        const std::string setting = fmt::format("{}:{}:{}", trainer.steps_done(), point, milliseconds);
        ::setenv("TAPEGRAD_CHARLM_TEST_PAUSE", setting.c_str(), 1);
        try {
            trainer.save(directory);
        } catch (...) {
            ::_exit(1);
        }
        ::_exit(0);
    }
    ::close(pipe_ends[1]);
    std::string said;
    char buffer[256];
    ssize_t count = 0;
    while (said.find("charlm test pause") == std::string::npos &&
           (count = ::read(pipe_ends[0], buffer, sizeof buffer)) > 0) {
        said.append(buffer, static_cast<std::size_t>(count));
    }
    const bool paused = said.find(fmt::format("charlm test pause: {} at step", point)) != std::string::npos;
    if (paused) at_pause(child);
    int status = 0;
    ::waitpid(child, &status, 0);
    ::close(pipe_ends[0]);
    return {paused, status};
}

// The save SIGKILLed at its pause. False if it never paused.
bool save_killed_at(const CharLmTrainer& trainer, const fs::path& directory, const std::string& point) {
    return save_paused(trainer, directory, point, 20000, [](pid_t child) { ::kill(child, SIGKILL); }).paused;
}

}  // namespace

// A save of step 4 killed half way through its files, from every layout: the newest complete
// checkpoint the layout held is still found (the save settles what it found before clearing
// DIR.partial, so it never deletes the only complete one), or none when the layout held none.
BOOST_AUTO_TEST_CASE(a_save_killed_in_its_files_keeps_the_newest_complete_checkpoint) {
    const Fixture fixture;
    for (const Layout& layout : every_layout()) {
        BOOST_TEST_CONTEXT(layout.text()) {
            fixture.lay_out(layout);
            BOOST_REQUIRE(save_killed_at(fixture.trainer, fixture.checkpoint(), "files"));
            // The hook's "files" point: half of the 16 parameters' files written (each parameter
            // and its two moments), and no manifest.
            const auto written = std::distance(fs::directory_iterator(fixture.with_suffix(".partial")), fs::directory_iterator());
            BOOST_TEST(written == 3 * 16 / 2);
            BOOST_TEST(!fs::exists(fixture.with_suffix(".partial") / "manifest.txt"));
            const std::optional<std::size_t> newest = layout.newest_complete();
            if (!newest) {
                expect_refused(fixture);
                continue;
            }
            BOOST_TEST(steps_found(fixture.checkpoint()) == *newest);
        }
    }
}

// A save whose second rename fails (DIR.partial removed while the save pauses 1 s between its
// renames; any failure there is the same to the save) puts DIR.previous back as DIR and throws:
// the older checkpoint is where it was, under its own name, and nothing is left beside it.
BOOST_AUTO_TEST_CASE(a_save_failing_at_its_second_rename_puts_the_checkpoint_back) {
    const Fixture fixture;
    fixture.lay_out({Slot::complete, Slot::absent, Slot::absent});
    const PausedSave save = save_paused(fixture.trainer, fixture.checkpoint(), "renamed", 1000, [&](pid_t) {
        BOOST_TEST(!fs::exists(fixture.checkpoint()));  // DIR is DIR.previous now
        fs::remove_all(fixture.with_suffix(".partial"));
    });
    BOOST_REQUIRE(save.paused);
    BOOST_TEST((WIFEXITED(save.status) && WEXITSTATUS(save.status) == 1));  // the save threw
    BOOST_TEST(charlm_files::complete(fixture.checkpoint()));
    BOOST_TEST(!fs::exists(fixture.with_suffix(".previous")));
    BOOST_TEST(!fs::exists(fixture.with_suffix(".partial")));
    BOOST_TEST(steps_found(fixture.checkpoint()) == current_steps);
}

// Killed between the two renames (DIR gone to DIR.previous, DIR.partial complete and not yet DIR),
// from every layout: step 4, the newer checkpoint, is found and loaded, not the older DIR.previous.
// A save run to its end leaves step 4 in DIR and nothing beside it.
BOOST_AUTO_TEST_CASE(a_save_killed_between_its_renames_or_finished_gives_the_new_checkpoint) {
    const Fixture fixture;
    for (const Layout& layout : every_layout()) {
        BOOST_TEST_CONTEXT(layout.text()) {
            fixture.lay_out(layout);
            BOOST_REQUIRE(save_killed_at(fixture.trainer, fixture.checkpoint(), "renamed"));
            BOOST_TEST(!fs::exists(fixture.checkpoint()));
            BOOST_TEST(steps_found(fixture.checkpoint()) == saving_steps);
            CharLmTrainer resumed(small_charlm(), fixture.corpus);
            resumed.load(fixture.checkpoint());
            BOOST_TEST((resumed.parameters() == fixture.parameters_at.at(saving_steps)));

            fixture.lay_out(layout);
            fixture.trainer.save(fixture.checkpoint());
            BOOST_TEST(steps_found(fixture.checkpoint()) == saving_steps);
            BOOST_TEST(charlm_files::complete(fixture.checkpoint()));
            BOOST_TEST(!fs::exists(fixture.with_suffix(".partial")));
            BOOST_TEST(!fs::exists(fixture.with_suffix(".previous")));
        }
    }
}

// ---- The LLaMA-style decoder through the same trainer -------------------------------------------

namespace {

// A scratch directory of its own, removed at the end.
struct Scratch {
    fs::path root;
    explicit Scratch(const std::string& name)
        : root(fs::temp_directory_path() / fmt::format("tapegrad_checkpoints_{}_{}", name, ::getpid())) {
        fs::remove_all(root);
        fs::create_directories(root);
    }
    ~Scratch() { fs::remove_all(root); }
};

}  // namespace

// The counts the decoder's default F was chosen by. GPT-2: per block 4D² + 2DM + 5D + M (M = 4D),
// positions T·D and the final norm's 2D; the decoder: per block 2D + D² + 2·D·(H_kv·dh) + D² +
// 3·D·F and the final gain's D; both V·D for the tied embedding. At the defaults (L 2, D 64, H 4,
// H_kv 2, dh 16, F 205, T 64): 103,680 + V·D against 103,616 + V·D, and F = 205 is the widest MLP
// whose decoder does not outgrow the GPT-2 model.
BOOST_AUTO_TEST_CASE(the_default_decoder_holds_as_many_parameters_as_the_default_gpt2_model) {
    const CharLmSettings gpt2{};
    CharLmSettings llama{};
    llama.model = CharLmModel::llama;
    BOOST_TEST((gpt2.model == CharLmModel::gpt2));  // the default family, as before the decoder
    const std::size_t L = 2, D = 64, M = 4 * D, T = 64, H = 4, kv_width = 2 * (D / H), F = 205, V = 93;
    BOOST_TEST_REQUIRE((gpt2.layers == L && gpt2.width == D && gpt2.heads == H && gpt2.context == T));
    BOOST_TEST_REQUIRE((llama.kv_heads * (D / H) == kv_width && llama.hidden == F && llama.tied));
    const std::size_t gpt2_count = parameter_values(char_lm_network(gpt2, V));
    const std::size_t llama_count = parameter_values(char_lm_network(llama, V));
    BOOST_TEST(gpt2_count == L * (4 * D * D + 2 * D * M + 5 * D + M) + T * D + 2 * D + V * D);
    BOOST_TEST(llama_count == L * (2 * D + D * D + 2 * D * kv_width + D * D + 3 * D * F) + D + V * D);
    BOOST_TEST(gpt2_count == 103'680 + V * D);
    BOOST_TEST(llama_count == 103'616 + V * D);
    llama.hidden = F + 1;
    BOOST_TEST(parameter_values(char_lm_network(llama, V)) > gpt2_count);
}

// A decoder checkpoint: the manifest names the family, its sizes (kv_heads, hidden, tied among
// them) and every parameter with its shape; a resume restores parameters and Adam's moments (the
// next step of both ends with the same bits). The trainer's config is the decoder's; asking it
// for the GPT-2 config is refused by name.
BOOST_AUTO_TEST_CASE(a_decoder_checkpoint_names_its_family_and_sizes_and_resumes_exactly) {
    const Scratch scratch("llama");
    const Corpus corpus = testing::random_corpus(11, 2000);
    CharLmTrainer trainer(small_llama(), corpus);
    trainer.step();
    trainer.step();
    trainer.save(scratch.root / "llama");
    const std::vector<std::string> lines = manifest_lines(scratch.root / "llama");
    for (const char* line : {"model llama", "layers 1", "width 16", "heads 2", "kv_heads 1", "hidden 24", "tied yes",
                             "context 16", "dtype float64", "steps_done 2"}) {
        BOOST_TEST(has_line(lines, line), "'" << line << "' missing from the manifest");
    }
    const LlamaConfig& config = trainer.config<LlamaConfig>();
    const std::vector<std::string> names = parameter_names(config);
    const std::vector<Shape> shapes = parameter_shapes(config);
    BOOST_TEST(names.size() == 11u);  // E, 9 in the one block, the final gain: no W_out when tied
    for (std::size_t i = 0; i < names.size(); ++i) {
        BOOST_TEST(has_line(lines, fmt::format("parameter {} {}", names[i], shapes[i].to_string())), names[i]);
    }

    CharLmTrainer resumed(small_llama(), corpus);
    resumed.load(scratch.root / "llama");
    BOOST_TEST(resumed.steps_done() == 2u);
    BOOST_TEST((resumed.parameters() == trainer.parameters()));
    BOOST_TEST(resumed.step() == trainer.step());
    BOOST_TEST((resumed.parameters() == trainer.parameters()));

    const std::string other = testing::message_of<usage_error>([&] { (void)trainer.config(); });
    BOOST_TEST(other.find("this trainer's model, llama") != std::string::npos, other);
}

// A bfloat16 run (CharLmSettings::products, a float trainer whose products read bfloat16) names
// itself in its checkpoint, resumes exactly, and is refused by a float32 run and refuses a float32
// checkpoint, both ways naming the other; a double trainer refuses the policy; its steps differ
// from the float32 trainer's (the products really read bfloat16), for both families.
BOOST_AUTO_TEST_CASE(a_bfloat16_run_names_itself_resumes_exactly_and_refuses_float32_both_ways) {
    const Scratch scratch("bfloat16");
    const Corpus corpus = testing::random_corpus(11, 2000);
    for (CharLmSettings settings : {small_charlm(), small_llama()}) {
        const std::string family(char_lm_model_name(settings.model));
        BasicCharLmTrainer<float> float32(settings, corpus);
        settings.products = ProductPrecision::bfloat16;
        BasicCharLmTrainer<float> trainer(settings, corpus);
        BOOST_TEST(trainer.dtype() == "bfloat16");
        const double first = trainer.step(), first_float32 = float32.step();
        BOOST_TEST(std::isfinite(first));
        // The same start, the loss through bfloat16 products: near float32's (bfloat16 keeps 2-3
        // digits of each product's operands; the loss ~2.5 nats moves by far less than 1%). The
        // loss itself may round to the same float (at the first step the logits are ~1e-2 and their
        // bfloat16 error moves it below float32's last place); the gradient moves by bfloat16's
        // error, about 2⁻⁹ of each element, which its norm shows and no float rounding hides.
        BOOST_TEST(std::fabs(first - first_float32) < 0.01 * first_float32, family);
        BOOST_TEST(trainer.last_gradient_norm() != float32.last_gradient_norm(), family);
        trainer.step();
        float32.step();
        trainer.save(scratch.root / family);
        float32.save(scratch.root / (family + "_float32"));
        BOOST_TEST(has_line(manifest_lines(scratch.root / family), "dtype bfloat16"), family);

        BasicCharLmTrainer<float> resumed(settings, corpus);
        resumed.load(scratch.root / family);
        BOOST_TEST((resumed.parameters() == trainer.parameters()));
        BOOST_TEST(resumed.step() == trainer.step(), family);
        BOOST_TEST((resumed.parameters() == trainer.parameters()));

        const std::string into_bf16 =
            testing::message_of<value_error>([&] { resumed.load(scratch.root / (family + "_float32")); });
        BOOST_TEST(into_bf16.find("holds float32 parameters and moments, this run trains in bfloat16: resume it with "
                                  "--dtype float32") != std::string::npos, into_bf16);
        settings.products = ProductPrecision::tape;
        BasicCharLmTrainer<float> as_float32(settings, corpus);
        const std::string into_float32 = testing::message_of<value_error>([&] { as_float32.load(scratch.root / family); });
        BOOST_TEST(into_float32.find("holds float32 parameters and moments of a bfloat16 run, this run trains in "
                                     "float32: resume it with --dtype bfloat16") != std::string::npos, into_float32);
        settings.products = ProductPrecision::bfloat16;
        const std::string on_double = testing::message_of<usage_error>([&] { CharLmTrainer refused(settings, corpus); });
        BOOST_TEST(on_double.find("bfloat16 products are a float32 tape's policy") != std::string::npos, on_double);
    }
}

// Resuming across families is refused both ways with a message naming both (and the option that
// would resume it); a decoder checkpoint resumed with other kv_heads, hidden or tied is refused
// with both sizes named, the checkpoint's and the run's.
BOOST_AUTO_TEST_CASE(a_checkpoint_of_the_other_family_or_other_decoder_sizes_is_refused_naming_both) {
    const Scratch scratch("families");
    const Corpus corpus = testing::random_corpus(11, 2000);
    CharLmTrainer gpt2(small_charlm(), corpus), llama(small_llama(), corpus);
    gpt2.step();
    llama.step();
    gpt2.save(scratch.root / "gpt2");
    llama.save(scratch.root / "llama");

    CharLmTrainer as_llama(small_llama(), corpus), as_gpt2(small_charlm(), corpus);
    const std::string into_llama = testing::message_of<value_error>([&] { as_llama.load(scratch.root / "gpt2"); });
    BOOST_TEST(into_llama.find("holds the gpt2 model, this run trains the llama model: resume it with --model gpt2") !=
                   std::string::npos,
               into_llama);
    const std::string into_gpt2 = testing::message_of<value_error>([&] { as_gpt2.load(scratch.root / "llama"); });
    BOOST_TEST(into_gpt2.find("holds the llama model, this run trains the gpt2 model: resume it with --model llama") !=
                   std::string::npos,
               into_gpt2);

    struct Change {
        std::string saved, asked;  // the manifest's size and the run's
        void (*apply)(CharLmSettings&);
    };
    for (const Change& change : {Change{"kv_heads 1", "kv_heads 2", [](CharLmSettings& s) { s.kv_heads = 2; }},
                                 Change{"hidden 24", "hidden 25", [](CharLmSettings& s) { s.hidden = 25; }},
                                 Change{"tied yes", "tied no", [](CharLmSettings& s) { s.tied = false; }}}) {
        BOOST_TEST_CONTEXT(change.asked) {
            CharLmSettings settings = small_llama();
            change.apply(settings);
            CharLmTrainer other(settings, corpus);
            const std::string refusal = testing::message_of<value_error>([&] { other.load(scratch.root / "llama"); });
            const std::size_t split = refusal.find("; this run: ");
            BOOST_TEST_REQUIRE(split != std::string::npos, refusal);
            BOOST_TEST(refusal.find("is for another model or corpus (checkpoint: llama") != std::string::npos, refusal);
            BOOST_TEST(refusal.substr(0, split).find(change.saved) != std::string::npos, refusal);
            BOOST_TEST(refusal.substr(split).find("this run: llama") != std::string::npos, refusal);
            BOOST_TEST(refusal.substr(split).find(change.asked) != std::string::npos, refusal);
        }
    }
}

// A checkpoint written before the decoder has no model line: it is a GPT-2 checkpoint, resumed by
// the GPT-2 model and refused by the decoder as one.
BOOST_AUTO_TEST_CASE(a_manifest_without_a_model_line_is_a_gpt2_checkpoint) {
    const Fixture fixture;
    const fs::path saved = fixture.source(current_steps), older = fixture.root / "before_the_decoder";
    BOOST_TEST(has_line(manifest_lines(saved), "model gpt2"));
    copy_without_manifest_line(saved, older, "model");
    const std::vector<std::string> lines = manifest_lines(older);
    BOOST_TEST_REQUIRE(
        std::none_of(lines.begin(), lines.end(), [](const std::string& l) { return l.starts_with("model"); }));

    CharLmTrainer resumed(small_charlm(), fixture.corpus);
    resumed.load(older);
    BOOST_TEST(resumed.steps_done() == current_steps);
    BOOST_TEST((resumed.parameters() == fixture.parameters_at.at(current_steps)));
    CharLmTrainer decoder(small_llama(), fixture.corpus);
    const std::string refusal = testing::message_of<value_error>([&] { decoder.load(older); });
    BOOST_TEST(refusal.find("holds the gpt2 model, this run trains the llama model") != std::string::npos, refusal);
}

// Sampling runs the decoder through its key/value cache, a block of one character at a time, and
// past the context (16) starts the cache again from the last half of it: 40 characters come out,
// each of the alphabet, the same for the same seed. A cache never started again would run past
// the context and be refused (llama_logits checks the positions).
BOOST_AUTO_TEST_CASE(the_decoder_samples_through_its_cache_past_the_context) {
    const Corpus corpus = testing::random_corpus(11, 2000);
    CharLmTrainer trainer(small_llama(), corpus);
    trainer.step();
    const std::string text = trainer.sample("abc", 40, 5);
    BOOST_TEST(text.size() == 40u);
    BOOST_TEST(text.find_first_not_of(corpus.alphabet) == std::string::npos, text);
    BOOST_TEST(trainer.sample("abc", 40, 5) == text);
}
