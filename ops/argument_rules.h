// The argument rules of the op rows (OpDef::prepare, graph/front_door.h): the defaults that depend on the inputs,
// run by every caller of a row (the C++ front doors and Python's dg.ops), each written beside its family's kernels.
#pragma once
#include "dyngrad/graph/front_door.h"

namespace dyngrad {

void layer_norm_arguments(OpCall& call);  // ops/norm.cpp: a bias without a weight gets a weight of ones
void rms_norm_arguments(OpCall& call);    // ops/norm.cpp: eps not given is the machine epsilon of x's dtype
void pool_arguments(OpCall& call);        // ops/pool.cpp: a stride of 0, or none given, is the kernel size
void rnn_arguments(OpCall& call);         // ops/rnn.cpp: save_for_backward not given follows grad_enabled()
void bce_with_logits_arguments(OpCall& call);  // ops/loss.cpp: a pos_weight without a weight gets a weight of 1
void embedding_arguments(OpCall& call);  // ops/indexing.cpp: padding_idx in [-V, V) counted from V; the rows' axis
// ops/linear_cross_entropy.cpp: classes (length) not given: the weight's rows; save_for_backward: grad_enabled()
void linear_cross_entropy_arguments(OpCall& call);

}  // namespace dyngrad
