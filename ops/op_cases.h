// Internal: the cases of the op table's rows (ops/op_cases.cpp): shapes, attributes and input domains that
// every check runs an op on (tests/verification/test_gradcheck.cpp, tests/gpu/test_gpu.cpp,
// tests/verification/test_golden.cpp, dyngrad-verify).
// Kept apart from the rows (ops/op_table.cpp) so the table reads as one list of ops.
#pragma once
#include <vector>

#include "dyngrad/graph/op_def.h"

namespace dyngrad::op_cases {

std::vector<OpCase> add_scalar_cases(), arg_reduce_cases(), attention_cases(), batch_norm_cases();
std::vector<OpCase> qkv_attention_cases();
std::vector<OpCase> gelu_mlp_cases();
std::vector<OpCase> bce_with_logits_cases(), binary_cases(), cast_cases(), clamp_cases(), clipped_relu_cases();
std::vector<OpCase> compare_cases(), concat_cases(), conv2d_cases(), cross_entropy_cases(), dropout_cases();
std::vector<OpCase> linear_cross_entropy_cases();
std::vector<OpCase> elu_cases(), embedding_cases(), exp_cases(), expand_cases(), gather_cases(), gelu_cases();
std::vector<OpCase> index_select_cases(), kink_cases(), l1_loss_cases(), layer_norm_cases(), leaky_relu_cases();
std::vector<OpCase> linear_cases(), masked_fill_cases(), matmul_cases(), max_cases(), min_max_cases();
std::vector<OpCase> mse_cases(), mul_scalar_cases(), narrow_cases(), neg_cases(), nll_loss_cases(), no_cases();
std::vector<OpCase> permute_cases(), pool2d_cases(), positive_cases(), pow_cases(), reduce_cases();
std::vector<OpCase> reshape_cases(), rms_norm_cases(), rnn_cases(), scatter_add_cases(), smooth_cases();
std::vector<OpCase> smooth_l1_loss_cases(), softmax_cases(), transpose_cases(), where_cases();
std::vector<OpCase> cumsum_cases(), argsort_cases(), topk_indices_cases(), multinomial_cases();

}  // namespace dyngrad::op_cases
