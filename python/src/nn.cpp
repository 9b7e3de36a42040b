// The model layer for Python: layers' initialisation (the C++ layers' own, so a Python model starts from the
// same weights as its C++ twin), optimizers and schedules, checkpoints, data, captured steps, and the
// debugging tools (verify, lint, DOT).
#include "strict_int.h"  // first: nanobind's integer caster is replaced before any header uses it

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "binding.h"

namespace dyngrad::python {

namespace {

nb::object wrap(const Parameter& p) {
    if (!p.defined()) return nb::none();
    PyTensor t(p.value());
    t.parameter = p;
    return nb::cast(std::move(t));
}

RnnMode parse_rnn_mode(const std::string& mode) {
    if (mode == "lstm") return RnnMode::Lstm;
    if (mode == "gru") return RnnMode::Gru;
    if (mode == "rnn_tanh") return RnnMode::RnnTanh;
    if (mode == "rnn_relu") return RnnMode::RnnRelu;
    throw ValueError(str("mode='", mode, "': expected 'lstm', 'gru', 'rnn_tanh' or 'rnn_relu'"));
}

Init parse_init(const std::string& init) {
    if (init == "torch") return Init::Torch;
    if (init == "kaiming_relu") return Init::KaimingRelu;
    throw ValueError(str("init='", init, "': expected 'torch' or 'kaiming_relu'"));
}

// A parameter list, or PyTorch-style groups: [{"params": [...], "lr": 0.1, ...}, ...].
std::vector<ParamGroup> parse_groups(nb::handle params, const char* who) {
    std::vector<ParamGroup> groups;
    nb::list items = nb::list(params);
    const bool grouped = nb::len(items) > 0 && nb::isinstance<nb::dict>(items[0]);
    if (!grouped) {
        groups.push_back({parameters_of(arg_as<std::vector<PyTensor*>>(items, who, "params", "an iterable of Tensors"), who)});
        return groups;
    }
    for (nb::handle item : items) {
        if (!nb::isinstance<nb::dict>(item)) throw nb::type_error(str(who, ": mix of parameter groups and tensors").c_str());
        nb::dict d = nb::borrow<nb::dict>(item);
        ParamGroup g;
        for (auto [k, v] : d) {
            const std::string key = arg_as<std::string>(k, who, "a parameter group's key", "a str");
            // Each value's conversion names the optimizer and the group key.
            const auto real = [&](nb::handle value) { return arg_as<double>(value, who, key, "a float"); };
            if (key == "params")
                g.parameters = parameters_of(arg_as<std::vector<PyTensor*>>(nb::list(v), who, key, "an iterable of Tensors"), who);
            else if (key == "lr") g.lr = real(v);
            else if (key == "weight_decay") g.weight_decay = real(v);
            else if (key == "momentum") g.momentum = real(v);
            else if (key == "nesterov") g.nesterov = arg_as<bool>(v, who, key, "a bool");
            else if (key == "betas") {
                const auto betas = arg_as<std::pair<double, double>>(v, who, key, "a pair of floats");
                g.beta1 = betas.first;
                g.beta2 = betas.second;
            } else if (key == "eps") g.eps = real(v);
            else throw nb::type_error(str(who, ": unknown parameter group key '", key, "'").c_str());
        }
        groups.push_back(std::move(g));
    }
    return groups;
}

TensorMap tensor_map(const std::map<std::string, PyTensor*>& named) {
    TensorMap out;
    for (const auto& [name, t] : named) {
        if (t == nullptr) throw ValueError(str("tensor '", name, "' is None"));
        out[name] = t->data();
    }
    return out;
}

std::map<std::string, PyTensor> py_map(const TensorMap& tensors) {
    std::map<std::string, PyTensor> out;
    for (const auto& [name, t] : tensors) out.emplace(name, PyTensor(t));
    return out;
}

struct PyDataLoader {
    std::unique_ptr<DataLoader> loader;
    std::int64_t epoch = 0;
};

// Adam's and AdamW's Python constructor: the same arguments, with torch's default weight decay of each.
template <typename AdamKind, typename Class>
void def_adam_init(Class& c, const char* who, double default_weight_decay) {
    c.def("__init__", [who](AdamKind* self, nb::handle params, double lr, std::pair<double, double> betas, double eps,
                            double weight_decay) {
        new (self) AdamKind(parse_groups(params, who), AdamOptions{lr, betas.first, betas.second, eps, weight_decay});
    }, nb::arg("params"), nb::arg("lr") = 1e-3, nb::arg("betas") = std::pair<double, double>(0.9, 0.999),
      nb::arg("eps") = 1e-8, nb::arg("weight_decay") = default_weight_decay);
}

DataLoaderOptions loader_options(std::int64_t batch_size, bool shuffle, std::uint64_t seed, bool drop_last,
                                 std::int64_t num_shards, std::int64_t shard, std::int64_t prefetch, nb::handle device) {
    return {.batch_size = batch_size, .shuffle = shuffle, .seed = seed, .drop_last = drop_last,
            .num_shards = num_shards, .shard = shard, .prefetch = prefetch,
            .device = device.is_none() ? Device::cpu() : parse_device(device)};
}

// The loader's next batch as a tuple or list of tensors, None after the epoch's last.
nb::object next_batch(DataLoader& loader, bool as_tuple) {
    std::vector<Tensor> batch;
    bool more;
    {
        // The worker thread may be preparing the batch, and a Python data set's worker needs the GIL for it.
        nb::gil_scoped_release release;
        more = loader.next(batch);
    }
    if (!more) return nb::none();
    nb::list out;
    for (Tensor& t : batch) out.append(PyTensor(std::move(t)));
    if (as_tuple) return nb::tuple(out);
    return std::move(out);
}

// A Python data set (any __len__/__getitem__) through the C++ DataLoader, which keeps its order, shuffling,
// sharding, prefetch thread and pinned GPU staging: a "sample" is only its index, and the collate step
// calls back into Python (holding the GIL) to fetch and collate the batch's samples there.
class IndexDataset : public SampleDataset {
public:
    explicit IndexDataset(std::int64_t size) : size_(size) {}
    std::int64_t size() const override { return size_; }
    std::vector<Tensor> get(std::int64_t index) const override {
        return {Tensor::full({}, static_cast<double>(index), DType::i64)};
    }

private:
    std::int64_t size_;
};

struct PyIndexLoader {
    nb::object fetch;  // fetch(indices) -> list of CPU Tensors; outlives `loader`, whose collate borrows it
    std::unique_ptr<DataLoader> loader;

    PyIndexLoader(nb::object f, std::unique_ptr<DataLoader> l) : fetch(std::move(f)), loader(std::move(l)) {}
    PyIndexLoader(const PyIndexLoader&) = delete;
    PyIndexLoader& operator=(const PyIndexLoader&) = delete;
    ~PyIndexLoader() {
        // The worker may be waiting for the GIL inside fetch: join it without holding the GIL.
        nb::gil_scoped_release release;
        loader.reset();
    }
};

// The collate step of a PyIndexLoader: runs on the loader's worker thread (or the caller's, prefetch 0).
std::vector<Tensor> fetch_batch(PyObject* fetch, const std::vector<std::vector<Tensor>>& samples) {
    std::vector<std::int64_t> indices;
    indices.reserve(samples.size());
    for (const std::vector<Tensor>& sample : samples) indices.push_back(sample[0].data<std::int64_t>()[0]);
    nb::gil_scoped_acquire gil;
    nb::object result = nb::handle(fetch)(nb::cast(indices));
    std::vector<Tensor> batch;
    for (nb::handle field : result) {
        if (!nb::isinstance<PyTensor>(field))
            throw ValueError("DataLoader: the collate step must give dyngrad tensors (dyngrad.data.default_collate does)");
        batch.push_back(nb::cast<const PyTensor&>(field).data());
    }
    return batch;
}

}  // namespace

void bind_nn(nb::module_& m) {
    // ---- layers' parameters, initialised by the C++ layers ----
    m.def("_linear_init", [](std::int64_t in, std::int64_t out, bool bias, const std::string& init) {
        const Linear layer(in, out, bias, default_generator(), Activation::None, parse_init(init));
        return nb::make_tuple(wrap(layer.weight), wrap(layer.bias));
    }, nb::arg("in_features"), nb::arg("out_features"), nb::arg("bias"), nb::arg("init") = "torch");
    m.def("_conv2d_init", [](std::int64_t in, std::int64_t out, std::pair<std::int64_t, std::int64_t> kernel,
                             std::int64_t groups, bool bias, const std::string& init) {
        Conv2dOptions options;
        options.groups = groups;
        const Conv2d layer(in, out, {kernel.first, kernel.second}, options, bias, default_generator(), parse_init(init));
        return nb::make_tuple(wrap(layer.weight), wrap(layer.bias));
    }, nb::arg("in_channels"), nb::arg("out_channels"), nb::arg("kernel"), nb::arg("groups"), nb::arg("bias"),
       nb::arg("init") = "torch");
    m.def("_batch_norm_init", [](std::int64_t channels) {
        const BatchNorm layer(channels);
        return nb::make_tuple(wrap(layer.weight), wrap(layer.bias), PyTensor(*layer.running_mean),
                              PyTensor(*layer.running_var));
    }, nb::arg("channels"));
    m.def("_layer_norm_init", [](std::vector<std::int64_t> shape, bool affine, bool bias) {
        const LayerNorm layer(Shape(shape.begin(), shape.end()), 1e-5, affine, bias);
        return nb::make_tuple(wrap(layer.weight), wrap(layer.bias));
    }, nb::arg("normalized_shape"), nb::arg("elementwise_affine"), nb::arg("bias"));
    m.def("_rms_norm_init", [](std::vector<std::int64_t> shape, bool affine) {
        const RMSNorm layer(Shape(shape.begin(), shape.end()), std::nullopt, affine);
        return wrap(layer.weight);
    }, nb::arg("normalized_shape"), nb::arg("elementwise_affine"));
    m.def("_embedding_init", [](std::int64_t num, std::int64_t dim, std::optional<std::int64_t> padding_idx) {
        const Embedding layer(num, dim, default_generator(), padding_idx);
        return wrap(layer.weight);
    }, nb::arg("num_embeddings"), nb::arg("embedding_dim"), nb::arg("padding_idx").none());
    // The recurrent layers (nn/recurrent.h): the C++ layer's flat weight, and its block layout by name.
    m.def("_rnn_init", [](const std::string& mode, std::int64_t input_size, std::int64_t hidden_size,
                          std::int64_t num_layers, bool bidirectional) {
        const Recurrent layer(parse_rnn_mode(mode), input_size, {hidden_size, num_layers, bidirectional},
                              default_generator());
        return wrap(layer.weight);
    }, nb::arg("mode"), nb::arg("input_size"), nb::arg("hidden_size"), nb::arg("num_layers"), nb::arg("bidirectional"));
    m.def("rnn_weight_layout", [](const std::string& mode, std::int64_t input_size, std::int64_t hidden_size,
                                  std::int64_t num_layers, bool bidirectional) {
        nb::list rows;
        for (const RnnWeightEntry& e :
             rnn_weight_layout(parse_rnn_mode(mode), {hidden_size, num_layers, bidirectional}, input_size))
            rows.append(nb::make_tuple(e.name, e.offset, nb::tuple(nb::cast(std::vector<std::int64_t>(e.shape)))));
        return rows;
    }, nb::arg("mode"), nb::arg("input_size"), nb::arg("hidden_size"), nb::arg("num_layers") = 1,
       nb::arg("bidirectional") = false,
       "The blocks of a recurrent layer's flat weight: (name, offset, shape), e.g. ('l0.fwd.W_ih.i', 0, (H, I)).");
    m.def("_param_to", [](PyTensor& t, nb::handle target) {
        // Module.to(): parameters keep their identity (optimizers hold them), their value moves.
        const Tensor moved = nb::isinstance<DType>(target) ? t.data().to(parse_dtype(target)) : t.data().to(parse_device(target));
        if (t.parameter.defined()) {
            t.parameter.value() = moved;
            if (t.parameter.grad().defined()) t.parameter.zero_grad();
        } else {
            t.value = moved;
        }
    });

    // ---- optimizers and schedules ----
    nb::class_<Optimizer>(m, "Optimizer")
        .def("step", [](Optimizer& o) { o.step(); })
        .def("zero_grad", &Optimizer::zero_grad)
        .def_prop_ro("name", &Optimizer::name)
        .def_prop_rw("lr", [](const Optimizer& o) { return o.lr(0); }, [](Optimizer& o, double lr) { o.set_lr(lr); })
        .def("group_lr", [](const Optimizer& o, std::size_t g) { return o.lr(g); })
        .def("set_group_lr", [](Optimizer& o, std::size_t g, double lr) { o.set_lr(g, lr); })
        .def_prop_ro("group_count", &Optimizer::group_count)
        .def("step_count", &Optimizer::step_count);
    nb::class_<SGD, Optimizer>(m, "SGD")
        .def("__init__", [](SGD* self, nb::handle params, double lr, double momentum, bool nesterov, double weight_decay) {
            new (self) SGD(parse_groups(params, "SGD"), SgdOptions{lr, momentum, nesterov, weight_decay});
        }, nb::arg("params"), nb::arg("lr") = 0.01, nb::arg("momentum") = 0.0, nb::arg("nesterov") = false,
           nb::arg("weight_decay") = 0.0);
    nb::class_<Adam, Optimizer> adam(m, "Adam");
    def_adam_init<Adam>(adam, "Adam", 0.0);
    nb::class_<AdamW, Adam> adamw(m, "AdamW");
    def_adam_init<AdamW>(adamw, "AdamW", 0.01);
    nb::class_<LRScheduler>(m, "LRScheduler")
        .def("step", &LRScheduler::step)
        .def_prop_ro("epoch", &LRScheduler::epoch)
        .def("get_last_lr", [](const LRScheduler& s) {
            std::vector<double> lrs;
            for (std::size_t g = 0; g < s.optimizer().group_count(); ++g) lrs.push_back(s.optimizer().lr(g));
            return lrs;
        });
    nb::class_<StepLR, LRScheduler>(m, "StepLR")
        .def(nb::init<Optimizer&, std::int64_t, double>(), nb::arg("optimizer"), nb::arg("step_size"),
             nb::arg("gamma") = 0.1, nb::keep_alive<1, 2>());
    nb::class_<CosineAnnealingLR, LRScheduler>(m, "CosineAnnealingLR")
        .def(nb::init<Optimizer&, std::int64_t, double>(), nb::arg("optimizer"), nb::arg("T_max"),
             nb::arg("eta_min") = 0.0, nb::keep_alive<1, 2>());
    m.def("clip_grad_norm_", [](const std::vector<PyTensor*>& params, double max_norm, double norm_type,
                                bool error_if_nonfinite, nb::handle foreach) {
        (void)foreach;  // PyTorch's kernel choice; the C++ function has one path per device
        return PyTensor(clip_grad_norm(parameters_of(params, "clip_grad_norm_"), max_norm, norm_type,
                                       error_if_nonfinite));
    }, nb::arg("parameters"), nb::arg("max_norm"), nb::arg("norm_type") = 2.0, nb::arg("error_if_nonfinite") = false,
          nb::arg("foreach").none() = nb::none());
    m.def("clip_grad_value_", [](const std::vector<PyTensor*>& params, double clip) {
        clip_grad_value(parameters_of(params, "clip_grad_value_"), clip);
    }, nb::arg("parameters"), nb::arg("clip_value"));

    // ---- files ----
    m.def("save_safetensors", [](const std::string& path, const std::map<std::string, PyTensor*>& tensors,
                                 const std::map<std::string, std::string>& metadata) {
        save_safetensors(path, tensor_map(tensors), metadata);
    }, nb::arg("path"), nb::arg("tensors"), nb::arg("metadata") = std::map<std::string, std::string>());
    m.def("load_safetensors", [](const std::string& path) {
        SafetensorsMetadata metadata;
        TensorMap tensors = load_safetensors(path, &metadata);
        return std::make_pair(py_map(tensors), metadata);
    }, nb::arg("path"));
    m.def("_save_checkpoint", [](const std::string& path, const std::map<std::string, PyTensor*>& model,
                                 const Optimizer& optimizer, const LRScheduler* schedule) {
        TensorMap tensors = tensor_map(model);
        for (const auto& [name, t] : tensors)
            if (!name.empty() && name[0] == '@') throw ValueError(str("save_checkpoint: model entry '", name, "' starts with '@' (reserved)"));
        SafetensorsMetadata metadata;
        optimizer.save_state(tensors, metadata);
        if (schedule != nullptr) schedule->save_state(tensors, metadata);
        save_safetensors(path, tensors, metadata);
    }, nb::arg("path"), nb::arg("model"), nb::arg("optimizer"), nb::arg("schedule").none());
    m.def("_load_checkpoint", [](const std::string& path, Optimizer& optimizer, LRScheduler* schedule) {
        SafetensorsMetadata metadata;
        const TensorMap tensors = load_safetensors(path, &metadata);
        // Check both states before either changes (stage_state: everything checked, then the commit).
        const std::function<void()> commit_optimizer = optimizer.stage_state(tensors, metadata, path);
        std::function<void()> commit_schedule;
        if (schedule != nullptr) commit_schedule = schedule->stage_state(tensors, metadata, path);
        TensorMap model;
        for (const auto& [name, t] : tensors)
            if (name.empty() || name[0] != '@') model[name] = t;
        auto commit = [commit_optimizer, commit_schedule] {
            commit_optimizer();
            if (commit_schedule) commit_schedule();
        };
        return std::make_pair(py_map(model), nb::cpp_function(commit));
    }, nb::arg("path"), nb::arg("optimizer"), nb::arg("schedule").none());

    // ---- data ----
    m.def("load_mnist", [](const std::string& directory) {
        const MnistData data = load_mnist(directory);
        nb::dict d;
        d["train_images"] = PyTensor(data.train.images);
        d["train_labels"] = PyTensor(data.train.labels);
        d["test_images"] = PyTensor(data.test.images);
        d["test_labels"] = PyTensor(data.test.labels);
        d["mean"] = data.normalization.mean;
        d["std"] = data.normalization.stddev;
        return d;
    }, nb::arg("directory") = std::string(kDefaultMnistDirectory));
    nb::class_<BatchLoader>(m, "BatchLoader")
        .def("__init__", [](BatchLoader* self, const PyTensor& images, const PyTensor& labels, std::int64_t batch_size,
                            bool shuffle, std::uint64_t seed, nb::handle device, bool resident) {
            LoaderOptions options;
            options.batch_size = batch_size;
            options.shuffle = shuffle;
            options.seed = seed;
            options.device = device.is_none() ? Device::cpu() : parse_device(device);
            options.resident = resident;
            new (self) BatchLoader(Dataset{images.data(), labels.data()}, options);
        }, nb::arg("images"), nb::arg("labels"), nb::kw_only(), nb::arg("batch_size") = 64, nb::arg("shuffle") = true,
           nb::arg("seed") = 0, nb::arg("device").none() = nb::none(), nb::arg("resident") = false)
        .def("start_epoch", &BatchLoader::start_epoch)
        .def("next", [](BatchLoader& loader) -> nb::object {
            Batch batch;
            if (!loader.next(batch)) return nb::none();
            return nb::make_tuple(PyTensor(batch.images), PyTensor(batch.labels));
        })
        .def("__len__", &BatchLoader::batches_per_epoch);
    nb::class_<PyDataLoader>(m, "_DataLoader")
        .def("__init__", [](PyDataLoader* self, const std::vector<PyTensor*>& tensors, std::int64_t batch_size,
                            bool shuffle, std::uint64_t seed, bool drop_last, std::int64_t num_shards, std::int64_t shard,
                            std::int64_t prefetch, nb::handle device) {
            std::vector<Tensor> columns;
            for (const PyTensor* t : tensors) {
                if (t == nullptr) throw ValueError("DataLoader: a tensor is None");
                columns.push_back(t->data());
            }
            DataLoaderOptions options =
                loader_options(batch_size, shuffle, seed, drop_last, num_shards, shard, prefetch, device);
            new (self) PyDataLoader{std::make_unique<DataLoader>(std::make_shared<TensorDataset>(std::move(columns)), options)};
        }, nb::arg("tensors"), nb::arg("batch_size"), nb::arg("shuffle"), nb::arg("seed"), nb::arg("drop_last"),
           nb::arg("num_shards"), nb::arg("shard"), nb::arg("prefetch"), nb::arg("device").none())
        .def("start_epoch", [](PyDataLoader& l, std::int64_t epoch) { l.loader->start_epoch(epoch); })
        .def("next", [](PyDataLoader& l) { return next_batch(*l.loader, /*as_tuple=*/true); })
        .def("__len__", [](const PyDataLoader& l) { return l.loader->batches_per_epoch(); });

    nb::class_<PyIndexLoader>(m, "_IndexLoader")
        .def("__init__", [](PyIndexLoader* self, std::int64_t size, nb::object fetch, std::int64_t batch_size,
                            bool shuffle, std::uint64_t seed, bool drop_last, std::int64_t num_shards, std::int64_t shard,
                            std::int64_t prefetch, nb::handle device) {
            if (size < 0) throw ValueError(str("DataLoader: the data set's len() is negative (", size, ")"));
            if (!PyCallable_Check(fetch.ptr())) throw nb::type_error("_IndexLoader: fetch must be callable");
            DataLoaderOptions options =
                loader_options(batch_size, shuffle, seed, drop_last, num_shards, shard, prefetch, device);
            PyObject* borrowed = fetch.ptr();  // kept alive by self->fetch for the loader's whole life
            options.collate = [borrowed](const std::vector<std::vector<Tensor>>& samples) {
                return fetch_batch(borrowed, samples);
            };
            new (self) PyIndexLoader(fetch, std::make_unique<DataLoader>(std::make_shared<IndexDataset>(size), options));
        }, nb::arg("size"), nb::arg("fetch"), nb::arg("batch_size"), nb::arg("shuffle"), nb::arg("seed"),
           nb::arg("drop_last"), nb::arg("num_shards"), nb::arg("shard"), nb::arg("prefetch"), nb::arg("device").none())
        .def("start_epoch", [](PyIndexLoader& l, std::int64_t epoch) {
            nb::gil_scoped_release release;  // stopping the worker joins it, and it may wait for the GIL
            l.loader->start_epoch(epoch);
        })
        .def("next", [](PyIndexLoader& l) { return next_batch(*l.loader, /*as_tuple=*/false); })
        .def("order", [](const PyIndexLoader& l) { return l.loader->order(); })
        .def("__len__", [](const PyIndexLoader& l) { return l.loader->batches_per_epoch(); });

    // captured steps: src/capture.cpp

    // ---- debugging ----
    nb::class_<VerifyReport>(m, "VerifyReport")
        .def_ro("passed", &VerifyReport::pass)
        .def_ro("tolerance", &VerifyReport::tolerance)
        .def_ro("first_divergence", &VerifyReport::first_divergence)
        .def("summary", &VerifyReport::summary)
        .def("table", &VerifyReport::table)
        .def("__bool__", [](const VerifyReport& r) { return r.pass; })
        .def("__repr__", &VerifyReport::summary)
        .def_prop_ro("nodes", [](const VerifyReport& r) {
            nb::list out;
            for (const NodeCheck& n : r.nodes)
                out.append(fields_dict(n, field("id", &NodeCheck::id), field("op", &NodeCheck::op),
                                       field("name", &NodeCheck::name), field("shape", &NodeCheck::shape),
                                       field("value_rel_err", &NodeCheck::value_rel_err),
                                       field("grad_rel_err", &NodeCheck::grad_rel_err), field("pass", &NodeCheck::pass)));
            return out;
        });
    m.def("verify", [](const PyTensor& output, double tolerance) {
        if (!output.has_history()) throw GraphError("verify: the tensor has no recorded history (nothing required grad)");
        VerifyOptions options;
        options.tolerance = tolerance;
        VerifyReport report = verify(output.graph->graph(), output.var, Tensor(), options);
        retire_graph(output.graph);  // verify ran the backward (without retain_graph) when none had
        return report;
    }, nb::arg("output"), nb::arg("tolerance") = 0.0,
       "Replays output's graph on the CPU in float64 and compares every value and gradient (runs backward if needed).");
    nb::class_<LintReport>(m, "LintReport")
        .def("clean", &LintReport::clean)
        .def("__str__", &LintReport::to_string)
        .def("__repr__", &LintReport::to_string)
        .def_prop_ro("issues", [](const LintReport& r) {
            std::vector<std::string> out;
            for (const LintIssue& i : r.issues) out.push_back(i.message);
            return out;
        });
    m.def("lint", [](const PyTensor& loss) {
        if (!loss.has_history()) throw GraphError("lint: the tensor has no recorded history (nothing required grad)");
        return lint(loss.graph->graph(), loss.var);
    }, nb::arg("loss"));
    m.def("to_dot", [](const PyTensor& output, const VerifyReport* report) {
        if (!output.has_history()) throw GraphError("to_dot: the tensor has no recorded history (nothing required grad)");
        return to_dot(output.graph->graph(), report);
    }, nb::arg("output"), nb::arg("report").none() = nb::none());
}

}  // namespace dyngrad::python
