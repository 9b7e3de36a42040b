#include <cstdint>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "dyngrad/dyngrad.h"

using namespace dyngrad;

// Runs `fn`, which must throw an ErrorType whose message contains each of `words`; prints the message.
template <typename ErrorType>
bool fails_with(const std::function<void()>& fn, const std::vector<std::string>& words) {
    try {
        fn();
    } catch (const ErrorType& e) {
        std::cout << e.what() << "\n\n";
        for (const std::string& word : words)
            if (std::string(e.what()).find(word) == std::string::npos) return false;
        return true;
    } catch (const Error& e) {  // every dyngrad error derives from dyngrad::Error
        std::cout << "another error type: " << e.what() << "\n";
    }
    return false;
}

int main() {
    ComputeGraph graph;
    Var a = graph.input(Tensor::zeros({2, 3}), "a");
    Var b = graph.input(Tensor::zeros({4, 5}), "b");
    Var logits = graph.input(Tensor::zeros({2, 3}));
    Var labels = graph.input(Tensor::from_vector(std::vector<std::int64_t>{0, 7}, {2}));
    Var wide = graph.input(Tensor::zeros({2, 3}, DType::f64));

    bool ok = fails_with<ShapeError>([&] { matmul(a, b); }, {"matmul", "(2,3)", "(4,5)", "guide_errors.cpp"});
    ok &= fails_with<IndexError>([&] { cross_entropy(logits, labels); }, {"cross_entropy", "label 7"});
    ok &= fails_with<DTypeError>([&] { add(a, wide); }, {"add", "float32", "float64"});
    ok &= fails_with<DeviceError>([&] { Tensor::zeros({2}, DType::f32, Device::cuda(99)); }, {"cuda:99"});
    ok &= fails_with<ValueError>([&] { Tensor::from_vector(std::vector<float>{1, 2, 3}, {2, 2}); }, {"3", "(2,2)"});
    ok &= fails_with<IoError>([&] { load_safetensors("/nonexistent/model.safetensors"); },
                              {"/nonexistent/model.safetensors"});
    graph.clear();
    ok &= fails_with<GraphError>([&] { a.value(); }, {"cleared or destroyed"});
    return ok ? 0 : 1;
}
