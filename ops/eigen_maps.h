// Internal (CPU kernels only): the Eigen types the CPU kernels view tensor data through, row-major like a
// Tensor's storage. The Map aliases wrap a buffer without copying it.
#pragma once
#include <Eigen/Core>

namespace dyngrad::cpu {

template <typename T> using MatrixRM = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T> using ConstMatrixMap = Eigen::Map<const MatrixRM<T>>;
template <typename T> using MatrixMap = Eigen::Map<MatrixRM<T>>;
template <typename T> using RowVector = Eigen::Matrix<T, 1, Eigen::Dynamic>;
template <typename T> using ColumnVector = Eigen::Matrix<T, Eigen::Dynamic, 1>;

template <typename T> using ArrayRM = Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T> using ConstArrayMap = Eigen::Map<const ArrayRM<T>>;
template <typename T> using ArrayMap = Eigen::Map<ArrayRM<T>>;
template <typename T> using RowArray = Eigen::Array<T, 1, Eigen::Dynamic>;
template <typename T> using ColumnArray = Eigen::Array<T, Eigen::Dynamic, 1>;

}  // namespace dyngrad::cpu
