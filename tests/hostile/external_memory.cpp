// Hostile external memory (Tensor::from_external, what the Python package's DLPack import wraps): pointers
// and shapes a foreign producer might hand over. Each must be a typed error, and the release function must
// still run (the producer's memory is not leaked).
#include <cstdint>
#include <limits>
#include <stdexcept>

#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;

namespace {

alignas(64) unsigned char arena[256];

void wrap(std::size_t offset, Shape shape, DType dtype, Device device = Device::cpu()) {
    static_cast<void>(Tensor::from_external(arena + offset, shape, dtype, device, [] {}));
}

const bool added = hostile::add(
    "external memory",
    {
        hostile::expect<ValueError>("f32 data one byte off alignment", {"aligned", "4"}, [] { wrap(1, {4}, DType::f32); }),
        hostile::expect<ValueError>("f32 data two bytes off alignment", {"aligned"}, [] { wrap(2, {4}, DType::f32); }),
        hostile::expect<ValueError>("f64 data four bytes off alignment", {"aligned", "8"}, [] { wrap(4, {2}, DType::f64); }),
        hostile::expect<ValueError>("i64 data at an odd address", {"aligned", "int64"}, [] { wrap(3, {2}, DType::i64); }),
        hostile::expect<ValueError>("null data with elements", {"null", "6"},
                                    [] { static_cast<void>(Tensor::from_external(nullptr, {2, 3}, DType::f32, Device::cpu(), [] {})); }),
        hostile::expect<ValueError>("null data on cuda with elements", {"null"},
                                    [] { static_cast<void>(Tensor::from_external(nullptr, {1}, DType::f32, Device::cuda(0), [] {})); }),
        hostile::expect<ValueError>("a negative dimension", {"from_external", "negative"}, [] { wrap(0, {-1}, DType::f32); }),
        hostile::expect<ValueError>("a negative dimension among others", {"from_external", "negative"}, [] { wrap(0, {4, -3, 2}, DType::f32); }),
        hostile::expect<ShapeError>("an element count that overflows", {"from_external"},
                                    [] { wrap(0, {std::numeric_limits<std::int64_t>::max(), 4}, DType::f32); }),
        hostile::expect<ShapeError>("a byte size that overflows", {"from_external"},
                                    [] { wrap(0, {std::numeric_limits<std::int64_t>::max() / 4}, DType::f64); }),
        hostile::expect<DeviceError>("an unknown device kind", {"device"},
                                     [] { wrap(0, {2}, DType::f32, Device{static_cast<DeviceKind>(7), 0}); }),
        // A release function that throws runs from a destructor (here while the refusal unwinds): it must not
        // end the process through std::terminate (issue 35).
        hostile::expect<ValueError>("null data whose release function throws", {"null"}, [] {
            static_cast<void>(Tensor::from_external(nullptr, {3}, DType::f32, Device::cpu(),
                                                    [] { throw std::runtime_error("producer gone"); }));
        }),
        hostile::expect<ValueError>("misaligned data whose release function throws", {"aligned"}, [] {
            static_cast<void>(Tensor::from_external(arena + 1, {2}, DType::f32, Device::cpu(), [] { throw 7; }));
        }),
    });

}  // namespace
