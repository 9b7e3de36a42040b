// llm.c's token files for Python (nn/token_file.h): dyngrad.data.TokenWindows, TokenVocabulary,
// read_token_file and write_token_file, the C++ classes themselves, so a Python GPT-2 run reads the same windows
// from the same (seed, step) as char_gpt --model gpt2, with the same typed errors naming the file.
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "binding.h"
#include "dyngrad/nn/token_file.h"

namespace dyngrad::python {

namespace {

Device device_or_cpu(nb::handle device) { return device.is_none() ? Device::cpu() : device_or_cpu(device); }

nb::tuple batch_tuple(TokenBatch batch) {
    return nb::make_tuple(PyTensor(std::move(batch.inputs)), PyTensor(std::move(batch.targets)));
}

}  // namespace

void bind_token_files(nb::module_& m) {
    m.def("read_token_file", [](const std::filesystem::path& path, std::int64_t vocab_size) {
        const std::vector<std::uint16_t> tokens = read_token_file(path, vocab_size);
        return std::vector<std::int64_t>(tokens.begin(), tokens.end());
    }, nb::arg("path"), nb::arg("vocab_size") = 0);
    m.def("write_token_file", &write_token_file, nb::arg("path"), nb::arg("tokens"));

    nb::class_<TokenWindows>(m, "TokenWindows")
        .def(nb::init<const std::filesystem::path&, std::int64_t, std::int64_t, std::int64_t>(), nb::arg("path"),
             nb::arg("vocab_size"), nb::arg("batch"), nb::arg("context"))
        .def("random_offsets", &TokenWindows::random_offsets, nb::arg("seed"), nb::arg("step"))
        .def("random", [](const TokenWindows& w, std::uint64_t seed, std::int64_t step, nb::handle device) {
            return batch_tuple(w.random(seed, step, device_or_cpu(device)));
        }, nb::arg("seed"), nb::arg("step"), nb::arg("device") = nb::none())
        .def("at", [](const TokenWindows& w, const std::vector<std::int64_t>& offsets, nb::handle device) {
            return batch_tuple(w.at(offsets, device_or_cpu(device)));
        }, nb::arg("offsets"), nb::arg("device") = nb::none())
        .def("sequential_batches", &TokenWindows::sequential_batches)
        .def("sequential", [](const TokenWindows& w, std::int64_t index, nb::handle device) {
            return batch_tuple(w.sequential(index, device_or_cpu(device)));
        }, nb::arg("index"), nb::arg("device") = nb::none())
        .def("__len__", &TokenWindows::size)
        .def_prop_ro("batch", &TokenWindows::batch)
        .def_prop_ro("context", &TokenWindows::context)
        .def_prop_ro("name", &TokenWindows::name);

    nb::class_<TokenVocabulary>(m, "TokenVocabulary")
        .def_static("bytes", &TokenVocabulary::bytes)
        .def_static("words", &TokenVocabulary::words, nb::arg("reference"), nb::arg("words"))
        .def("__len__", &TokenVocabulary::size)
        .def("piece", &TokenVocabulary::piece, nb::arg("token"))
        .def("encode", &TokenVocabulary::encode, nb::arg("text"))
        .def("decode", &TokenVocabulary::decode, nb::arg("tokens"));
}

}  // namespace dyngrad::python
