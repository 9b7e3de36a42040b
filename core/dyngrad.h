// dyngrad: reverse-mode autodiff on a dynamic computation graph, CPU (Eigen) and CUDA backends.
// The one header an application includes.
#pragma once

#include "dyngrad/core/device.h"
#include "dyngrad/core/dtype.h"
#include "dyngrad/core/error.h"
#include "dyngrad/core/shape.h"
#include "dyngrad/core/tensor.h"
#include "dyngrad/graph/graph.h"
#include "dyngrad/graph/gradcheck.h"
#include "dyngrad/graph/op_def.h"
#include "dyngrad/graph/op_type.h"
#include "dyngrad/graph/verify.h"
#include "dyngrad/cuda/runtime.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/linalg.h"
#include "dyngrad/ops/loss.h"
#include "dyngrad/ops/reduce.h"
