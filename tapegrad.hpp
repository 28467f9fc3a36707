// Umbrella header, the one include for users: the engine (tensor, tape, op contract, threads,
// forward mode and second order), the gradient checker and the second-order checks, input/output
// (.npy, fmt formatting, DOT pictures), every op, and the models composed from them. Applications (the retrieval model) live in examples/.
#pragma once

#include "autodiff/dual.hpp"
#include "autodiff/error.hpp"
#include "autodiff/forward_mode.hpp"
#include "autodiff/op.hpp"
#include "autodiff/parallel.hpp"
#include "autodiff/rerun.hpp"
#include "autodiff/scalar.hpp"
#include "autodiff/tape.hpp"
#include "autodiff/tensor.hpp"
#include "check/gradcheck.hpp"
#include "check/recorded.hpp"
#include "check/second_order.hpp"
#include "io/format.hpp"
#include "io/graphviz.hpp"
#include "io/npy.hpp"
#include "models/attention.hpp"
#include "models/masks.hpp"
#include "models/multihead.hpp"
#include "models/optimizer.hpp"
#include "models/transformer.hpp"
#include "ops/instances/all_ops.hpp"  // every op
