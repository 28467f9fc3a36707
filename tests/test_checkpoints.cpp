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
// a save whose second rename fails puts DIR.previous back as DIR.
#define BOOST_TEST_MODULE checkpoints
#include "support.hpp"
#include "models/charlm.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

using namespace tapegrad;
namespace fs = std::filesystem;

namespace {

// A char-LM small enough that a step and a save take milliseconds: 16 parameters, 49 files.
CharLmSettings small_charlm() { return {.layers = 1, .width = 16, .heads = 2, .context = 16, .batch = 4}; }

Corpus random_corpus() {
    Corpus corpus;
    corpus.alphabet = "abcdefghijk ";
    std::mt19937_64 generator(11);
    for (std::size_t k = 0; k < 2000; ++k) corpus.train.push_back(generator() % corpus.alphabet.size());
    corpus.validation = corpus.train;
    return corpus;
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
    Corpus corpus = random_corpus();
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
    const TransformerConfig config = small_charlm().model(fixture.corpus.alphabet.size());
    const std::vector<std::string> names = parameter_names(config);
    const std::vector<Shape> shapes = parameter_shapes(config);
    std::ifstream manifest(saved / "manifest.txt");
    std::vector<std::string> parameter_lines;
    for (std::string line; std::getline(manifest, line);) {
        if (line.starts_with("parameter ")) parameter_lines.push_back(line);
    }
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
    fs::remove_all(damaged);
    fs::copy(saved, damaged);
    std::string text;
    {
        std::ifstream in(saved / "manifest.txt");
        for (std::string line; std::getline(in, line);) {
            if (!line.starts_with("heads ")) text += line + "\n";
        }
    }
    std::ofstream(damaged / "manifest.txt") << text;
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
