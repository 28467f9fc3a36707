/// \file
/// Tensor<T>: a dense, row-major, contiguous array with a shape of rank 0 to 4, for any scalar T.
/// Rank 2 is the matrix every op works on; leading dimensions are batch dimensions (batch, heads),
/// so ops treat a rank-r tensor as a stack of matrices over its last two dimensions.
#pragma once

#include "autodiff/error.hpp"
#include "autodiff/scalar.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace tapegrad {

inline constexpr std::size_t max_rank = 4;

/// Largest element count a tensor may hold; anything larger is treated as a corrupt shape
/// (it guards the size product against overflow and absurd allocations).
inline constexpr std::size_t max_elements = std::size_t{1} << 40;

/// The dimensions of a tensor. Stored inline (no heap), compared by value.
class Shape {
public:
    Shape() = default;
    Shape(std::initializer_list<std::size_t> dims) : Shape(std::span<const std::size_t>(dims.begin(), dims.size())) {}
    explicit Shape(std::span<const std::size_t> dims) {
        if (dims.size() > max_rank) {
            throw shape_error(fmt::format("Shape: rank {} exceeds the maximum rank {}", dims.size(), max_rank));
        }
        rank_ = dims.size();
        std::copy(dims.begin(), dims.end(), dims_.begin());
        std::size_t elements = 1;
        for (const std::size_t d : dims) {
            // Factors both below 2^20 multiply to less than 2^40 = max_elements: the division,
            // the costliest step of making a shape, is only needed past that.
            const bool small = d < small_factor && elements < small_factor;
            if (!small && d != 0 && elements > max_elements / d) {
                throw shape_error(fmt::format("Shape: {} elements exceed the limit of {}", to_string(), max_elements));
            }
            elements *= d;
        }
        elements_ = elements;
    }

    std::size_t rank() const { return rank_; }
    std::size_t operator[](std::size_t axis) const { return dims_[axis]; }
    std::size_t size() const { return elements_; }
    std::span<const std::size_t> dims() const { return {dims_.data(), rank_}; }

    /// The matrix view: the last two dimensions, and the product of the leading ones.
    std::size_t rows() const { return rank_ >= 2 ? dims_[rank_ - 2] : 1; }
    std::size_t cols() const { return rank_ >= 1 ? dims_[rank_ - 1] : 1; }
    std::size_t batch() const {
        std::size_t b = 1;
        for (std::size_t axis = 0; axis + 2 < rank_; ++axis) b *= dims_[axis];
        return b;
    }
    /// Same leading (batch) dimensions as `other`.
    bool same_batch(const Shape& other) const {
        if (rank_ != other.rank_) return false;
        return std::equal(dims_.begin(), dims_.begin() + (rank_ >= 2 ? rank_ - 2 : 0), other.dims_.begin());
    }
    /// A copy with the last two dimensions replaced (the shape of a matrix result).
    Shape with_matrix(std::size_t rows, std::size_t cols) const {
        std::array<std::size_t, max_rank> dims = dims_;
        const std::size_t rank = std::max<std::size_t>(rank_, 2);
        dims[rank - 2] = rows;
        dims[rank - 1] = cols;
        return Shape(std::span<const std::size_t>(dims.data(), rank));
    }

    friend bool operator==(const Shape& a, const Shape& b) {
        return a.rank_ == b.rank_ && std::equal(a.dims_.begin(), a.dims_.begin() + a.rank_, b.dims_.begin());
    }

    /// "[2x3]", "[]" for a scalar.
    std::string to_string() const {
        std::string text = "[";
        for (std::size_t axis = 0; axis < rank_; ++axis) {
            if (axis) text += 'x';
            text += std::to_string(dims_[axis]);
        }
        return text + "]";
    }

private:
    static constexpr std::size_t small_factor = std::size_t{1} << 20;
    static_assert(small_factor * small_factor <= max_elements);

    std::array<std::size_t, max_rank> dims_{};
    std::size_t rank_ = 0;
    std::size_t elements_ = 1;
};

template <Scalar T>
class Tensor {
public:
    using value_type = T;

    Tensor() : shape_({0}) {}
    explicit Tensor(const Shape& shape, const T& fill = T(0)) : shape_(shape), data_(shape.size(), fill) {}
    Tensor(const Shape& shape, std::vector<T> data) : shape_(shape), data_(std::move(data)) {
        if (data_.size() != shape_.size()) {
            throw shape_error(fmt::format("Tensor: shape {} needs {} values, got {}", shape_.to_string(), shape_.size(),
                                          data_.size()));
        }
    }

    /// A matrix from nested rows: Tensor<double>::matrix({{1, 2}, {3, 4}}).
    static Tensor matrix(std::initializer_list<std::initializer_list<T>> rows) {
        const std::size_t n_rows = rows.size();
        const std::size_t n_cols = n_rows ? rows.begin()->size() : 0;
        std::vector<T> data;
        data.reserve(n_rows * n_cols);
        for (const auto& row : rows) {
            if (row.size() != n_cols) {
                throw shape_error(fmt::format("Tensor::matrix: row of length {} in a matrix whose first row has {}",
                                              row.size(), n_cols));
            }
            data.insert(data.end(), row.begin(), row.end());
        }
        return Tensor(Shape{n_rows, n_cols}, std::move(data));
    }
    static Tensor scalar(const T& value) { return Tensor(Shape{}, std::vector<T>{value}); }

    const Shape& shape() const { return shape_; }
    std::size_t rank() const { return shape_.rank(); }
    std::size_t size() const { return data_.size(); }
    bool empty() const { return data_.empty(); }
    std::size_t rows() const { return shape_.rows(); }
    std::size_t cols() const { return shape_.cols(); }

    std::span<T> data() { return data_; }
    std::span<const T> data() const { return data_; }
    T& operator[](std::size_t flat) { return data_[flat]; }
    const T& operator[](std::size_t flat) const { return data_[flat]; }

    /// Element of a rank-2 tensor (unchecked, like operator[]); at() checks.
    T& operator()(std::size_t i, std::size_t j) { return data_[i * shape_.cols() + j]; }
    const T& operator()(std::size_t i, std::size_t j) const { return data_[i * shape_.cols() + j]; }
    const T& at(std::span<const std::size_t> index) const { return data_[flat_index(index)]; }
    T& at(std::span<const std::size_t> index) { return data_[flat_index(index)]; }
    const T& at(std::initializer_list<std::size_t> index) const { return at(std::span(index.begin(), index.size())); }
    T& at(std::initializer_list<std::size_t> index) { return at(std::span(index.begin(), index.size())); }

    /// The value of a one-element tensor (a loss).
    const T& item() const {
        if (data_.size() != 1) {
            throw shape_error(fmt::format("Tensor::item: tensor of shape {} has {} elements, not one",
                                          shape_.to_string(), data_.size()));
        }
        return data_[0];
    }

    /// Gives the tensor a new shape; keeps the allocation when it is large enough (tape reuse).
    void resize(const Shape& shape) {
        shape_ = shape;
        // A reused tape resizes each node's buffers to the size they already have: skip the call.
        if (data_.size() != shape.size()) data_.resize(shape.size());
    }
    void fill(const T& value) { std::fill(data_.begin(), data_.end(), value); }

    /// Same data, new shape with the same element count (split and merge of heads use this).
    Tensor reshaped(const Shape& shape) const {
        if (shape.size() != shape_.size()) {
            throw shape_error(fmt::format("Tensor::reshaped: cannot view {} ({} elements) as {} ({} elements)",
                                          shape_.to_string(), shape_.size(), shape.to_string(), shape.size()));
        }
        return Tensor(shape, data_);
    }

    friend bool operator==(const Tensor& a, const Tensor& b) { return a.shape_ == b.shape_ && a.data_ == b.data_; }

private:
    std::size_t flat_index(std::span<const std::size_t> index) const {
        if (index.size() != shape_.rank()) {
            throw shape_error(fmt::format("Tensor::at: index of rank {} into a tensor of shape {}", index.size(),
                                          shape_.to_string()));
        }
        std::size_t flat = 0;
        for (std::size_t axis = 0; axis < index.size(); ++axis) {
            if (index[axis] >= shape_[axis]) {
                throw shape_error(fmt::format("Tensor::at: index {} out of range on axis {} of a tensor of shape {}",
                                              index[axis], axis, shape_.to_string()));
            }
            flat = flat * shape_[axis] + index[axis];
        }
        return flat;
    }

    Shape shape_;
    std::vector<T> data_;
};

/// Elementwise conversion between scalar types (double -> mp50 is exact).
template <Scalar To, Scalar From>
Tensor<To> tensor_cast(const Tensor<From>& source) {
    std::vector<To> data;
    data.reserve(source.size());
    for (const From& x : source.data()) {
        if constexpr (std::is_same_v<To, double> || std::is_same_v<To, float>) {
            data.push_back(static_cast<To>(to_double(x)));
        } else {
            data.push_back(To(x));
        }
    }
    return Tensor<To>(source.shape(), std::move(data));
}

/// The multi-index of flat position `flat` in `shape`, as "(i, j)" for messages.
inline std::string index_string(const Shape& shape, std::size_t flat) {
    std::array<std::size_t, max_rank> index{};
    for (std::size_t axis = shape.rank(); axis-- > 0;) {
        index[axis] = flat % shape[axis];
        flat /= shape[axis];
    }
    std::string text = "(";
    for (std::size_t axis = 0; axis < shape.rank(); ++axis) text += (axis ? ", " : "") + std::to_string(index[axis]);
    return text + ")";
}

}  // namespace tapegrad
