// Umbrella header: the tensor, the tape, every op, the attention model and the checker.
#pragma once

#include "autodiff/error.hpp"
#include "autodiff/format.hpp"
#include "autodiff/gradcheck.hpp"
#include "autodiff/scalar.hpp"
#include "autodiff/tape.hpp"
#include "autodiff/tensor.hpp"
#include "models/attention.hpp"
#include "ops/add.hpp"
#include "ops/mask.hpp"
#include "ops/matmul.hpp"
#include "ops/mul.hpp"
#include "ops/scale.hpp"
#include "ops/softmax.hpp"
#include "ops/sum.hpp"
#include "ops/transpose.hpp"
