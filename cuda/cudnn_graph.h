// Internal (CUDA translation units only): cuDNN's backend (graph) API with ownership and checked calls. A
// BackendDescriptor owns one cudnnBackendDescriptor_t and carries a name (the op and the graph node it
// describes), so that a failed SetAttribute or Finalize throws CudaError naming the node, the call, cuDNN's
// status and its last error string. Finalize alone may report "not supported" back to the caller instead
// (try_finalize): cuDNN's answer for a graph or an engine it does not run, which callers fall back from.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <cudnn.h>

#include "dyngrad/core/error.h"
#include "dyngrad/cuda/handle.h"

namespace dyngrad::cuda {

// "CUDNN_STATUS_… (cuDNN's last error string)".
inline std::string cudnn_status_text(cudnnStatus_t status) {
    std::array<char, 512> detail{};
    cudnnGetLastErrorString(detail.data(), detail.size());
    std::string text = cudnnGetErrorString(status);
    if (detail[0] != '\0') text += str(" (", detail.data(), ")");
    return text;
}

// The "not supported" family (3000–3999 in cuDNN 9): a graph, shape, layout or engine cuDNN does not run.
inline bool cudnn_not_supported(cudnnStatus_t status) {
    return static_cast<int>(status) / 1000 == static_cast<int>(CUDNN_STATUS_NOT_SUPPORTED) / 1000;
}

class BackendDescriptor {
public:
    BackendDescriptor() = default;
    BackendDescriptor(cudnnBackendDescriptorType_t type, std::string name) : name_(std::move(name)) {
        cudnnBackendDescriptor_t raw = nullptr;
        check(cudnnBackendCreateDescriptor(type, &raw), "cudnnBackendCreateDescriptor");
        handle_ = Handle(raw);
    }

    cudnnBackendDescriptor_t get() const { return handle_.get(); }
    const std::string& name() const { return name_; }
    explicit operator bool() const { return static_cast<bool>(handle_); }

    BackendDescriptor& set(cudnnBackendAttributeName_t attribute, cudnnBackendAttributeType_t type,
                           std::int64_t count, const void* values) {
        check(cudnnBackendSetAttribute(get(), attribute, type, count, values),
              str("cudnnBackendSetAttribute(attribute ", static_cast<int>(attribute), ")").c_str());
        return *this;
    }
    BackendDescriptor& set_int64(cudnnBackendAttributeName_t attribute, std::int64_t value) {
        return set(attribute, CUDNN_TYPE_INT64, 1, &value);
    }
    BackendDescriptor& set_int64s(cudnnBackendAttributeName_t attribute, std::span<const std::int64_t> values) {
        return set(attribute, CUDNN_TYPE_INT64, static_cast<std::int64_t>(values.size()), values.data());
    }
    BackendDescriptor& set_data_type(cudnnBackendAttributeName_t attribute, cudnnDataType_t value) {
        return set(attribute, CUDNN_TYPE_DATA_TYPE, 1, &value);
    }
    BackendDescriptor& set_bool(cudnnBackendAttributeName_t attribute, bool value) {
        return set(attribute, CUDNN_TYPE_BOOLEAN, 1, &value);
    }
    BackendDescriptor& set_float(cudnnBackendAttributeName_t attribute, float value) {
        return set(attribute, CUDNN_TYPE_FLOAT, 1, &value);
    }
    BackendDescriptor& set_descriptor(cudnnBackendAttributeName_t attribute, const BackendDescriptor& value) {
        cudnnBackendDescriptor_t raw = value.get();
        return set(attribute, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
    }
    BackendDescriptor& set_descriptors(cudnnBackendAttributeName_t attribute,
                                       std::span<const cudnnBackendDescriptor_t> values) {
        return set(attribute, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<std::int64_t>(values.size()), values.data());
    }

    // Finalizes; throws CudaError for any status but success.
    BackendDescriptor& finalize() {
        check(cudnnBackendFinalize(get()), "cudnnBackendFinalize");
        return *this;
    }
    // Finalizes; returns a "not supported" status (cudnn_not_supported) to the caller, throws for other failures.
    cudnnStatus_t try_finalize() {
        const cudnnStatus_t status = cudnnBackendFinalize(get());
        if (status != CUDNN_STATUS_SUCCESS && !cudnn_not_supported(status)) fail(status, "cudnnBackendFinalize");
        return status;
    }

    // Throws CudaError (OutOfMemory for allocation failures) naming this descriptor, `call` and `status`.
    [[noreturn]] void fail(cudnnStatus_t status, const char* call) const {
        const std::string message = str("cuDNN graph node '", name_, "': ", call, " failed: ", cudnn_status_text(status));
        if (status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED ||
            status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED)
            throw OutOfMemory(message);
        throw CudaError(message);
    }

private:
    using Handle = UniqueHandle<cudnnBackendDescriptor_t, cudnnBackendDestroyDescriptor>;

    void check(cudnnStatus_t status, const char* call) const {
        if (status != CUDNN_STATUS_SUCCESS) fail(status, call);
    }

    std::string name_;
    Handle handle_;
};

// The raw handles of `descriptors` (a range of BackendDescriptor), for descriptor-array attributes.
template <typename Range>
std::vector<cudnnBackendDescriptor_t> raw_descriptors(const Range& descriptors) {
    std::vector<cudnnBackendDescriptor_t> raw;
    raw.reserve(descriptors.size());
    for (const BackendDescriptor& d : descriptors) raw.push_back(d.get());
    return raw;
}

// cudnnBackendGetAttribute on `owner`, throwing CudaError naming it.
inline void get_attribute(const BackendDescriptor& owner, cudnnBackendAttributeName_t attribute,
                          cudnnBackendAttributeType_t type, std::int64_t requested, std::int64_t* count, void* values) {
    const cudnnStatus_t status = cudnnBackendGetAttribute(owner.get(), attribute, type, requested, count, values);
    if (status != CUDNN_STATUS_SUCCESS)
        owner.fail(status, str("cudnnBackendGetAttribute(attribute ", static_cast<int>(attribute), ")").c_str());
}

// The engine configs cuDNN's heuristics in `mode` offer for the graph, best first; none (with `why` set) when the
// heuristics refuse the graph.
inline std::vector<BackendDescriptor> engine_configs(const BackendDescriptor& graph, cudnnBackendHeurMode_t mode,
                                                     std::string& why) {
    const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "heuristics mode A" : "heuristics fallback";
    BackendDescriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, str(graph.name(), ", ", mode_name));
    heuristics.set_descriptor(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (const cudnnStatus_t status = heuristics.try_finalize(); status != CUDNN_STATUS_SUCCESS) {
        why = str(mode_name, ": ", cudnn_status_text(status));
        return {};
    }
    std::int64_t count = 0;
    get_attribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
    std::vector<BackendDescriptor> configs;
    for (std::int64_t i = 0; i < count; ++i)
        configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, str(mode_name, " engine config ", i));
    std::vector<cudnnBackendDescriptor_t> raw = raw_descriptors(configs);
    std::int64_t returned = 0;
    get_attribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, raw.data());
    configs.resize(static_cast<std::size_t>(std::clamp<std::int64_t>(returned, 0, count)));
    if (configs.empty()) why = str(mode_name, ": no engine config");
    return configs;
}

}  // namespace dyngrad::cuda
