// Softmax family and losses. CPU: ops/loss.cpp. GPU: ops/loss.cu.
#pragma once
#include <source_location>

#include "dyngrad/graph/eager.h"
#include "dyngrad/graph/graph.h"

namespace dyngrad {

Var softmax(const Var& x, std::int64_t axis = -1, std::source_location where = std::source_location::current());
Tensor softmax(const Tensor& x, std::int64_t axis = -1, std::source_location where = std::source_location::current());
Var log_softmax(const Var& x, std::int64_t axis = -1, std::source_location where = std::source_location::current());
Tensor log_softmax(const Tensor& x, std::int64_t axis = -1,
                   std::source_location where = std::source_location::current());
// logits (N,C), labels (N) int64 in [0,C): mean over the batch of -log softmax(logits)[label].
// Fused and numerically stable; labels out of range throw IndexError.
Var cross_entropy(const Var& logits, const Var& labels, std::source_location where = std::source_location::current());
Tensor cross_entropy(const Tensor& logits, const Tensor& labels,
                     std::source_location where = std::source_location::current());
// mean((prediction - target)^2) over all elements; shapes must match.
Var mse_loss(const Var& prediction, const Var& target, std::source_location where = std::source_location::current());
Tensor mse_loss(const Tensor& prediction, const Tensor& target,
                std::source_location where = std::source_location::current());

}  // namespace dyngrad
