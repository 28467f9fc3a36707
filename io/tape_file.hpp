/// \file
/// Saved tapes: a recorded Tape<double> or Tape<float> written to one file and read back, so that
/// the graph that fails can leave the process (attached to a bug report, re-checked in CI or on
/// another machine: `tapegrad-check --tape FILE`).
///
/// The file (format version 1, docs/tape-file.md) is a JSON document, one node per line:
///   {"format": "tapegrad-tape", "version": 1, "scalar": "float64", "output": 7, "nodes": [
///   {"node": "leaf", "label": "X", "shape": [3, 2], "values": ["1p+0", "0p+0", ...]},
///   {"node": "constant", "label": "G", "shape": [3, 3], "values": [...]},
///   {"node": "op", "op": "matmul", "inputs": [0, 1], "shape": [3, 2], "label": "Q"},
///   {"node": "op", "op": "scale", "inputs": [4], "shape": [3, 3], "settings": {"c": "1.6a09e667f3bcdp-1"}},
///   ...]}
/// Nodes are in recorded order, each op's inputs are earlier nodes, and the seeded output is the
/// last node. Values and real-valued settings are hexadecimal floating-point text (C's "%a" without
/// the 0x): exact, so a loaded tape computes bit for bit what the saved one did. Ops are the
/// library's, by name, with their typed settings by field name.
///
/// Loading validates the whole document first (format, version, scalar type, every node's kind,
/// inputs, op name, settings, shape and values), then records the nodes on the caller's empty tape
/// through the ops' own public functions, so each op checks its inputs and settings as it does for a
/// program; a node whose re-recorded shape differs from the saved one is refused. Any fault raises
/// io_error naming the file, the node and the fault, before the faulty node computes anything.
/// Saving writes a temporary file beside the target and renames it, so a failed save leaves no
/// half-written file. Compiled in the library (src/io/tape_file.cpp, which uses nlohmann/json).
/// Files are named by std::string (a std::filesystem::path converts to one), so that including this
/// header costs no `<filesystem>`.
#pragma once

#include "autodiff/tape.hpp"

#include <string>
#include <string_view>

namespace tapegrad {

/// The format version this library writes and reads.
inline constexpr int tape_file_version = 1;

/// The scalar type of a saved tape: the tape it loads into.
enum class TapeFileScalar { float32, float64 };

/// The file's text for the graph of `tape` up to `output` (every node up to it, in order).
/// usage_error for an output of another tape or an op this format does not hold (a user's op).
std::string tape_file_text(const Tape<double>& tape, const Var<double>& output);
std::string tape_file_text(const Tape<float>& tape, const Var<float>& output);

/// Writes tape_file_text to `file` (atomically: a temporary file renamed); io_error when it cannot.
void save_tape(const std::string& file, const Tape<double>& tape, const Var<double>& output);
void save_tape(const std::string& file, const Tape<float>& tape, const Var<float>& output);

/// `bytes` into `file` through a temporary file (`<file>.partial-<pid>`) renamed into place, so the
/// file holds its old content or all of the new, never a part; io_error naming `who` otherwise.
/// What save_tape, the char-LM's checkpoints and tapegrad-audit write with.
void write_file_atomically(const std::string& file, const std::string& bytes, std::string_view who);

/// The scalar type a saved tape holds (the document is validated as by load_tape, without
/// recording anything).
TapeFileScalar tape_file_scalar(const std::string& file);

/// Records the saved graph on `tape` (which must be empty) and returns its output. io_error for a
/// missing, unreadable or malformed file, an unknown version, or a tape of the other scalar type.
Var<double> load_tape(const std::string& file, Tape<double>& tape);
Var<float> load_tape(const std::string& file, Tape<float>& tape);

/// The same from the file's text; `source` names it in messages (tests, the fuzz target).
TapeFileScalar parse_tape_scalar(std::string_view text, std::string_view source);
Var<double> parse_tape(std::string_view text, std::string_view source, Tape<double>& tape);
Var<float> parse_tape(std::string_view text, std::string_view source, Tape<float>& tape);

}  // namespace tapegrad
