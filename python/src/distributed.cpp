// The distributed layer for Python (dyngrad.distributed, dyngrad.nn.parallel): dist::ProcessGroup and
// dist::DistributedDataParallel (distributed/process_group.h, distributed/ddp.h) bound as _core._dist. Built with the
// library's dist component (DYNGRAD_PY_DIST, set by python/CMakeLists.txt when dyngrad::dist exists); without
// it _core._dist.available is False and dyngrad/distributed.py raises, saying why.
//
// How loss.backward() reaches DDP: the C++ DDP averages gradients from inside the engine's backward
// (ddp.backward(graph, loss) sets BackwardOptions::on_parameter_ready). Python's graph is implicit, so the
// Python DDP's forward marks the graph its outputs were recorded in (GraphBox::backward, binding.h); a later
// loss.backward() on that graph runs ddp.backward instead of graph.backward, as PyTorch's DDP forward prepares
// its reducer for the next backward.
#include "strict_int.h"  // first: nanobind's integer caster is replaced before any header uses it

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "binding.h"

#if DYNGRAD_PY_DIST
#include "dyngrad/distributed/ddp.h"
#include "dyngrad/distributed/process_group.h"
#include "dyngrad/distributed/zero.h"
#endif

namespace dyngrad::python {

#if DYNGRAD_PY_DIST
namespace {

using dist::DistributedDataParallel;
using dist::ProcessGroup;
using dist::ReduceOp;

// A collective writes into the tensor's storage in place: only a tensor without history may take it (a node's
// value changed under the graph would give a wrong backward; the version counter would catch it only later).
Tensor in_place_target(const PyTensor& t, const char* who) {
    if (t.has_history())
        throw GraphError(str("dyngrad.distributed.", who, "(): the tensor ", describe(t.data()),
                             " is the result of a recorded op; the collective writes into it in place: pass a "
                             "tensor without history (x.detach(), or one computed under dg.no_grad())"));
    return t.data();
}

// The C++ Module tree over a Python model's own Parameters and buffers (dotted names from named_parameters()
// and named_buffers()): the DDP then hooks exactly the parameters the Python forward records.
struct ModuleNode {
    std::vector<std::pair<std::string, Parameter>> parameters;
    std::vector<std::pair<std::string, Tensor>> buffers;
    std::vector<std::pair<std::string, std::unique_ptr<ModuleNode>>> children;

    ModuleNode& child(const std::string& name) {
        for (auto& [n, c] : children)
            if (n == name) return *c;
        children.emplace_back(name, std::make_unique<ModuleNode>());
        return *children.back().second;
    }
    // The node holding `path`'s last component, which goes to `leaf`.
    ModuleNode& owner(const std::string& path, std::string& leaf) {
        ModuleNode* node = this;
        std::size_t start = 0;
        for (std::size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', start)) {
            node = &node->child(path.substr(start, dot - start));
            start = dot + 1;
        }
        leaf = path.substr(start);
        return *node;
    }
    Module build() const {
        Module m;
        for (const auto& [name, p] : parameters) m.register_parameter(name, p);
        for (const auto& [name, t] : buffers) m.register_buffer(name, t);
        for (const auto& [name, c] : children) m.register_module(name, c->build());  // after its own tensors
        return m;
    }
};

Module module_of(const std::vector<std::pair<std::string, const PyTensor*>>& parameters,
                 const std::vector<std::pair<std::string, const PyTensor*>>& buffers) {
    ModuleNode root;
    std::set<const void*> seen;  // a parameter shared by two layers (tied weights) is averaged once
    for (const auto& [name, t] : parameters) {
        if (t == nullptr || !t->parameter.defined())
            throw ValueError(str("DistributedDataParallel: '", name, "' is not a Parameter"));
        if (!seen.insert(t->parameter.identity()).second) continue;
        std::string leaf;
        ModuleNode& node = root.owner(name, leaf);
        node.parameters.emplace_back(leaf, t->parameter);
    }
    for (const auto& [name, t] : buffers) {
        if (t == nullptr) continue;
        std::string leaf;
        ModuleNode& node = root.owner(name, leaf);
        node.buffers.emplace_back(leaf, t->data());
    }
    return root.build();
}

struct PyDDP {
    std::shared_ptr<DistributedDataParallel> ddp;
};

// What loss.backward() runs on a graph a DDP forward recorded into. The DDP is held weakly: a graph that
// outlives its DDP back-propagates as any other.
GraphBackward ddp_backward(const std::shared_ptr<DistributedDataParallel>& ddp, bool sync) {
    std::weak_ptr<DistributedDataParallel> weak = ddp;
    return [weak, sync](ComputeGraph& graph, const Var& loss, const Tensor* grad_output, const BackwardOptions& options) {
        const auto held = weak.lock();
        if (!held) {
            if (grad_output) graph.backward(loss, *grad_output, options);
            else graph.backward(loss, options);
            return;
        }
        if (grad_output)
            throw ValueError(str("DistributedDataParallel: backward(gradient) on ", describe(loss.value()),
                                 ": the averaged backward starts from a scalar loss; reduce the output to one "
                                 "first, e.g. (out * gradient).sum().backward()"));
        if (sync) {
            held->backward(graph, loss, options);
        } else {  // recorded under no_sync(): this backward only accumulates, as PyTorch's
            auto guard = held->no_sync();
            held->backward(graph, loss, options);
        }
    };
}

nb::dict stats_dict(const dist::DDPStats& s) {
    using S = dist::DDPStats;
    return fields_dict(s, field("backward_calls", &S::backward_calls),
                       field("synchronised_calls", &S::synchronised_calls), field("ready_order", &S::ready_order),
                       field("launch_order", &S::launch_order),
                       field("buckets_launched_during_backward", &S::buckets_launched_during_backward),
                       field("buckets_launched_after_backward", &S::buckets_launched_after_backward),
                       field("unused_parameters", &S::unused_parameters));
}

void bind_available(nb::module_& d) {
    nb::enum_<ReduceOp>(d, "ReduceOp").value("SUM", ReduceOp::Sum).value("AVG", ReduceOp::Avg);

    nb::class_<ProcessGroup>(d, "ProcessGroup")
        .def_static("init", [](double timeout, int device, bool use_nccl) {
            dist::ProcessGroupOptions options;
            options.timeout_seconds = timeout;
            options.device = device;
            options.use_nccl = use_nccl;
            nb::gil_scoped_release release;  // the rendezvous and MPI_Init may wait for the other ranks
            return ProcessGroup::init(options);
        }, nb::arg("timeout") = 0.0, nb::arg("device") = -1, nb::arg("use_nccl") = true)
        .def_prop_ro("rank", &ProcessGroup::rank)
        .def_prop_ro("world_size", &ProcessGroup::world_size)
        .def_prop_ro("local_rank", &ProcessGroup::local_rank)
        .def_prop_ro("device", &ProcessGroup::device)
        .def_prop_ro("has_mpi", &ProcessGroup::has_mpi)
        .def_prop_ro("has_nccl", &ProcessGroup::has_nccl)
        .def_prop_ro("timeout", &ProcessGroup::timeout_seconds)
        .def("describe", &ProcessGroup::describe)
        .def("__repr__", [](const ProcessGroup& g) { return "ProcessGroup(" + g.describe() + ")"; })
        // Collectives release the GIL while they wait (up to the group's timeout) for the other ranks.
        .def("all_reduce", [](ProcessGroup& g, const PyTensor& t, ReduceOp op) {
            Tensor target = in_place_target(t, "all_reduce");
            nb::gil_scoped_release release;
            g.all_reduce(target, op);
        }, nb::arg("tensor"), nb::arg("op"))
        .def("broadcast", [](ProcessGroup& g, const PyTensor& t, int src) {
            Tensor target = in_place_target(t, "broadcast");
            nb::gil_scoped_release release;
            g.broadcast(target, src);
        }, nb::arg("tensor"), nb::arg("src"))
        .def("all_gather", [](ProcessGroup& g, const PyTensor& t) {
            Tensor input = t.data();
            Tensor out;
            {
                nb::gil_scoped_release release;
                out = g.all_gather(input);
            }
            return PyTensor(std::move(out));
        }, nb::arg("tensor"))
        .def("all_gather_into", [](ProcessGroup& g, const PyTensor& output, const PyTensor& input) {
            Tensor target = in_place_target(output, "all_gather_into_tensor");
            Tensor in = input.data();
            nb::gil_scoped_release release;
            g.all_gather(in, target);
        }, nb::arg("output"), nb::arg("input"))
        .def("reduce_scatter_into", [](ProcessGroup& g, const PyTensor& output, const PyTensor& input, ReduceOp op) {
            Tensor target = in_place_target(output, "reduce_scatter_tensor");
            Tensor in = input.data();
            nb::gil_scoped_release release;
            g.reduce_scatter(in, target, op);
        }, nb::arg("output"), nb::arg("input"), nb::arg("op"))
        .def("barrier", [](ProcessGroup& g) {
            nb::gil_scoped_release release;
            g.barrier();
        });

    nb::class_<PyDDP>(d, "DistributedDataParallel")
        .def("__init__", [](PyDDP* self, const ProcessGroup& group,
                            const std::vector<std::pair<std::string, const PyTensor*>>& parameters,
                            const std::vector<std::pair<std::string, const PyTensor*>>& buffers, double bucket_cap_mb,
                            double first_bucket_cap_mb, bool overlap, bool gradient_as_bucket_view,
                            nb::handle compression) {
            const Module module = module_of(parameters, buffers);
            dist::DDPOptions options;
            if (!compression.is_none()) options.compression = parse_dtype(compression);
            options.bucket_cap_mb = bucket_cap_mb;
            options.first_bucket_cap_mb = first_bucket_cap_mb;
            options.overlap = overlap;
            options.gradient_as_bucket_view = gradient_as_bucket_view;
            std::shared_ptr<DistributedDataParallel> ddp;
            {
                nb::gil_scoped_release release;  // the model check and rank 0's broadcast wait for every rank
                ddp = std::make_shared<DistributedDataParallel>(module, group, options);
            }
            new (self) PyDDP{std::move(ddp)};
        }, nb::arg("group"), nb::arg("parameters"), nb::arg("buffers"), nb::arg("bucket_cap_mb"),
           nb::arg("first_bucket_cap_mb"), nb::arg("overlap"), nb::arg("gradient_as_bucket_view") = false,
           nb::arg("compression").none() = nb::none())
        // DDPOptions::compression after construction (register_comm_hook): a 16-bit dtype or None.
        .def("set_compression", [](PyDDP& self, nb::handle compression) {
            self.ddp->set_compression(compression.is_none() ? std::nullopt : std::optional<DType>(parse_dtype(compression)));
        }, nb::arg("compression").none())
        // Marks the graphs of the forward's outputs: their loss.backward() goes through this DDP.
        .def("prepare_backward", [](PyDDP& self, const std::vector<const PyTensor*>& outputs, bool sync) {
            for (const PyTensor* t : outputs)
                if (t != nullptr && t->has_history() && t->graph) t->graph->backward = ddp_backward(self.ddp, sync);
        }, nb::arg("outputs"), nb::arg("sync"))
        .def("buckets", [](const PyDDP& self) { return self.ddp->buckets(); })
        .def_prop_ro("stats", [](const PyDDP& self) { return stats_dict(self.ddp->stats()); });
}

// dist::ZeroOptimizer over a Python model's parameters; dyngrad/distributed.py's ZeroOptimizer reduces the
// gradients in step() after an ordinary loss.backward(). Stages 1 and 2 wrap one model; stage 3 a list of units
// (dist::ZeroUnit), each a Python module and its Python forward.
struct PyZero {
    std::unique_ptr<dist::ZeroOptimizer> zero;
};

// A unit's Python forward, held by the C++ unit's std::function. The optimizer may be destroyed (and a failed
// constructor's units dropped) without the GIL: the reference is released with it taken.
struct PythonForward {
    nb::object fn;
    explicit PythonForward(nb::object f) : fn(std::move(f)) {}
    PythonForward(const PythonForward&) = delete;
    PythonForward& operator=(const PythonForward&) = delete;
    ~PythonForward() {
        if (!Py_IsInitialized()) {
            (void)fn.release();  // the interpreter is gone: nothing to decrement
            return;
        }
        nb::gil_scoped_acquire gil;
        fn.reset();
    }
};

// unit.forward(x) for the C++ stage 3: x is a Var of the graph the unit op made for this run (the kept forward's
// nested graph, recording with grad; or, with recompute, its shape rule's, without recording, and its backward's
// recomputation). The Python forward records into that graph: a box over
// it is the thread's current graph for the call, so the ops it runs (and the C++ layers it calls) are nodes of
// the unit's graph, and the engine's backward of that graph reaches the unit's parameters.
Var run_python_unit(const PythonForward& forward, const std::string& unit, const Var& x) {
    nb::gil_scoped_acquire gil;
    const std::string who = str("dyngrad.distributed.ZeroOptimizer: unit '", unit, "'");
    const auto box = std::make_shared<GraphBox>(x);
    PyTensor input;
    if (x.requires_grad()) {
        input.var = x;
        input.graph = box;
    } else {
        input.value = x.value();
    }
    // Tensors the Python forward kept see a released graph: reading them once the unit's graph is gone raises
    // GraphError rather than reaching it.
    struct ReleaseOnExit {
        GraphBox& box;
        ~ReleaseOnExit() { box.released = true; }
    } release{*box};
    Var out;
    try {
        const CurrentGraphScope scope(box);
        const nb::object result = forward.fn(nb::cast(std::move(input)));
        const PyTensor* y = as_tensor(result.ptr());
        if (y == nullptr)
            throw ValueError(str(who, ": its forward must return a dyngrad Tensor, got ",
                                 Py_TYPE(result.ptr())->tp_name));
        if (y->has_history()) {
            if (y->graph != box)
                throw GraphError(str(who, ": its forward returned a tensor recorded outside the unit (a unit may "
                                          "use its input, its own parameters and constants)"));
            out = y->var;
        } else {
            out = x.graph().constant(y->data());  // no history: computed without grad (the shape rule's run)
        }
    } catch (nb::python_error& e) {
        rethrow_as_dyngrad_error(e, str(who, ": its forward raised"));
    }
    return out;
}

std::vector<dist::ZeroUnit> zero_units(const nb::list& units) {
    std::vector<dist::ZeroUnit> out;
    for (nb::handle h : units) {
        const auto entry = nb::cast<nb::tuple>(h);
        auto parameters = nb::cast<std::vector<std::pair<std::string, const PyTensor*>>>(entry[1]);
        auto buffers = nb::cast<std::vector<std::pair<std::string, const PyTensor*>>>(entry[2]);
        dist::ZeroUnit unit;
        unit.name = nb::cast<std::string>(entry[0]);
        unit.module = module_of(parameters, buffers);
        auto forward = std::make_shared<PythonForward>(nb::object(entry[3]));
        unit.forward = [forward, name = unit.name](const Var& x) { return run_python_unit(*forward, name, x); };
        if (entry.size() > 4) unit.stochastic = nb::cast<bool>(entry[4]);
        out.push_back(std::move(unit));
    }
    return out;
}

nb::dict memory_dict(const dist::ZeroMemory& m) {
    using M = dist::ZeroMemory;
    return fields_dict(m, field("world", &M::world), field("stage", &M::stage), field("parameters", &M::parameters),
                       field("padded", &M::padded), field("parameter_bytes", &M::parameter_bytes),
                       field("gradient_bytes", &M::gradient_bytes), field("optimizer_bytes", &M::optimizer_bytes),
                       field("formula_parameter_bytes", &M::formula_parameter_bytes),
                       field("formula_gradient_bytes", &M::formula_gradient_bytes),
                       field("formula_optimizer_bytes", &M::formula_optimizer_bytes), field("ddp_bytes", &M::ddp_bytes),
                       field("gathered_peak_bytes", &M::gathered_peak_bytes),
                       field("formula_gathered_bytes", &M::formula_gathered_bytes),
                       field("gathered_bytes", &M::gathered_bytes),
                       field("kept_parameter_bytes", &M::kept_parameter_bytes),
                       field("released_bytes", &M::released_bytes),
                       field("kept_activation_bytes", &M::kept_activation_bytes));
}

void bind_zero(nb::module_& d) {
    nb::class_<PyZero>(d, "ZeroOptimizer")
        .def("__init__", [](PyZero* self, const ProcessGroup& group,
                            const std::vector<std::pair<std::string, const PyTensor*>>& parameters,
                            const std::vector<std::pair<std::string, const PyTensor*>>& buffers, double lr, double beta1,
                            double beta2, double eps, double weight_decay, int stage) {
            const Module module = module_of(parameters, buffers);
            const AdamOptions options{.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = weight_decay};
            std::unique_ptr<dist::ZeroOptimizer> made;
            {
                nb::gil_scoped_release release;  // the model check and rank 0's broadcast wait for every rank
                made = std::make_unique<dist::ZeroOptimizer>(module, group, options, dist::ZeroOptions{.stage = stage});
            }
            new (self) PyZero{std::move(made)};
        }, nb::arg("group"), nb::arg("parameters"), nb::arg("buffers"), nb::arg("lr"), nb::arg("beta1"),
           nb::arg("beta2"), nb::arg("eps"), nb::arg("weight_decay"), nb::arg("stage"))
        // Stage 3: units as (name, named_parameters, named_buffers, forward) tuples.
        .def_static("from_units", [](const ProcessGroup& group, const nb::list& units, double lr, double beta1,
                                     double beta2, double eps, double weight_decay, int stage, bool recompute,
                                     std::optional<bool> prefetch) {
            std::vector<dist::ZeroUnit> made_units = zero_units(units);
            const AdamOptions options{.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = weight_decay};
            std::unique_ptr<dist::ZeroOptimizer> made;
            {
                nb::gil_scoped_release release;
                made = std::make_unique<dist::ZeroOptimizer>(std::move(made_units), group, options,
                                                             dist::ZeroOptions{.stage = stage, .recompute = recompute,
                                                                               .prefetch = prefetch});
            }
            return new PyZero{std::move(made)};
        }, nb::arg("group"), nb::arg("units"), nb::arg("lr"), nb::arg("beta1"), nb::arg("beta2"), nb::arg("eps"),
           nb::arg("weight_decay"), nb::arg("stage"), nb::arg("recompute") = false, nb::arg("prefetch") = nb::none(),
           nb::rv_policy::take_ownership)
        // Stage 3: the units in order on x, one recorded node per unit (distributed/zero.h).
        .def("forward", [](PyZero& z, const PyTensor& x) {
            const PyTensor* inputs[] = {&x};
            return call_with_vars(inputs, true, [&z](std::span<const Var> v, std::source_location) {
                nb::gil_scoped_release release;  // the gathers wait for every rank; each unit takes the GIL back
                return z.zero->forward(v[0]);
            });
        }, nb::arg("x"))
        .def("full_parameters", [](PyZero& z) {
            std::vector<std::pair<std::string, Tensor>> full;
            {
                nb::gil_scoped_release release;  // stage 3 all-gathers every unit
                full = z.zero->full_parameters();
            }
            std::vector<std::pair<std::string, PyTensor>> out;
            for (auto& [name, t] : full) out.emplace_back(name, PyTensor(std::move(t)));
            return out;
        })
        .def("reduce_gradients", [](PyZero& z) {
            nb::gil_scoped_release release;
            z.zero->reduce_gradients();
        })
        .def("clip_grad_norm", [](PyZero& z, double max_norm, double norm_type) {
            Tensor norm;
            {
                nb::gil_scoped_release release;
                norm = z.zero->clip_grad_norm(max_norm, norm_type);
            }
            return PyTensor(std::move(norm));
        }, nb::arg("max_norm"), nb::arg("norm_type") = 2.0)
        .def("step", [](PyZero& z) {
            nb::gil_scoped_release release;
            z.zero->step();
        })
        .def("zero_grad", [](PyZero& z) { z.zero->zero_grad(); })
        .def_prop_ro("stage", [](const PyZero& z) { return z.zero->stage(); })
        .def_prop_ro("step_count", [](const PyZero& z) { return z.zero->optimizer().step_count(0); })
        .def("memory", [](const PyZero& z) { return memory_dict(z.zero->memory()); })
        .def("save_checkpoint", [](const PyZero& z, const std::string& folder) {
            nb::gil_scoped_release release;  // every rank writes, then a barrier
            z.zero->save_checkpoint(folder);
        }, nb::arg("folder"))
        .def("load_checkpoint", [](PyZero& z, const std::string& folder) {
            nb::gil_scoped_release release;  // stage 3 gathers and re-shards
            z.zero->load_checkpoint(folder);
        }, nb::arg("folder"));
}

}  // namespace
#endif

void run_graph_backward(GraphBox& box, const Var& output, const Tensor* grad_output, const BackwardOptions& options) {
    if (box.backward) box.backward(box.graph(), output, grad_output, options);
    else if (grad_output) box.graph().backward(output, *grad_output, options);
    else box.graph().backward(output, options);
}

void bind_distributed(nb::module_& m) {
    nb::module_ d = m.def_submodule("_dist", "dist::ProcessGroup and dist::DistributedDataParallel (dyngrad.distributed)");
#if DYNGRAD_PY_DIST
    d.attr("available") = true;
    d.attr("unavailable_reason") = "";
    bind_available(d);
    bind_zero(d);
#else
    d.attr("available") = false;
    d.attr("unavailable_reason") =
        "this dyngrad was built without its distributed layer: the library dyngrad::dist is built only where CMake "
        "finds MPI (apt-get install libopenmpi-dev openmpi-bin), and the Python package links it only when the "
        "library it is built against has it; rebuild the library, then reinstall the package";
#endif
}

}  // namespace dyngrad::python
