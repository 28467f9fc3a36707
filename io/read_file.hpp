/// \file
/// A whole file's bytes, for the readers of files (load_npy, load_safetensors, load_tape, the
/// char-LM's corpus and checkpoints): io_error naming the reader and the file when it cannot be
/// opened, is a directory, or cannot be read whole. The file is read into a string of its size in
/// one read (no stream buffer growing beside it). A directory is refused by name first: opening
/// one succeeds, and reading it then fails with EISDIR (libstdc++'s istreambuf_iterator even throws
/// std::ios_base::failure out of it).
#pragma once

#include "autodiff/error.hpp"

#include <fmt/core.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ios>
#include <string>
#include <string_view>
#include <system_error>

namespace tapegrad {

inline std::string read_file_bytes(const std::filesystem::path& path, std::string_view who) {
    std::error_code ignored;
    if (std::filesystem::is_directory(path, ignored)) {
        throw io_error(fmt::format("{}: cannot read '{}': it is a directory", who, path.string()));
    }
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) throw io_error(fmt::format("{}: cannot open '{}': {}", who, path.string(), std::strerror(errno)));
    const std::streamoff size = in.tellg();
    if (size < 0) throw io_error(fmt::format("{}: cannot tell the size of '{}'", who, path.string()));
    std::string bytes(static_cast<std::size_t>(size), '\0');
    in.seekg(0);
    in.read(bytes.data(), size);
    if (in.gcount() != size) throw io_error(fmt::format("{}: error reading '{}'", who, path.string()));
    return bytes;
}

}  // namespace tapegrad
