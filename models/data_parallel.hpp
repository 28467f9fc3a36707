/// \file
/// Data-parallel training over MPI ranks (Boost.MPI): the one collective each step needs. Each
/// rank computes the gradients of its slice of the batch into one buffer (RetrievalTrainer::step
/// in models/retrieval.hpp); this sums the buffer over the ranks, with one all-reduce
/// for all parameters. Needs the tapegrad::mpi target (TAPEGRAD_WITH_MPI).
#pragma once

#include <boost/mpi/collectives/all_reduce.hpp>
#include <boost/mpi/communicator.hpp>

#include <algorithm>
#include <functional>
#include <span>
#include <vector>

namespace tapegrad {

/// sum(buffer): every rank's buffer replaced by the element-wise sum over the ranks of `world`
/// (MPI_Allreduce with MPI_SUM: std::plus<double> maps onto it). The sums go to a second buffer
/// and are copied back: Boost.MPI 1.74's in-place form dereferences MPI_IN_PLACE to find the
/// datatype (undefined behaviour, which UBSan reports).
inline auto sum_over_ranks(const boost::mpi::communicator& world) {
    return [world](std::span<double> buffer) {
        std::vector<double> sums(buffer.size());
        boost::mpi::all_reduce(world, buffer.data(), static_cast<int>(buffer.size()), sums.data(),
                               std::plus<double>());
        std::copy(sums.begin(), sums.end(), buffer.begin());
    };
}

}  // namespace tapegrad
