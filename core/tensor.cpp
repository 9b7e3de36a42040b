#include "dyngrad/core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <string_view>
#include <type_traits>
#include <utility>

#include "dyngrad/core/checked.h"
#include "dyngrad/core/error.h"
#include "dyngrad/core/device_memory.h"

namespace dyngrad {

namespace {
constexpr std::size_t kCpuAlignment = 64;  // cache line; lets Eigen use aligned vector loads

template <typename Fn>
void dispatch_any(DType dtype, Fn&& fn) {
    switch (dtype) {
        case DType::f32: return fn.template operator()<float>();
        case DType::f64: return fn.template operator()<double>();
        case DType::i64: return fn.template operator()<std::int64_t>();
        case DType::bf16: return fn.template operator()<bfloat16>();
        case DType::f16: return fn.template operator()<float16>();
    }
    throw DTypeError(str("unknown dtype code ", static_cast<int>(dtype)));
}

// `value` as element type T; an int64 element must be a finite double within int64's range (ValueError
// naming `what` and the value, where a plain cast would give INT64_MIN).
template <typename T>
T to_element(double value, std::string_view what) {
    if constexpr (std::is_same_v<T, std::int64_t>)
        return checked_to_int64(value, what);
    else if constexpr (std::is_same_v<T, bfloat16>)
        return to_bfloat16(value);
    else if constexpr (std::is_same_v<T, float16>)
        return to_float16(value);
    else
        return static_cast<T>(value);
}

template <typename T>
void fill_cpu(void* data, std::int64_t n, double value, std::string_view what) {
    const T element = to_element<T>(value, what);
    auto* p = static_cast<T*>(data);
    for (std::int64_t i = 0; i < n; ++i) p[i] = element;
}

void fill_cpu(void* data, std::int64_t n, double value, DType dtype, std::string_view what) {
    dispatch_any(dtype, [&]<typename T>() { fill_cpu<T>(data, n, value, what); });
}

// Writes values(i) to element i of a CPU tensor, i in [0, numel), converting as fill_cpu does.
template <typename Values>
void write_cpu(Tensor& host, Values&& values, std::string_view what) {
    const std::int64_t n = host.numel();
    dispatch_any(host.dtype(), [&]<typename T>() {
        T* p = host.data<T>();
        for (std::int64_t i = 0; i < n; ++i) p[i] = to_element<T>(values(i), what);
    });
}

double read_cpu(const void* data, std::size_t i, DType dtype) {
    switch (dtype) {
        case DType::f32: return static_cast<const float*>(data)[i];
        case DType::f64: return static_cast<const double*>(data)[i];
        case DType::i64: return static_cast<double>(static_cast<const std::int64_t*>(data)[i]);
        case DType::bf16: return to_double(static_cast<const bfloat16*>(data)[i]);
        case DType::f16: return to_double(static_cast<const float16*>(data)[i]);
    }
    return 0;
}

// The one host allocation point of tensors: a request the system cannot meet is OutOfMemory like a device's, not
// std::bad_alloc. The nothrow form, because AddressSanitizer aborts in a failing throwing operator new whatever
// allocator_may_return_null says, and returns null from the nothrow one.
void* allocate_bytes(std::size_t bytes, Device device) {
    if (!device.is_cpu()) return device_memory::allocate(bytes, device.index);
    void* data = ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t{kCpuAlignment}, std::nothrow);
    if (data == nullptr) throw OutOfMemory(str("cannot allocate ", bytes, " bytes on cpu"));
    return data;
}

void deallocate_bytes(void* data, std::size_t bytes, Device device) {
    if (device.is_cpu())
        ::operator delete(data, std::align_val_t{kCpuAlignment});
    else
        device_memory::deallocate(data, bytes, device.index);
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
    if (bytes == 0) return;
    if (dst_device.is_cpu() && src_device.is_cpu()) {
        std::memcpy(dst, src, bytes);
        return;
    }
    device_memory::copy(dst, dst_device, src, src_device, bytes);
}

}  // namespace

bool cuda_compiled() { return DYNGRAD_WITH_CUDA != 0; }

int cuda_device_count() { return device_memory::device_count(); }

Storage::Storage(std::size_t bytes, Device device) : bytes_(bytes), device_(device) {
    if (!device.is_cpu() && !device.is_cuda())
        throw DeviceError(str("cannot allocate ", bytes, " bytes on ", device.to_string()));
    data_ = allocate_bytes(bytes, device);
}

Storage::Storage(void* data, std::size_t bytes, Device device, std::function<void()> release)
    : data_(data), bytes_(bytes), device_(device), release_(std::move(release)) {
    if (!release_) release_ = [] {};  // external() reads "has a release function"
}

namespace {
// Runs a from_external release function from a destructor: one that throws would otherwise call
// std::terminate (destructors are noexcept), and there is no caller left to report it to.
void run_release(const std::function<void()>& release) noexcept {
    try {
        if (release) release();
    } catch (...) {
    }
}
}  // namespace

Storage::Storage(std::shared_ptr<Storage> base, std::size_t offset, std::size_t bytes)
    : bytes_(bytes), device_(base ? base->device() : Device::cpu()), offset_(offset) {
    if (!base) throw ValueError("Storage: a window needs a base storage");
    if (offset > base->bytes() || bytes > base->bytes() - offset)
        throw ValueError(str("Storage: a window of ", bytes, " bytes at byte ", offset, " of a storage of ",
                             base->bytes(), " bytes"));
    if (base->base_) {  // a window of a window: one level, so data() asks the owner directly
        offset_ += base->offset_;
        base = base->base_;
    }
    base_ = std::move(base);
}

void Storage::release_memory() {
    if (base_ || release_) throw ValueError("Storage::release_memory: only owned memory (not external memory, not a window)");
    if (released_) return;
    void* data = std::exchange(data_, nullptr);
    released_ = true;
    deallocate_bytes(data, bytes_, device_);
}

void Storage::restore_memory() {
    if (base_ || release_) throw ValueError("Storage::restore_memory: only owned memory (not external memory, not a window)");
    if (!released_) return;
    data_ = allocate_bytes(bytes_, device_);
    released_ = false;
}

Storage::~Storage() {
    if (base_ || released_) return;  // a window owns no memory; released memory went back already
    if (release_) {
        run_release(release_);
        return;
    }
    deallocate_bytes(data_, bytes_, device_);
}

// Every tensor is made here (or by reshaped, with the same element count): its shape's element count and
// byte size are checked once, which makes any product of its own dims safe everywhere else (core/checked.h).
Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
    Tensor t;
    t.numel_ = checked_numel(shape, "Tensor::empty");
    const std::size_t bytes = checked_bytes(t.numel_, dtype_size(dtype), "Tensor::empty");
    t.shape_ = shape;
    t.dtype_ = dtype;
    t.storage_ = std::make_shared<Storage>(bytes, device);
    return t;
}

Tensor Tensor::from_external(void* data, const Shape& shape, DType dtype, Device device,
                             std::function<void()> release) {
    // Own the release function first, so it runs on every path, the failing ones included.
    auto storage_release = std::make_shared<std::function<void()>>(std::move(release));
    struct ReleaseOnFailure {
        std::shared_ptr<std::function<void()>> release;
        ~ReleaseOnFailure() {
            if (release) run_release(*release);  // during the unwinding of a refusal: must not throw
        }
    } guard{storage_release};
    Tensor t;
    t.numel_ = checked_numel(shape, "Tensor::from_external");
    const std::size_t bytes = checked_bytes(t.numel_, dtype_size(dtype), "Tensor::from_external");
    if (data == nullptr && bytes > 0)
        throw ValueError(str("Tensor::from_external: null data pointer for ", t.numel_, " elements"));
    if (reinterpret_cast<std::uintptr_t>(data) % dtype_size(dtype) != 0)
        throw ValueError(str("Tensor::from_external: data pointer ", data, " is not aligned to ", dtype_size(dtype),
                             " bytes (", dtype_name(dtype), ")"));
    if (!device.is_cpu() && !device.is_cuda())
        throw DeviceError(str("Tensor::from_external: unsupported device ", device.to_string()));
    t.shape_ = shape;
    t.dtype_ = dtype;
    t.storage_ = std::make_shared<Storage>(data, bytes, device, [storage_release] {
        if (*storage_release) (*storage_release)();
    });
    guard.release.reset();  // the storage owns it now
    return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
    return full(shape, 0.0, dtype, device);
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
    return full(shape, 1.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
    if (dtype == DType::i64) checked_to_int64(value, "Tensor::full");  // before allocating
    Tensor t = empty(shape, dtype, device);
    t.fill(value);
    return t;
}

Tensor Tensor::arange(double start, double stop, double step, DType dtype, Device device) {
    if (!std::isfinite(start) || !std::isfinite(stop) || !std::isfinite(step))
        throw ValueError(str("arange: start ", start, ", stop ", stop, " and step ", step, " must be finite"));
    if (step == 0) throw ValueError("arange: step must be non-zero");
    // Finite bounds can still span more steps than int64 counts (or overflow to inf): ValueError, not a wrap.
    const double count = std::ceil((stop - start) / step);
    const std::int64_t n =
        count > 0 ? checked_to_int64(count, str("arange: the count of [", start, ", ", stop, ") in steps of ", step))
                  : 0;
    Tensor host = empty({n}, dtype, Device::cpu());
    write_cpu(host, [&](std::int64_t i) { return start + static_cast<double>(i) * step; }, "arange");
    return host.to(device);
}

Tensor Tensor::from_vector(const std::vector<double>& values, const Shape& shape, DType dtype, Device device) {
    const std::int64_t n = checked_numel(shape, "from_vector");
    if (static_cast<std::int64_t>(values.size()) != n)
        throw ValueError(str("from_vector: ", values.size(), " values do not fill shape ", to_string(shape),
                             " (", n, " elements)"));
    Tensor host = empty(shape, dtype, Device::cpu());
    write_cpu(host, [&](std::int64_t i) { return values[static_cast<std::size_t>(i)]; }, "from_vector");
    return host.to(device);
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, Device device) {
    return from_vector(std::vector<double>(values.begin(), values.end()), shape, DType::f32, device);
}

Tensor Tensor::from_vector(const std::vector<std::int64_t>& values, const Shape& shape, Device device) {
    if (static_cast<std::int64_t>(values.size()) != checked_numel(shape, "from_vector"))
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
    Tensor host = empty(shape, dtype, Device::cpu());
    write_cpu(host, [&](std::int64_t) { return dist(gen.engine()); }, "uniform");
    return host.to(device);
}

Tensor Tensor::normal(const Shape& shape, double mean, double stddev, Generator& gen, DType dtype, Device device) {
    if (!(stddev > 0)) throw ValueError(str("normal: stddev must be positive, got ", stddev));
    std::normal_distribution<double> dist(mean, stddev);
    Tensor host = empty(shape, dtype, Device::cpu());
    write_cpu(host, [&](std::int64_t) { return dist(gen.engine()); }, "normal");
    return host.to(device);
}

std::int64_t Tensor::size(std::int64_t axis) const {
    require_defined("size()");
    return shape_[normalize_axis(axis, shape_.size())];
}

void Tensor::require_defined(const char* what) const {
    if (!storage_) throw ValueError(str(what, ": tensor is undefined (default-constructed)"));
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

void* Tensor::raw_data() const {
    if (!storage_) throw ValueError("tensor is undefined (default-constructed)");
    void* data = storage_->data();
    // One test on the hot path: only a released storage (or a device's 0-byte allocation) gives nullptr.
    if (data == nullptr && !storage_->resident()) [[unlikely]]
        throw ReleasedMemoryError(str("tensor ", describe(*this), ": its memory was released (Storage::release_memory) "
                                      "and not restored; e.g. a ZeRO-3 unit's parameters outside its forward and "
                                      "backward"));
    return data;
}

Tensor Tensor::window(std::int64_t offset, const Shape& shape) const {
    require_defined("Tensor::window");
    Tensor t;
    t.numel_ = checked_numel(shape, "Tensor::window");
    const std::size_t bytes = checked_bytes(t.numel_, dtype_size(dtype_), "Tensor::window");
    if (offset < 0) throw ValueError(str("Tensor::window: negative offset ", offset));
    t.shape_ = shape;
    t.dtype_ = dtype_;
    t.storage_ = std::make_shared<Storage>(storage_, static_cast<std::size_t>(offset) * dtype_size(dtype_), bytes);
    return t;
}

void Tensor::release_memory() const {
    require_defined("Tensor::release_memory");
    storage_->release_memory();
}

void Tensor::restore_memory() const {
    require_defined("Tensor::restore_memory");
    storage_->restore_memory();
}

void Tensor::check_dtype(DType expected) const {
    if (dtype_ != expected)
        throw DTypeError(str("tensor ", describe(*this), " accessed as ", dtype_name(expected)));
}

std::size_t Tensor::flat_index(const std::vector<std::int64_t>& index) const {
    require_defined("element access");
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
    fill_cpu(static_cast<char*>(raw_data()) + flat * dtype_size(dtype_), 1, value, dtype_, "set()");
    bump_version();
}

double Tensor::item() const {
    require_defined("item()");
    if (numel_ != 1) throw ShapeError(str("item(): tensor of shape ", to_string(shape_), " is not one element"));
    return to(Device::cpu()).at(Shape(shape_.size(), 0));
}

std::vector<double> Tensor::to_vector() const {
    require_defined("to_vector()");
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

// A GPU converts on the device in one kernel, so the data moves first when it goes to one and last otherwise.
Tensor Tensor::to(Device device_target, DType dtype_target) const {
    if (!defined()) throw ValueError("to(): tensor is undefined");
    return device_target.is_cuda() ? to(device_target).to(dtype_target) : to(dtype_target).to(device_target);
}

Tensor Tensor::to(DType target) const {
    if (!defined()) throw ValueError("to(): tensor is undefined");
    if (target == dtype_) return *this;
    const Device where = device();
    if (where.is_cuda() && is_floating(dtype_) && is_floating(target)) {  // one kernel on the device
        Tensor converted = empty(shape_, target, where);
        device_memory::convert(converted.raw_data(), target, raw_data(), dtype_, numel_, where.index);
        return converted;
    }
    // float32 <-> bf16/f16 on the CPU, the engine's path through f32 (graph/through_f32.h): bulk conversions.
    if (where.is_cpu() && (dtype_ == DType::f32 || target == DType::f32) &&
        (is_reduced_precision(dtype_) || is_reduced_precision(target))) {
        Tensor converted = empty(shape_, target, where);
        const auto n = static_cast<std::size_t>(numel_);
        if (dtype_ == DType::f32)
            floats_to_half_bits(static_cast<const float*>(raw_data()), static_cast<std::uint16_t*>(converted.raw_data()),
                                n, half_format(target));
        else
            half_bits_to_floats(static_cast<const std::uint16_t*>(raw_data()), static_cast<float*>(converted.raw_data()),
                                n, half_format(dtype_));
        return converted;
    }
    const Tensor host = to(Device::cpu());
    Tensor converted = empty(shape_, target, Device::cpu());
    const std::string what = str("to(", dtype_name(target), ")");
    write_cpu(converted, [&](std::int64_t i) { return read_cpu(host.raw_data(), static_cast<std::size_t>(i), dtype_); },
              what);
    return converted.to(where);
}

Tensor Tensor::clone() const {
    require_defined("clone()");
    Tensor out = empty(shape_, dtype_, device());
    out.copy_from(*this);
    return out;
}

Tensor Tensor::reshaped(const Shape& shape) const {
    require_defined("reshaped()");
    Tensor out = *this;
    out.shape_ = resolve_reshape(shape_, numel_, shape, "reshaped()");  // one -1 inferred, as reshape does
    return out;
}

void Tensor::copy_from(const Tensor& src) {
    require_defined("copy_from: destination");
    src.require_defined("copy_from: source");
    if (src.shape_ != shape_ || src.dtype_ != dtype_)
        throw ShapeError(str("copy_from: destination ", describe(*this), " does not match source ", describe(src)));
    copy_bytes(raw_data(), device(), src.raw_data(), src.device(), nbytes());
    bump_version();
}

void Tensor::fill(double value) {
    require_defined("fill");
    if (device().is_cpu()) {
        fill_cpu(raw_data(), numel_, value, dtype_, "fill");
    } else {
        if (dtype_ == DType::i64) checked_to_int64(value, "fill");  // the device kernel converts unchecked
        device_memory::fill(raw_data(), numel_, value, dtype_, device().index);
    }
    bump_version();
}

std::string describe(const Tensor& t) {
    if (!t.defined()) return "undefined";
    return str(to_string(t.shape()), " ", dtype_name(t.dtype()), " ", t.device().to_string());
}


}  // namespace dyngrad
