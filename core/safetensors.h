// Named tensors in the safetensors format (https://github.com/huggingface/safetensors), readable by
// its Python and Rust libraries:
//   8 bytes: N, the header length (little-endian u64)
//   N bytes: a JSON object {"name": {"dtype": "F32"|"F64"|"I64", "shape": [...], "data_offsets": [begin, end]},
//            ..., "__metadata__": {"key": "value", ...}}, padded with spaces to a multiple of 8
//   then the tensors' raw little-endian bytes; offsets count from the end of the header and cover the
//   data exactly (no gaps, no overlaps).
// Names are written in sorted order; the data is laid out widest dtype first, then by name, so every
// tensor is aligned to its element size. Model-level helpers: save_parameters / load_parameters (nn/layers.h).
#pragma once
#include <filesystem>
#include <map>
#include <string>

#include "dyngrad/core/tensor.h"

namespace dyngrad {

using TensorMap = std::map<std::string, Tensor>;
using SafetensorsMetadata = std::map<std::string, std::string>;

// Writes to `path` through a temporary file in the same folder, renamed into place once complete.
// Tensors on a GPU are copied to the CPU. ValueError for an undefined tensor or the name "__metadata__";
// IoError when the file cannot be written.
void save_safetensors(const std::filesystem::path& path, const TensorMap& tensors,
                      const SafetensorsMetadata& metadata = {});

// Reads every tensor into fresh CPU tensors. Validates everything before returning (length, JSON,
// dtypes, shapes, offsets, duplicate names) and throws IoError naming the file and the problem;
// `metadata`, when given, is assigned only on success.
TensorMap load_safetensors(const std::filesystem::path& path, SafetensorsMetadata* metadata = nullptr);

}  // namespace dyngrad
