// GradScaler now lives in nn/optim.h, beside the Optimizer whose step it gates (its found-inf flag and inv_scale
// are read by the fused step); this header stays so that code including it keeps compiling.
#pragma once
#include "dyngrad/nn/optim.h"
