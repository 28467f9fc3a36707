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
/// Written: any of the four, per tensor, rounded to nearest with ties to even from the double
/// (autodiff/low_precision.hpp for BF16 and F16: once, subnormals kept, ±inf past the largest,
/// NaN as the format's quiet NaN).
///
/// Every malformed file raises io_error naming the file and the fault: shorter than 8 bytes, a
/// header longer than the file, a header that is not a JSON object, an unknown dtype, a shape that
/// is not a list of counts (or has more than 4 axes), data_offsets out of the data or not
/// [begin, end] with begin ≤ end, a byte count that does not match the shape and dtype, two
/// tensors overlapping, bytes of the data that no tensor covers, a duplicate name. Nothing is read
/// outside the bytes given and nothing is allocated before its size has been checked against them.
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
