// dyngrad: reverse-mode autodiff on a dynamic computation graph, CPU (Eigen) and CUDA backends.
// The one header an application includes; it sits above every layer (docs/architecture.md).
#pragma once

// core: tensors, shapes, dtypes, devices, errors, file formats
#include "dyngrad/core/checked.h"
#include "dyngrad/core/device.h"
#include "dyngrad/core/dtype.h"
#include "dyngrad/core/error.h"
#include "dyngrad/core/idx.h"
#include "dyngrad/core/parallel.h"
#include "dyngrad/core/safetensors.h"
#include "dyngrad/core/shape.h"
#include "dyngrad/core/source_site.h"
#include "dyngrad/core/tensor.h"
// cuda: the device runtime (declared for every build; without CUDA its calls throw DeviceError)
#include "dyngrad/cuda/capture.h"
#include "dyngrad/cuda/runtime.h"
// graph: the engine, the op contract, checks and debugging
#include "dyngrad/graph/anomaly.h"
#include "dyngrad/graph/custom_op.h"
#include "dyngrad/graph/debug.h"
#include "dyngrad/graph/eager.h"
#include "dyngrad/graph/gradcheck.h"
#include "dyngrad/graph/graph.h"
#include "dyngrad/graph/op_def.h"
#include "dyngrad/graph/op_type.h"
#include "dyngrad/graph/profiling.h"
#include "dyngrad/graph/verify.h"
// ops: the op families
#include "dyngrad/ops/attention.h"
#include "dyngrad/ops/conv.h"
#include "dyngrad/ops/dropout.h"
#include "dyngrad/ops/elementwise.h"
#include "dyngrad/ops/indexing.h"
#include "dyngrad/ops/layout.h"
#include "dyngrad/ops/linalg.h"
#include "dyngrad/ops/loss.h"
#include "dyngrad/ops/norm.h"
#include "dyngrad/ops/pool.h"
#include "dyngrad/ops/reduce.h"
#include "dyngrad/ops/rnn.h"
// nn: modules, layers, optimizers, data loading
#include "dyngrad/nn/amp.h"
#include "dyngrad/nn/dataset.h"
#include "dyngrad/nn/layers.h"
#include "dyngrad/nn/optim.h"
#include "dyngrad/nn/recurrent.h"
#include "dyngrad/nn/transformer.h"
