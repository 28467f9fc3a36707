/// \file
/// safetensors interchange: reads and writes the format Hugging Face and PyTorch users share weights
/// in, so a model's parameters cross over to and from PyTorch:
///
///     save_safetensors("weights.safetensors", tensors);   // {name, SafetensorsDtype, Tensor<double>}
///     std::vector<SafetensorsTensor> weights = load_safetensors("weights.safetensors");
///
/// The format: 8 bytes, the header's length N (unsigned, little-endian); N bytes of a JSON object
/// mapping each tensor's name to {"dtype", "shape", "data_offsets": [begin, end]} (and an optional
/// "__metadata__" object of strings); then the data, each tensor's bytes at [begin, end) of it,
/// row-major, little-endian. Read: F64, F32, BF16 and F16, each converted exactly to double.
/// Written: any of the four, per tensor, rounded to nearest with ties to even from the double,
/// once (autodiff/low_precision.hpp for BF16 and F16: subnormals kept, ±inf past the largest);
/// NaN kept bit for bit in F64, and stored as the format's quiet NaN with its sign in the others
/// (0x7fc00000, 0x7fc0, 0x7e00: the payload dropped).
///
/// The header is held to the format (the safetensors README; the reference reader is the Rust
/// crate): it begins with '{', holds no NUL byte, and after its JSON object only spaces (0x20) may
/// pad it; no key appears twice in any object (a tensor's name, a field of its entry, a key of
/// __metadata__). Keys of an entry other than the three are ignored, as the reference reader
/// ignores them. Every malformed file raises io_error naming the file and the fault: shorter than 8
/// bytes, a header longer than the file, a header that is not a JSON object or not padded with
/// spaces, a NUL (with its offset), a key given twice, an entry that is not an object or lacks
/// one of its three fields, an unknown dtype, a shape that is not a list of at most 4 counts, each
/// dimension and offset that is not a count (negative, written with a fraction or an exponent,
/// past 2^64 − 1, or not a number: each its own words, with the tensor, the field, the index and
/// the JSON text), data_offsets out of the data or not [begin, end] with begin ≤ end, a byte count
/// that does not match the shape and dtype, two tensors overlapping, bytes of the data that no
/// tensor covers, a duplicate name. Messages are printable UTF-8 whatever the file holds: bytes
/// that are not UTF-8, and control characters, are written `\xNN`. Nothing is read outside the
/// bytes given and nothing is allocated before its size has been checked against them.
/// parse_safetensors works on bytes in memory, which is what the fuzzer drives. A failed save
/// leaves no file (written under a temporary name, renamed into place).
#pragma once

#include "autodiff/error.hpp"
#include "autodiff/tensor.hpp"

#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tapegrad {

enum class SafetensorsDtype { float64, float32, bfloat16, float16 };

/// The dtype's name in the header ("F64", "F32", "BF16", "F16").
std::string_view safetensors_dtype_name(SafetensorsDtype dtype);

/// One tensor of a file: its name, the dtype it was stored in, its values (exactly, in double).
struct SafetensorsTensor {
    std::string name;
    SafetensorsDtype dtype;
    Tensor<double> value;
};

/// The tensors of a safetensors file held in `bytes`, in the order of their data; `source` names
/// the file in messages.
std::vector<SafetensorsTensor> parse_safetensors(std::string_view bytes, std::string_view source = "<bytes>");

/// The tensors of the file at `path`.
std::vector<SafetensorsTensor> load_safetensors(const std::filesystem::path& path);

/// The file's bytes for `tensors`, in that order, each stored in its own dtype (usage_error for an
/// empty or duplicate name).
std::string safetensors_bytes(std::span<const SafetensorsTensor> tensors);

/// Writes the file (atomically: a failed write leaves none).
void save_safetensors(const std::filesystem::path& path, std::span<const SafetensorsTensor> tensors);

}  // namespace tapegrad
