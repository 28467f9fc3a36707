/// \file
/// Umbrella header, the one include for users: everything of tapegrad_record.hpp (the engine,
/// every op, the models, input/output and the check of a recorded tape), .npy files (io/npy.hpp),
/// and the 50-digit side:
/// mp50 (autodiff/mp50.hpp, first, so that every op's mp50 entry points are the library's), the
/// generic-lambda gradient checker (check/gradcheck.hpp), the generic second-order checks
/// (check/second_order.hpp), the re-run of a recorded tape at any type (autodiff/rerun.hpp) and
/// the registration of a user's op (autodiff/registry.hpp).
/// A program that only records and checks library ops on Tape<double> or Tape<float> includes
/// tapegrad_record.hpp instead and compiles in about a third of the time.
/// Applications (the retrieval model) live in examples/.
#pragma once

#include "autodiff/mp50.hpp"
#include "tapegrad_record.hpp"

#include "autodiff/registry.hpp"
#include "autodiff/rerun.hpp"
#include "io/npy.hpp"
#include "check/gradcheck.hpp"
#include "check/second_order.hpp"

#include <fmt/format.h>  // the light headers use fmt/core.h; programs of the full header get all of fmt
