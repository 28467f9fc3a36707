/// \file
/// A whole file's bytes, for the readers of files (io/npy.hpp, io/safetensors.hpp): io_error naming
/// the reader and the file when it cannot be opened, is a directory, or cannot be read. (libstdc++
/// reports a read error, a directory's EISDIR among them, by throwing std::ios_base::failure out of
/// the stream buffer; it is caught here and named, so no other exception leaves a reader.)
#pragma once

#include "autodiff/error.hpp"

#include <fmt/core.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ios>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>

namespace tapegrad {

inline std::string read_file_bytes(const std::filesystem::path& path, std::string_view who) {
    std::error_code ignored;
    if (std::filesystem::is_directory(path, ignored)) {
        throw io_error(fmt::format("{}: cannot read '{}': it is a directory", who, path.string()));
    }
    std::ifstream file(path, std::ios::binary);
    if (!file) throw io_error(fmt::format("{}: cannot open '{}': {}", who, path.string(), std::strerror(errno)));
    std::string bytes;
    try {
        bytes.assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
    } catch (const std::ios_base::failure& e) {
        throw io_error(fmt::format("{}: error reading '{}': {}", who, path.string(), e.what()));
    }
    if (file.bad()) throw io_error(fmt::format("{}: error reading '{}'", who, path.string()));
    return bytes;
}

}  // namespace tapegrad
