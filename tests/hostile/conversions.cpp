// Hostile conversions and scalars (issue 11, class 8) and the core messages of class 10: doubles that no
// int64 holds, non-finite ranges and hyperparameters, allocations no machine can meet, negative counts,
// undefined tensors, invalid device kinds and bad read_idx ranks. Each is a typed error naming the value.
#include <cstdint>
#include <limits>

#include "dyngrad/dyngrad.h"
#include "hostile.h"

using namespace dyngrad;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();
const Device kBadDevice{static_cast<DeviceKind>(7), 0};

Parameter param(std::uint64_t seed) {
    Generator gen(seed);
    return Parameter(Tensor::normal({3}, 0, 1, gen), "p");
}

const bool added = hostile::add(
    "conversions",
    {
        // ---- float -> int64 ----
        hostile::expect<ValueError>("full int64 with NaN", {"Tensor::full", "nan", "int64"},
                                    [] { Tensor::full({2}, kNaN, DType::i64); }),
        hostile::expect<ValueError>("full int64 with +inf", {"Tensor::full", "inf"},
                                    [] { Tensor::full({2}, kInf, DType::i64); }),
        hostile::expect<ValueError>("full int64 with -inf", {"Tensor::full", "-inf"},
                                    [] { Tensor::full({2}, -kInf, DType::i64); }),
        hostile::expect<ValueError>("full int64 with 1e19", {"Tensor::full", "1e+19"},
                                    [] { Tensor::full({2}, 1e19, DType::i64); }),
        hostile::expect<ValueError>("full int64 with 2^63 exactly", {"Tensor::full", "9.22337e+18"},
                                    [] { Tensor::full({1}, 9223372036854775808.0, DType::i64); }),
        hostile::expect<ValueError>("full int64 with -1e300", {"Tensor::full", "-1e+300"},
                                    [] { Tensor::full({}, -1e300, DType::i64); }),
        hostile::expect<ValueError>("from_vector int64 with NaN", {"from_vector", "nan"},
                                    [] { Tensor::from_vector(std::vector<double>{1, kNaN}, {2}, DType::i64); }),
        hostile::expect<ValueError>("from_vector int64 with -inf", {"from_vector", "-inf"},
                                    [] { Tensor::from_vector(std::vector<double>{-kInf}, {1}, DType::i64); }),
        hostile::expect<ValueError>("to(int64) of a float32 NaN", {"to(int64)", "nan"},
                                    [] { Tensor::from_vector(std::vector<double>{0.5, kNaN}, {2}).to(DType::i64); }),
        hostile::expect<ValueError>("to(int64) of a float32 +inf", {"to(int64)", "inf"},
                                    [] { Tensor::from_vector(std::vector<double>{kInf}, {1}).to(DType::i64); }),
        hostile::expect<ValueError>("to(int64) of float64 1e30", {"to(int64)", "1e+30"},
                                    [] {
                                        Tensor::from_vector(std::vector<double>{1e30}, {1}, DType::f64).to(DType::i64);
                                    }),
        hostile::expect<ValueError>("to(int64) of float32 -3e38", {"to(int64)"},
                                    [] { Tensor::from_vector(std::vector<double>{-3e38}, {1}).to(DType::i64); }),
        hostile::expect<ValueError>("set() of an int64 element to NaN", {"set()", "nan"},
                                    [] { Tensor::zeros({2}, DType::i64).set({1}, kNaN); }),
        hostile::expect<ValueError>("set() of an int64 element to 1e20", {"set()", "1e+20"},
                                    [] { Tensor::zeros({2}, DType::i64).set({0}, 1e20); }),
        hostile::expect<ValueError>("fill of an int64 tensor with -inf", {"fill", "-inf"},
                                    [] { Tensor::zeros({3}, DType::i64).fill(-kInf); }),
        hostile::expect<ValueError>("arange into int64 beyond 2^63", {"arange", "int64"},
                                    [] { Tensor::arange(9.2e18, 9.3e18, 5e16, DType::i64); }),

        // ---- arange ----
        hostile::expect<ValueError>("arange with a NaN step", {"arange", "nan"}, [] { Tensor::arange(0, 1, kNaN); }),
        hostile::expect<ValueError>("arange with an infinite stop", {"arange", "inf"}, [] { Tensor::arange(0, kInf); }),
        hostile::expect<ValueError>("arange with a -inf start", {"arange", "-inf"}, [] { Tensor::arange(-kInf, 0); }),
        hostile::expect<ValueError>("arange with a NaN start", {"arange", "nan"}, [] { Tensor::arange(kNaN, 3); }),
        hostile::expect<ValueError>("arange with a NaN stop", {"arange", "nan"}, [] { Tensor::arange(0, kNaN); }),
        hostile::expect<ValueError>("arange with an infinite step", {"arange", "inf"},
                                    [] { Tensor::arange(0, 1, kInf); }),
        hostile::expect<ValueError>("arange with step 0", {"arange", "non-zero"}, [] { Tensor::arange(0, 1, 0); }),
        hostile::expect<ValueError>("arange over 1e600 steps", {"arange", "count"},
                                    [] { Tensor::arange(0, 1e300, 1e-300); }),
        hostile::expect<ValueError>("arange over [-1e308, 1e308): the span overflows to inf", {"arange", "inf"},
                                    [] { Tensor::arange(-1e308, 1e308); }),
        hostile::expect<ValueError>("arange over 1e19 steps", {"arange", "count", "1e+19"},
                                    [] { Tensor::arange(0, 1e19); }),

        // ---- host allocations ----
        hostile::expect<OutOfMemory>("empty (2^60) float32: 2^62 bytes", {"4611686018427387904 bytes", "cpu"},
                                     [] { Tensor::empty({std::int64_t{1} << 60}); }),
        hostile::expect<OutOfMemory>("zeros (2^31,2^28) float64: 2^62 bytes", {"bytes", "cpu"},
                                     [] { Tensor::zeros({std::int64_t{1} << 31, std::int64_t{1} << 28}, DType::f64); }),
        hostile::expect<OutOfMemory>("arange over 10^18 steps", {"bytes"}, [] { Tensor::arange(0, 1e18); }),
        hostile::expect<OutOfMemory>("uniform (2^59) float64", {"bytes"},
                                     [] {
                                         Generator gen(61);
                                         Tensor::uniform({std::int64_t{1} << 59}, 0, 1, gen, DType::f64);
                                     }),
        hostile::expect<OutOfMemory>("empty (2^40,2^12) int64: 2^55 bytes", {"36028797018963968 bytes"},
                                     [] { Tensor::empty({std::int64_t{1} << 40, std::int64_t{1} << 12}, DType::i64); }),

        // ---- hyperparameters ----
        hostile::expect<ValueError>("SGD lr +inf", {"lr", "inf"}, [] { SGD({param(62)}, {.lr = kInf}); }),
        hostile::expect<ValueError>("SGD lr NaN", {"lr", "nan"}, [] { SGD({param(63)}, {.lr = kNaN}); }),
        hostile::expect<ValueError>("SGD momentum +inf", {"SGD", "momentum", "inf"},
                                    [] { SGD({param(64)}, {.lr = 0.1, .momentum = kInf}); }),
        hostile::expect<ValueError>("SGD weight_decay +inf", {"SGD", "weight_decay", "inf"},
                                    [] { SGD({param(65)}, {.lr = 0.1, .weight_decay = kInf}); }),
        hostile::expect<ValueError>("Adam lr +inf", {"lr", "inf"}, [] { Adam({param(66)}, {.lr = kInf}); }),
        hostile::expect<ValueError>("Adam eps +inf", {"Adam", "eps", "inf"}, [] { Adam({param(67)}, {.eps = kInf}); }),
        hostile::expect<ValueError>("Adam weight_decay +inf", {"Adam", "weight_decay"},
                                    [] { Adam({param(68)}, {.weight_decay = kInf}); }),
        hostile::expect<ValueError>("AdamW weight_decay +inf", {"AdamW", "weight_decay", "inf"},
                                    [] { AdamW({param(69)}, {.weight_decay = kInf}); }),
        hostile::expect<ValueError>("AdamW beta2 NaN", {"AdamW", "betas"}, [] { AdamW({param(70)}, {.beta2 = kNaN}); }),
        hostile::expect<ValueError>("Adam beta1 +inf", {"Adam", "betas"}, [] { Adam({param(71)}, {.beta1 = kInf}); }),
        hostile::expect<ValueError>("set_lr(+inf)", {"lr", "inf"},
                                    [] {
                                        SGD sgd({param(72)}, {.lr = 0.1});
                                        sgd.set_lr(kInf);
                                    }),
        hostile::expect<ValueError>("set_lr(-inf)", {"lr", "-inf"},
                                    [] {
                                        Adam adam({param(73)});
                                        adam.set_lr(-kInf);
                                    }),
        hostile::expect<ValueError>("StepLR gamma +inf", {"StepLR", "gamma", "inf"},
                                    [] {
                                        SGD sgd({param(74)}, {.lr = 0.1});
                                        StepLR(sgd, 2, kInf);
                                    }),
        hostile::expect<ValueError>("StepLR gamma NaN", {"StepLR", "gamma", "nan"},
                                    [] {
                                        SGD sgd({param(75)}, {.lr = 0.1});
                                        StepLR(sgd, 2, kNaN);
                                    }),
        hostile::expect<ValueError>("StepLR stepping the lr to inf (1e300 · 1e10)", {"lr", "inf"},
                                    [] {
                                        SGD sgd({param(76)}, {.lr = 1e300});
                                        StepLR schedule(sgd, 1, 1e10);
                                        schedule.step();
                                    }),
        hostile::expect<ValueError>("CosineAnnealingLR eta_min +inf", {"CosineAnnealingLR", "eta_min", "inf"},
                                    [] {
                                        SGD sgd({param(77)}, {.lr = 0.1});
                                        CosineAnnealingLR(sgd, 10, kInf);
                                    }),
        hostile::expect<ValueError>("SGD lr -inf", {"lr", "-inf"}, [] { SGD({param(78)}, {.lr = -kInf}); }),

        // ---- counts ----
        hostile::expect<ValueError>("epoch_permutation of -1 samples", {"epoch_permutation", "-1"},
                                    [] { epoch_permutation(-1, 0, 0); }),
        hostile::expect<ValueError>("epoch_permutation of INT64_MIN samples", {"epoch_permutation", "negative"},
                                    [] { epoch_permutation(std::numeric_limits<std::int64_t>::min(), 1, 2); }),

        // ---- class 10: messages that point at the right thing ----
        hostile::expect<ValueError>("item() of an undefined tensor", {"item()", "undefined"}, [] { Tensor().item(); }),
        hostile::expect<ValueError>("reshaped() of an undefined tensor", {"reshaped()", "undefined"},
                                    [] { Tensor().reshaped({1}); }),
        hostile::expect<ValueError>("size(0) of an undefined tensor", {"size()", "undefined"},
                                    [] { Tensor().size(0); }),
        hostile::expect<ValueError>("at({}) of an undefined tensor", {"undefined"}, [] { Tensor().at({}); }),
        hostile::expect<ValueError>("set() of an undefined tensor", {"undefined"}, [] { Tensor().set({0}, 1.0); }),
        hostile::expect<ValueError>("clone() of an undefined tensor", {"clone()", "undefined"},
                                    [] { Tensor().clone(); }),
        hostile::expect<ValueError>("to_vector() of an undefined tensor", {"to_vector()", "undefined"},
                                    [] { Tensor().to_vector(); }),
        hostile::expect<ValueError>("fill of an undefined tensor", {"fill", "undefined"}, [] { Tensor().fill(2); }),
        hostile::expect<ValueError>("copy_from an undefined source", {"copy_from: source", "undefined"},
                                    [] { Tensor::zeros({}).copy_from(Tensor()); }),
        hostile::expect<ValueError>("copy_from into an undefined destination", {"copy_from: destination", "undefined"},
                                    [] { Tensor().copy_from(Tensor::zeros({})); }),
        hostile::expect<DeviceError>("zeros on an invalid device kind", {"invalid device kind 7"},
                                     [] { Tensor::zeros({2}, DType::f32, kBadDevice); }),
        hostile::expect<DeviceError>("to() an invalid device kind", {"invalid device kind 7"},
                                     [] { Tensor::ones({2}).to(kBadDevice); }),
        hostile::expect<DeviceError>("arange on an invalid device kind", {"invalid device kind 7"},
                                     [] { Tensor::arange(0, 3, 1, DType::f32, kBadDevice); }),
        hostile::expect<ValueError>("read_idx rank -1", {"read_idx", "rank -1", "1 to 255"},
                                    [] { read_idx("/nonexistent/train-labels-idx1-ubyte", -1); }),
        hostile::expect<ValueError>("read_idx rank 0", {"read_idx", "rank 0"},
                                    [] { read_idx("/nonexistent/train-labels-idx1-ubyte", 0); }),
        hostile::expect<ValueError>("read_idx rank 256", {"read_idx", "rank 256"},
                                    [] { read_idx("/nonexistent/train-images-idx3-ubyte", 256); }),
        hostile::expect<ValueError>("read_idx rank INT_MIN", {"read_idx", "rank"},
                                    [] { read_idx("/nonexistent/x", std::numeric_limits<int>::min()); }),
    });
}  // namespace
