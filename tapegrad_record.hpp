/// \file
/// The light umbrella header: everything to record, run and check the tape you ran, and nothing that
/// computes at 50 digits. It brings the engine (tensor, tape, op contract, threads, forward mode),
/// every op, the models composed from them, input/output (fmt formatting, DOT pictures, saved tapes;
/// the .npy files of io/npy.hpp are in tapegrad.hpp) and the check of a recorded Tape<double> or Tape<float> (check/recorded.hpp: its 50-digit
/// work is compiled in the library). It includes neither Boost.Multiprecision nor the checker's
/// templates, which are most of a translation unit's compile time.
/// tapegrad.hpp is this plus the 50-digit side: mp50, the generic-lambda gradient checker
/// (check/gradcheck.hpp), the generic second-order checks (check/second_order.hpp) and the
/// re-run of a recorded tape at any type (autodiff/rerun.hpp, where a user's op registers its
/// siblings).
#pragma once

#include "autodiff/dual.hpp"
#include "autodiff/error.hpp"
#include "autodiff/forward_mode.hpp"
#include "autodiff/op.hpp"
#include "autodiff/parallel.hpp"
#include "autodiff/scalar.hpp"
#include "autodiff/tape.hpp"
#include "autodiff/tensor.hpp"
#include "check/audit.hpp"
#include "check/recorded.hpp"
#include "io/format.hpp"
#include "io/graphviz.hpp"
#include "io/tape_file.hpp"
#include "models/attention.hpp"
#include "models/llama.hpp"
#include "models/masks.hpp"
#include "models/multihead.hpp"
#include "models/optimizer.hpp"
#include "models/transformer.hpp"
#include "ops/all.hpp"  // every op
