// tools/options.hpp's promises that test_options (the readers of numbers) does not hold (issue 49,
// item 2): the memory check the programs make before their first large allocation
// (cli::require_memory refuses a run larger than what is available, naming both numbers and the
// options that set it, and lets any run that fits through), the sizes it prints (bytes_text: GiB
// from 1 GiB up, MiB below), and where the available figure comes from (/proc/meminfo's
// MemAvailable, in bytes).
#define BOOST_TEST_MODULE options_promises
#include "support.hpp"
#include "tools/options.hpp"

#include <fstream>
#include <string>

using namespace tapegrad;

namespace {

// MemAvailable from /proc/meminfo in bytes, read here independently; 0 where the file lacks it.
double mem_available_now() {
    std::ifstream meminfo("/proc/meminfo");
    for (std::string line; std::getline(meminfo, line);) {
        if (line.starts_with("MemAvailable:")) return std::stod(line.substr(13)) * 1024;
    }
    return 0;
}

}  // namespace

// 1 GiB and up in GiB to a tenth, below it in whole MiB: 1 GiB is "1.0 GiB", a byte less "1024 MiB".
BOOST_AUTO_TEST_CASE(sizes_print_in_gib_from_one_gib_and_in_mib_below) {
    constexpr double mib = 1024.0 * 1024.0, gib = 1024.0 * mib;
    BOOST_TEST(cli::bytes_text(gib) == "1.0 GiB");
    BOOST_TEST(cli::bytes_text(gib - 1) == "1024 MiB");
    BOOST_TEST(cli::bytes_text(512 * mib) == "512 MiB");
    BOOST_TEST(cli::bytes_text(3.3 * gib) == "3.3 GiB");
    BOOST_TEST(cli::bytes_text(300 * gib) == "300.0 GiB");
}

// The available memory is MemAvailable in bytes (not kiB): within a factor of two of what
// /proc/meminfo says a moment later (it moves with other programs, never by 1024 times).
BOOST_AUTO_TEST_CASE(available_memory_is_memavailable_in_bytes) {
    const double from_file = mem_available_now();
    if (from_file == 0) {
        BOOST_TEST_MESSAGE("/proc/meminfo has no MemAvailable here: the sysconf fallback is not compared");
        return;
    }
    const double available = static_cast<double>(cli::available_memory());
    BOOST_TEST(available > from_file / 2);
    BOOST_TEST(available < from_file * 2);
}

// A run that needs more than is available is refused by a usage error (a po::error: the programs'
// one handler, exit 2) naming the options, both sizes and what the estimate counts; one that fits
// passes, up to all that is available.
BOOST_AUTO_TEST_CASE(a_run_larger_than_the_available_memory_is_refused_naming_both_sizes) {
    const double needed = 1e18;  // 888 PiB: more than any machine this runs on
    const std::string message = testing::message_of<boost::program_options::error>(
        [&] { cli::require_memory(needed, "values and gradients", "--context 1000000"); });
    BOOST_TEST(message.starts_with("--context 1000000 needs at least " + cli::bytes_text(needed) +
                                   " (values and gradients), and this machine has "),
               message);
    BOOST_TEST(message.ends_with(" available; make it smaller"), message);
    BOOST_CHECK_NO_THROW(cli::require_memory(1024.0, "a kilobyte", "--tiny"));
    BOOST_CHECK_NO_THROW(cli::require_memory(0.0, "nothing", "--none"));
}
