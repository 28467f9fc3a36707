/// \file
/// Checking the tape you ran: the gradients of a graph that ordinary code recorded on a Tape<double>
/// or Tape<float> (a training step, a loop with data-dependent shapes), proven against 50-digit
/// differences as it stands, with no rewrite as a generic lambda:
///
///     Tape<double> tape;  ...record as usual...;  Var<double> J = ...;
///     CheckReport report = check_gradients(tape, J);
///
/// The recorded graph is re-run at double and at mp50 (autodiff/rerun.hpp: leaves and constants
/// exact, each op's settings from their recorded values) and checked by the same stages, options,
/// thresholds and report as the generic-lambda check (check/gradcheck.hpp): full or fast, branches,
/// kinks, consistency; check_jvp and check_hvp likewise. Its leaves are the tape's leaves that need a gradient, named by their labels
/// ("leaf 3" for an unnamed one); its constants stay constants. For a Tape<float>, the function
/// checked is the one the float tape recorded (its float constants and settings), re-run at double
/// and at 50 digits. Compiled in the library: a program calling it compiles nothing of the checker
/// and nothing at 50 digits. Every op on the tape needs its siblings (the library's ops have theirs;
/// a user's op registers them, autodiff/rerun.hpp); the generic-lambda check stays for graphs whose
/// constants should be computed at 50 digits and for ops without siblings. This header includes
/// neither Boost.Multiprecision nor the checker's templates (tapegrad_record.hpp is its umbrella).
#pragma once

#include "autodiff/tape.hpp"
#include "check/report.hpp"

namespace tapegrad {

namespace detail {
class WorkSplit;
/// The check of a recorded tape with its finite differences shared as `split` says (nullptr: all
/// here); check/distributed.hpp's MPI form passes its split.
CheckReport check_recorded(const Tape<double>& tape, const Var<double>& J, const CheckOptions& options, WorkSplit* split);
CheckReport check_recorded(const Tape<float>& tape, const Var<float>& J, const CheckOptions& options, WorkSplit* split);
}  // namespace detail

CheckReport check_gradients(const Tape<double>& tape, const Var<double>& J, const CheckOptions& options = {});
CheckReport check_gradients(const Tape<float>& tape, const Var<float>& J, const CheckOptions& options = {});

/// The JVP (any output Y) and HVP (a scalar J) checks of check/second_order.hpp on a recorded tape,
/// re-run on the 50-digit and double dual tapes.
SecondOrderReport check_jvp(const Tape<double>& tape, const Var<double>& Y, const CheckOptions& options = {});
SecondOrderReport check_jvp(const Tape<float>& tape, const Var<float>& Y, const CheckOptions& options = {});
SecondOrderReport check_hvp(const Tape<double>& tape, const Var<double>& J, const CheckOptions& options = {});
SecondOrderReport check_hvp(const Tape<float>& tape, const Var<float>& J, const CheckOptions& options = {});

}  // namespace tapegrad
