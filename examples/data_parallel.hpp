// Data-parallel training over MPI ranks (Boost.MPI): the one collective each step needs. Each
// rank computes the gradients of its slice of the batch into one buffer (RetrievalTrainer::step
// in examples/retrieval.hpp); this sums the buffer over the ranks in place, with one all-reduce
// for all parameters. Needs the tapegrad::mpi target (TAPEGRAD_WITH_MPI).
#pragma once

#include <boost/mpi/collectives/all_reduce.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/mpi/inplace.hpp>

#include <functional>
#include <span>

namespace tapegrad {

// sum(buffer): every rank's buffer replaced by the element-wise sum over the ranks of `world`
// (MPI_Allreduce with MPI_SUM: std::plus<double> maps onto it).
inline auto sum_over_ranks(const boost::mpi::communicator& world) {
    return [world](std::span<double> buffer) {
        boost::mpi::all_reduce(world, boost::mpi::inplace(buffer.data()), static_cast<int>(buffer.size()),
                               std::plus<double>());
    };
}

}  // namespace tapegrad
