#include "dyngrad/core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <new>
#include <ostream>

#include "dyngrad/core/error.h"
#include "dyngrad/cuda/runtime.h"

namespace dyngrad {

namespace {
constexpr std::size_t kCpuAlignment = 64;  // cache line; lets Eigen use aligned vector loads

template <typename T>
void fill_cpu(void* data, std::int64_t n, double value) {
    auto* p = static_cast<T*>(data);
    for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(value);
}

void fill_cpu(void* data, std::int64_t n, double value, DType dtype) {
    switch (dtype) {
        case DType::f32: return fill_cpu<float>(data, n, value);
        case DType::f64: return fill_cpu<double>(data, n, value);
        case DType::i64: return fill_cpu<std::int64_t>(data, n, value);
    }
}

double read_cpu(const void* data, std::size_t i, DType dtype) {
    switch (dtype) {
        case DType::f32: return static_cast<const float*>(data)[i];
        case DType::f64: return static_cast<const double*>(data)[i];
        case DType::i64: return static_cast<double>(static_cast<const std::int64_t*>(data)[i]);
    }
    return 0;
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
    if (bytes == 0) return;
    if (dst_device.is_cpu() && src_device.is_cpu()) {
        std::memcpy(dst, src, bytes);
        return;
    }
    cuda::copy(dst, dst_device, src, src_device, bytes);
}

void validate_shape(const Shape& shape) {
    for (auto d : shape)
        if (d < 0) throw ValueError(str("shape ", to_string(shape), " has a negative dimension"));
}
}  // namespace

bool cuda_compiled() { return DYNGRAD_WITH_CUDA != 0; }

int cuda_device_count() { return cuda::device_count(); }

Storage::Storage(std::size_t bytes, Device device) : bytes_(bytes), device_(device) {
    if (device.is_cpu()) {
        data_ = ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t{kCpuAlignment});
        return;
    }
    data_ = cuda::allocate(bytes, device.index);
}

Storage::~Storage() {
    if (device_.is_cpu()) {
        ::operator delete(data_, std::align_val_t{kCpuAlignment});
        return;
    }
    cuda::deallocate(data_, bytes_, device_.index);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
    validate_shape(shape);
    Tensor t;
    t.shape_ = shape;
    t.numel_ = dyngrad::numel(shape);
    t.dtype_ = dtype;
    t.storage_ = std::make_shared<Storage>(static_cast<std::size_t>(t.numel_) * dtype_size(dtype), device);
    return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
    return full(shape, 0.0, dtype, device);
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
    return full(shape, 1.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
    Tensor t = empty(shape, dtype, device);
    t.fill(value);
    return t;
}

Tensor Tensor::arange(double start, double stop, double step, DType dtype, Device device) {
    if (step == 0) throw ValueError("arange: step must be non-zero");
    const double span = (stop - start) / step;
    const auto n = span > 0 ? static_cast<std::int64_t>(std::ceil(span)) : 0;
    std::vector<double> values(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) values[static_cast<std::size_t>(i)] = start + static_cast<double>(i) * step;
    return from_vector(values, {n}, dtype, device);
}

Tensor Tensor::from_vector(const std::vector<double>& values, const Shape& shape, DType dtype, Device device) {
    validate_shape(shape);
    if (static_cast<std::int64_t>(values.size()) != dyngrad::numel(shape))
        throw ValueError(str("from_vector: ", values.size(), " values do not fill shape ", to_string(shape),
                             " (", dyngrad::numel(shape), " elements)"));
    Tensor host = empty(shape, dtype, Device::cpu());
    void* p = host.raw_data();
    for (std::size_t i = 0; i < values.size(); ++i) {
        switch (dtype) {
            case DType::f32: static_cast<float*>(p)[i] = static_cast<float>(values[i]); break;
            case DType::f64: static_cast<double*>(p)[i] = values[i]; break;
            case DType::i64: static_cast<std::int64_t*>(p)[i] = static_cast<std::int64_t>(values[i]); break;
        }
    }
    return host.to(device);
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, Device device) {
    return from_vector(std::vector<double>(values.begin(), values.end()), shape, DType::f32, device);
}

Tensor Tensor::from_vector(const std::vector<std::int64_t>& values, const Shape& shape, Device device) {
    validate_shape(shape);
    if (static_cast<std::int64_t>(values.size()) != dyngrad::numel(shape))
        throw ValueError(str("from_vector: ", values.size(), " values do not fill shape ", to_string(shape)));
    Tensor host = empty(shape, DType::i64, Device::cpu());
    std::copy(values.begin(), values.end(), host.data<std::int64_t>());  // memcpy from an empty vector's null is UB
    return host.to(device);
}

Tensor Tensor::of(std::initializer_list<double> values, DType dtype) {
    return from_vector(std::vector<double>(values), {static_cast<std::int64_t>(values.size())}, dtype);
}

Tensor Tensor::uniform(const Shape& shape, double low, double high, Generator& gen, DType dtype, Device device) {
    if (!(low < high)) throw ValueError(str("uniform: need low < high, got ", low, " and ", high));
    std::uniform_real_distribution<double> dist(low, high);
    std::vector<double> values(static_cast<std::size_t>(dyngrad::numel(shape)));
    for (auto& v : values) v = dist(gen.engine());
    return from_vector(values, shape, dtype, device);
}

Tensor Tensor::normal(const Shape& shape, double mean, double stddev, Generator& gen, DType dtype, Device device) {
    if (!(stddev > 0)) throw ValueError(str("normal: stddev must be positive, got ", stddev));
    std::normal_distribution<double> dist(mean, stddev);
    std::vector<double> values(static_cast<std::size_t>(dyngrad::numel(shape)));
    for (auto& v : values) v = dist(gen.engine());
    return from_vector(values, shape, dtype, device);
}

std::int64_t Tensor::size(std::int64_t axis) const { return shape_[normalize_axis(axis, shape_.size())]; }

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

void* Tensor::raw_data() const {
    if (!storage_) throw ValueError("tensor is undefined (default-constructed)");
    return storage_->data();
}

void Tensor::check_dtype(DType expected) const {
    if (dtype_ != expected)
        throw DTypeError(str("tensor ", describe(*this), " accessed as ", dtype_name(expected)));
}

std::size_t Tensor::flat_index(const std::vector<std::int64_t>& index) const {
    if (index.size() != shape_.size())
        throw IndexError(str("index of rank ", index.size(), " into tensor of shape ", to_string(shape_)));
    std::size_t flat = 0;
    for (std::size_t i = 0; i < index.size(); ++i) {
        if (index[i] < 0 || index[i] >= shape_[i])
            throw IndexError(str("index ", index[i], " out of range for axis ", i, " of shape ", to_string(shape_)));
        flat = flat * static_cast<std::size_t>(shape_[i]) + static_cast<std::size_t>(index[i]);
    }
    return flat;
}

double Tensor::at(const std::vector<std::int64_t>& index) const {
    const std::size_t flat = flat_index(index);
    if (!device().is_cpu())
        throw DeviceError(str("at(): element access needs a CPU tensor, this one is on ", device().to_string()));
    return read_cpu(raw_data(), flat, dtype_);
}

void Tensor::set(const std::vector<std::int64_t>& index, double value) {
    const std::size_t flat = flat_index(index);
    if (!device().is_cpu())
        throw DeviceError(str("set(): element access needs a CPU tensor, this one is on ", device().to_string()));
    fill_cpu(static_cast<char*>(raw_data()) + flat * dtype_size(dtype_), 1, value, dtype_);
    bump_version();
}

double Tensor::item() const {
    if (numel_ != 1) throw ShapeError(str("item(): tensor of shape ", to_string(shape_), " is not one element"));
    return to(Device::cpu()).at(Shape(shape_.size(), 0));
}

std::vector<double> Tensor::to_vector() const {
    const Tensor host = to(Device::cpu());
    std::vector<double> out(static_cast<std::size_t>(numel_));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = read_cpu(host.raw_data(), i, dtype_);
    return out;
}

Tensor Tensor::to(Device target) const {
    if (!defined()) throw ValueError("to(): tensor is undefined");
    if (target == device()) return *this;
    Tensor out = empty(shape_, dtype_, target);
    out.copy_from(*this);
    return out;
}

Tensor Tensor::to(DType target) const {
    if (!defined()) throw ValueError("to(): tensor is undefined");
    if (target == dtype_) return *this;
    const Device where = device();
    const Tensor host = to(Device::cpu());
    Tensor converted = empty(shape_, target, Device::cpu());
    for (std::int64_t i = 0; i < numel_; ++i)
        fill_cpu(static_cast<char*>(converted.raw_data()) + static_cast<std::size_t>(i) * dtype_size(target), 1,
                 read_cpu(host.raw_data(), static_cast<std::size_t>(i), dtype_), target);
    return converted.to(where);
}

Tensor Tensor::clone() const {
    Tensor out = empty(shape_, dtype_, device());
    out.copy_from(*this);
    return out;
}

Tensor Tensor::reshaped(const Shape& shape) const {
    validate_shape(shape);
    if (dyngrad::numel(shape) != numel_)
        throw ShapeError(str("cannot reshape ", to_string(shape_), " (", numel_, " elements) to ", to_string(shape),
                             " (", dyngrad::numel(shape), " elements)"));
    Tensor out = *this;
    out.shape_ = shape;
    return out;
}

void Tensor::copy_from(const Tensor& src) {
    if (src.shape_ != shape_ || src.dtype_ != dtype_)
        throw ShapeError(str("copy_from: destination ", describe(*this), " does not match source ", describe(src)));
    copy_bytes(raw_data(), device(), src.raw_data(), src.device(), nbytes());
    bump_version();
}

void Tensor::fill(double value) {
    if (device().is_cpu()) fill_cpu(raw_data(), numel_, value, dtype_);
    else cuda::fill(raw_data(), numel_, value, dtype_, device().index);
    bump_version();
}

std::string describe(const Tensor& t) {
    if (!t.defined()) return "undefined";
    return str(to_string(t.shape()), " ", dtype_name(t.dtype()), " ", t.device().to_string());
}

std::ostream& operator<<(std::ostream& out, const Tensor& t) {
    out << "Tensor" << describe(t);
    if (!t.defined()) return out;
    constexpr std::int64_t kMaxPrinted = 64;
    const std::vector<double> values = t.numel() <= kMaxPrinted ? t.to_vector() : std::vector<double>{};
    if (values.empty() && t.numel() > 0) return out << " [" << t.numel() << " values]";
    out << " [";
    const std::int64_t row = t.rank() > 0 ? t.shape().back() : 1;
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (i) out << ((row > 0 && i % static_cast<std::size_t>(row) == 0) ? "; " : ", ");
        out << std::setprecision(6) << values[i];
    }
    return out << "]";
}

}  // namespace dyngrad
