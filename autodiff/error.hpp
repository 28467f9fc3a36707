/// \file
/// tapegrad's exception hierarchy: every error the library raises derives from tapegrad::error,
/// and every message names the op (or function) and the shapes or values at fault.
#pragma once

#include <stdexcept>
#include <string>

namespace tapegrad {

/// Root of all tapegrad exceptions; catch this to handle any library error.
class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Shapes or ranks that an op cannot combine (e.g. "matmul: inner dimensions differ ...").
class shape_error : public error {
public:
    using error::error;
};

/// Values an op refuses: NaN, non-finite input where finiteness is required, bad indices, bad p.
class value_error : public error {
public:
    using error::error;
};

/// Misuse of the tape: values from another or a cleared tape, backward twice, missing seed.
class usage_error : public error {
public:
    using error::error;
};

/// Reading or writing files (.npy): missing file, malformed header, truncated data.
class io_error : public error {
public:
    using error::error;
};

}  // namespace tapegrad
