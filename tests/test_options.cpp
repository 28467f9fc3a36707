// The command-line readers of tools/options.hpp, each through Boost.Program_options as the programs
// use them: cli::integer (sizes, unsigned, 64-bit seeds, signed), cli::real, cli::positive_real
// and cli::integer_argument. The whole text must be the number: trailing characters ("1.5x",
// "10k", "2 "), leading blanks, an empty value, hexadecimal, a dangling exponent, nan and inf (a
// real must be finite, as the header says), values out of the type's range ("1e999", 2^64) or the
// option's, and negative text for an unsigned option are refused with a usage error naming the
// option and the value; the valid forms (a leading '+', exponents, the range's ends) are read.
#define BOOST_TEST_MODULE options
#include "support.hpp"
#include "tools/options.hpp"

#include <cstdint>
#include <string>
#include <vector>

using namespace tapegrad;
namespace po = boost::program_options;

namespace {

// The options a test program reads, one per reader and type.
struct Read {
    std::size_t size = 0;          // --size: at least 1
    unsigned threads = 0;          // --threads: 0 to cli::max_threads
    std::uint64_t seed = 0;        // --seed: any uint64_t
    int offset = 0;                // --offset: -10 to 10
    double rate = 0;               // --rate: positive, at most 10
    double decay = 0;              // --decay: 0 to 10
    double clip = 0;               // --clip: positive, no upper bound
    double shift = 0;              // --shift: of at least -1, no upper bound
};

po::options_description described(Read& read) {
    po::options_description description("test options");
    description.add_options()("size", cli::integer(&read.size, std::size_t{1}))(
        "threads", cli::integer(&read.threads, 0u, cli::max_threads))("seed", cli::integer(&read.seed, std::uint64_t{0}))(
        "offset", cli::integer(&read.offset, -10, 10))("rate", cli::positive_real(&read.rate, 10.0))(
        "decay", cli::real(&read.decay, 0.0, 10.0))("clip", cli::positive_real(&read.clip))(
        "shift", cli::real(&read.shift, -1.0));
    return description;
}

// Reads `--option=value` as a program does (store, then notify): the '=' form hands the parser
// the value as it is, whatever it starts with ("-inf", " 2"); an empty value as its own word
// (`--option ''`), as "--option=" is refused by the parser before any reader sees it.
Read read_option(const std::string& option, const std::string& value) {
    Read read;
    const po::options_description description = described(read);
    const std::vector<std::string> arguments =
        value.empty() ? std::vector<std::string>{"--" + option, value} : std::vector<std::string>{"--" + option + "=" + value};
    po::variables_map values;
    po::store(po::command_line_parser(arguments).options(description).run(), values);
    po::notify(values);
    return read;
}

// `--option value` must be refused by a po::error (the programs' one handler, exit 2) whose
// message names the option, quotes the value and says what is allowed.
void expect_refused(const std::string& option, const std::string& value, const std::string& allowed) {
    BOOST_TEST_CONTEXT("--" << option << " '" << value << "'") {
        const std::string message = testing::message_of<po::error>([&] { read_option(option, value); });
        for (const std::string& word : {"--" + option + " must be " + allowed, "got '" + value + "'"}) {
            BOOST_TEST(message.find(word) != std::string::npos, "'" << word << "' missing from: " << message);
        }
    }
}

// Text that is no number whatever the option's type: each must be refused by every option.
const std::vector<std::string> never_numbers{"", " 2", "2 ", "2\t", "abc", "+", "-", "++2", "2-", "1,5", "two"};

}  // namespace

BOOST_AUTO_TEST_CASE(integers_refuse_anything_but_the_whole_text_as_an_integer_in_range) {
    const std::string size = "an integer of at least 1", threads = "an integer from 0 to 4096",
                      seed = "an integer of at least 0", offset = "an integer from -10 to 10";
    for (const std::string& text : never_numbers) {
        expect_refused("size", text, size);
        expect_refused("offset", text, offset);
    }
    for (const std::string text : {"10k", "64k", "1.5", "1e3", "0x10", "10 ", "1_000", "3x"}) {
        expect_refused("size", text, size);
        expect_refused("threads", text, threads);
        expect_refused("seed", text, seed);
        expect_refused("offset", text, offset);
    }
    for (const std::string text : {"-1", "-5", "-18446744073709551615"}) expect_refused("seed", text, seed);
    expect_refused("size", "0", size);
    expect_refused("size", "-0", size);
    expect_refused("threads", "4097", threads);
    expect_refused("threads", "-1", threads);
    expect_refused("threads", "4294967296", threads);  // 2^32: would wrap to 0 in an unsigned
    expect_refused("seed", "18446744073709551616", seed);  // 2^64
    expect_refused("offset", "11", offset);
    expect_refused("offset", "-11", offset);
    expect_refused("offset", "-9223372036854775809", offset);  // below long long
}

BOOST_AUTO_TEST_CASE(integers_read_every_valid_form) {
    BOOST_TEST(read_option("size", "1").size == 1u);
    BOOST_TEST(read_option("size", "+64").size == 64u);
    BOOST_TEST(read_option("size", "007").size == 7u);
    BOOST_TEST(read_option("size", "18446744073709551615").size == std::numeric_limits<std::size_t>::max());
    BOOST_TEST(read_option("threads", "0").threads == 0u);
    BOOST_TEST(read_option("threads", "-0").threads == 0u);
    BOOST_TEST(read_option("threads", "4096").threads == 4096u);
    BOOST_TEST(read_option("seed", "18446744073709551615").seed == std::numeric_limits<std::uint64_t>::max());
    BOOST_TEST(read_option("offset", "-10").offset == -10);
    BOOST_TEST(read_option("offset", "+10").offset == 10);
}

BOOST_AUTO_TEST_CASE(reals_refuse_anything_but_the_whole_text_as_a_finite_real_in_range) {
    const std::string rate = "a number above 0 and at most 10", decay = "a number of at least 0 and at most 10",
                      clip = "a finite number above 0", shift = "a finite number of at least -1";
    for (const std::string& text : never_numbers) {
        expect_refused("rate", text, rate);
        expect_refused("shift", text, shift);
    }
    for (const std::string text : {"1.5x", "1e", "1e+", "1.5e-", "0x10", "0x1p3", "2.5.1", "1.5 ", "1.5f", "3e2k"}) {
        expect_refused("rate", text, rate);
        expect_refused("decay", text, decay);
        expect_refused("clip", text, clip);
        expect_refused("shift", text, shift);
    }
    for (const std::string text : {"nan", "NaN", "-nan", "inf", "+inf", "-inf", "infinity", "1e999", "-1e999"}) {
        expect_refused("clip", text, clip);
        expect_refused("shift", text, shift);
    }
    for (const std::string text : {"0", "-0", "-0.1", "10.000001", "1e-400"}) expect_refused("rate", text, rate);
    expect_refused("decay", "-1e-300", decay);
    expect_refused("decay", "10.5", decay);
    expect_refused("clip", "0", clip);
    expect_refused("shift", "-1.0000001", shift);
}

BOOST_AUTO_TEST_CASE(reals_read_every_valid_form) {
    BOOST_TEST(read_option("rate", "1.5").rate == 1.5);
    BOOST_TEST(read_option("rate", "+0.25").rate == 0.25);
    BOOST_TEST(read_option("rate", "1e-3").rate == 1e-3);
    BOOST_TEST(read_option("rate", "2.5E+0").rate == 2.5);
    BOOST_TEST(read_option("rate", "10").rate == 10.0);
    BOOST_TEST(read_option("decay", "0").decay == 0.0);
    BOOST_TEST(read_option("decay", "10").decay == 10.0);
    BOOST_TEST(read_option("clip", "1e300").clip == 1e300);
    BOOST_TEST(read_option("shift", "-1").shift == -1.0);
    BOOST_TEST(read_option("shift", "-0.5").shift == -0.5);
}

// A positional argument, read as an option is: refused with a usage_error naming the argument.
BOOST_AUTO_TEST_CASE(integer_arguments_refuse_by_name_and_read_valid_text) {
    const std::string name = "steps (the first argument)";
    for (const std::string text : {"", " 2", "2 ", "10k", "1.5", "0x10", "-3", "0", "1001", "1e3", "ten"}) {
        const std::string message =
            testing::message_of<cli::usage_error>([&] { cli::integer_argument<std::size_t>(name, text, 1, 1000); });
        const std::string expected = fmt::format("{} must be an integer from 1 to 1000, got '{}'", name, text);
        BOOST_TEST(message == expected);
    }
    BOOST_TEST(cli::integer_argument<std::size_t>(name, "1000", 1, 1000) == 1000u);
    BOOST_TEST(cli::integer_argument<std::size_t>(name, "+1", 1, 1000) == 1u);
    BOOST_TEST(cli::integer_argument<int>("shift", "-7", -10) == -7);
}
