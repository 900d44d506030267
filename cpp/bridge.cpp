// ort_lazy._bridge: runs the ORT-supported regions of TorchScript graphs on ONNX Runtime.
//
// Two pieces, both registered when the module is imported:
//  * a TorchScript post pass that fuses consecutive supported nodes into one
//    `ort::CompilationGroup` node (CustomFuseGraph + a support predicate answered by
//    Python: ort_lazy.support.op_reason, the table the Dynamo path uses as well);
//  * an operator for that symbol which hands the group's input tensors to a Python
//    runner (export + ORT session + IOBinding live in Python) and pushes its outputs.
//
// The LazyTensor TorchScript backend executes every lowered graph with an ordinary
// GraphExecutor, so the same pass and operator serve both `device="lazy"` and
// torch.jit.script / torch.jit.trace.

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/graph_fuser.h>
#include <torch/csrc/jit/passes/pass_manager.h>
#include <torch/csrc/jit/passes/tensorexpr_fuser.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/csrc/lazy/core/config.h>
#include <torch/csrc/lazy/core/lazy_graph_executor.h>
#include <torch/extension.h>

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <string>
#include <vector>

// The build passes torch.__version__ unquoted (quotes do not survive ninja); stringize it.
#ifdef _OPENMP
#include <omp.h>
#endif

#define ORT_LAZY_STR_(x) #x
#define ORT_LAZY_STR(x) ORT_LAZY_STR_(x)

namespace py = pybind11;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Stack;
using torch::jit::Value;

namespace {

const c10::Symbol kGroup = c10::Symbol::fromQualString("ort::CompilationGroup");

// Python callables installed by ort_lazy.frontends.jit.  They are leaked on purpose:
// destroying py::objects after the interpreter shut down would crash at exit.
struct Callbacks {
  py::object* support = nullptr;  // support(key, op, overload, inputs, graph) -> bool
  py::object* factory = nullptr;  // factory(graph, name) -> object with run(list) -> list | None
  py::object* on_torch_run = nullptr;  // on_torch_run(reason) -> None
  py::object* fatal = nullptr;  // exception type(s) a group run must raise, not fall back on
  py::object* rejected = nullptr;  // rejected(op, overload, why) -> None: turned down in C++
};
Callbacks g_cb;
std::atomic<bool> g_enabled{false};
std::atomic<int64_t> g_group_counter{0};
// Set while ort_lazy exports a group (it may execute the subgraph once): no fusion then.
thread_local int tl_pass_disabled = 0;

bool is_tensor(const Value* v) {
  return v->type()->cast<c10::TensorType>() != nullptr;
}

// Describes a node input for the support callback: a tensor as (dtype, sizes|None,
// device|None), a constant as its Python value.  Also appends to the cache key.
py::object describe_input(const Value* v, std::ostringstream& key) {
  if (auto tt = v->type()->cast<c10::TensorType>()) {
    auto st = tt->scalarType();
    auto dim = tt->dim();
    if (!st || !dim) {
      return py::none();  // unknown dtype/rank: cannot be judged, stays in TorchScript
    }
    key << "|T" << static_cast<int>(*st) << ":";
    py::object sizes = py::none();
    if (auto concrete = tt->sizes().concrete_sizes()) {
      sizes = py::cast(*concrete);
      for (auto s : *concrete) key << s << ",";
    } else {
      key << "r" << *dim;
      sizes = py::cast(static_cast<int64_t>(*dim));  // rank only
    }
    auto dtype = py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPDtype(*st)));
    py::object device = py::none();
    if (auto d = tt->device()) {
      device = py::str(d->str());
      key << "@" << d->str();
    }
    return py::make_tuple(py::str("tensor"), dtype, sizes, device);
  }
  auto iv = torch::jit::toIValue(v);
  auto value = torch::jit::toPyObject(*iv);
  key << "|C" << py::repr(value).cast<std::string>();
  return py::make_tuple(py::str("const"), value);
}

// A copy of the group's subgraph prepared for the exporter: no LTC `source` attributes and
// a single (tuple) output when there are several.
std::shared_ptr<Graph> prepare_for_export(const std::shared_ptr<Graph>& subgraph) {
  auto g = subgraph->copy();
  // Profiled types are not guarded: the exporter must re-derive them from real inputs.
  torch::jit::RemoveTensorTypeSpecializations(g);
  static const c10::Symbol kSource = c10::Symbol::attr("source");
  for (Node* n : g->nodes()) {
    if (n->hasAttribute(kSource)) n->removeAttribute(kSource);
  }
  if (g->outputs().size() > 1) {
    std::vector<Value*> outs(g->outputs().begin(), g->outputs().end());
    Node* tuple = g->insertNode(g->createTuple(outs));
    while (!g->outputs().empty()) g->eraseOutput(0);
    g->registerOutput(tuple->output());
  }
  return g;
}

// A graph holding a copy of `node` alone: each tensor input position becomes a graph input
// of its own (with the node's profiled type), even where one value feeds several positions
// (x * x) or the tensor is a constant (a scalar LazyTensor folded in): Python describes and
// feeds one example per tensor position (describe_input).  Other constants are copied.
// Python probes whether the TorchScript exporter and ORT take exactly this node.
std::shared_ptr<Graph> single_node_graph(Node* node) {
  auto g = std::make_shared<Graph>();
  std::vector<Value*> by_position;
  for (Value* in : node->inputs()) {
    if (in->node()->kind() == c10::prim::Constant && !is_tensor(in)) {
      Node* c = g->createClone(in->node(), [](Value* v) { return v; });
      g->insertNode(c);
      by_position.push_back(c->output());
    } else {
      Value* v = g->addInput();
      v->setType(in->type());
      by_position.push_back(v);
    }
  }
  // createClone maps the node's inputs once each, in order
  size_t position = 0;
  Node* copy = g->createClone(node, [&](Value*) { return by_position.at(position++); });
  g->insertNode(copy);
  for (Value* out : copy->outputs()) g->registerOutput(out);
  return prepare_for_export(g);
}

// Tells Python why an aten node was turned down before the support callback saw it (so
// metrics and explain list it), then returns false.
bool reject(const Node* node, const c10::FunctionSchema* schema, const char* why) {
  if (g_cb.rejected == nullptr) return false;
  py::gil_scoped_acquire gil;
  try {
    std::string name = schema ? schema->name() : std::string(node->kind().toQualString());
    std::string overload = schema ? schema->overload_name() : std::string();
    (*g_cb.rejected)(name, overload, why);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable(__func__);
  }
  return false;
}

// The fusion predicate.  Only aten nodes with one tensor output whose non-tensor inputs
// are constants qualify: CustomFuseGraph merges single-output producers only (a two-output
// node such as max_pool2d_with_indices trips its assertion), and LTC's
// aten::ScalarImplicit alpha would otherwise become a Scalar group input the fuser cannot
// handle.  Then Python decides from the shared table.
bool is_supported(Node* node) {
  if (!node->kind().is_aten()) {
    return false;
  }
  const c10::FunctionSchema* schema = node->maybeSchema();
  if (node->outputs().size() != 1) {
    return reject(node, schema, "outputs");
  }
  if (schema == nullptr) {
    return reject(node, schema, "schema");
  }
  if (schema->is_mutable()) {
    return reject(node, schema, "mutable");
  }
  for (const Value* out : node->outputs()) {
    if (!is_tensor(out)) return reject(node, schema, "output");
  }
  for (const Value* in : node->inputs()) {
    if (!is_tensor(in) && in->node()->kind() != c10::prim::Constant) return reject(node, schema, "scalar");
  }
  py::gil_scoped_acquire gil;
  std::ostringstream key;
  key << schema->name() << "." << schema->overload_name();
  py::list inputs;
  for (const Value* in : node->inputs()) {
    py::object d = describe_input(in, key);
    if (d.is_none()) return reject(node, schema, "untyped");
    inputs.append(d);
  }
  try {
    return (*g_cb.support)(key.str(), schema->name(), schema->overload_name(), inputs,
                           single_node_graph(node))
        .cast<bool>();
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable(__func__);
    return false;
  }
}

// LazyTensor's graphs hold aten ops the TorchScript exporter has no symbolic for; each is
// rewritten here, before fusion, into ops it exports, with the same values.  New values get
// the replaced node's profiled type (dtype and rank; sizes only where they are the same), so
// the support predicate can judge them.

Node* insert_typed(const std::shared_ptr<Graph>& graph, const char* kind,
                   std::vector<Value*> inputs, const c10::TypePtr& type) {
  Node* n = graph->insertNode(graph->create(c10::Symbol::fromQualString(kind), inputs));
  n->output()->setType(type);
  return n;
}

// aten::threshold_backward(grad, self, threshold) (ReLU's backward) =
// masked_fill(grad, self <= threshold, 0): a NaN input keeps its gradient in both.
bool lower_threshold_backward(const std::shared_ptr<Graph>& graph, Node* n,
                              const c10::TensorTypePtr& out, const c10::TensorTypePtr& self) {
  Node* le = insert_typed(graph, "aten::le", {n->input(1), n->input(2)}, self->withScalarType(at::kBool));
  Value* zero = graph->insertConstant(at::Scalar(0));
  Node* fill = insert_typed(graph, "aten::masked_fill", {n->input(0), le->output(), zero}, out);
  n->output()->replaceAllUsesWith(fill->output());
  return true;
}

// aten::_softmax(x, dim, false) = softmax(x, dim, None); likewise _log_softmax.
bool lower_private_softmax(const std::shared_ptr<Graph>& graph, Node* n, const c10::TensorTypePtr& out,
                           const char* kind) {
  auto half_to_float = torch::jit::toIValue(n->input(2));
  if (!half_to_float || !half_to_float->isBool() || half_to_float->toBool()) return false;
  Value* none = graph->insertConstant(c10::IValue());
  Node* r = insert_typed(graph, kind, {n->input(0), n->input(1), none}, out);
  n->output()->replaceAllUsesWith(r->output());
  return true;
}

// The backward of softmax (out = softmax(x)): out * (grad - sum(grad * out, dim, keepdim));
// of log_softmax (out = log_softmax(x)): grad - exp(out) * sum(grad, dim, keepdim).
bool lower_softmax_backward(const std::shared_ptr<Graph>& graph, Node* n, const c10::TensorTypePtr& out,
                            bool log) {
  auto dim = torch::jit::toIValue(n->input(2));
  auto grad_type = n->input(0)->type()->cast<c10::TensorType>();
  if (!dim || !dim->isInt() || !grad_type || grad_type->scalarType() != out->scalarType()) return false;
  Value* grad = n->input(0);
  Value* y = n->input(1);
  Value* dims = graph->insertConstant(c10::IValue(std::vector<int64_t>{dim->toInt()}));
  Value* keep = graph->insertConstant(true);
  Value* none = graph->insertConstant(c10::IValue());
  Value* one = graph->insertConstant(at::Scalar(1));
  auto reduced = out->dimensionedOnly();
  Value* result;
  if (log) {
    Node* total = insert_typed(graph, "aten::sum", {grad, dims, keep, none}, reduced);
    Node* p = insert_typed(graph, "aten::exp", {y}, out);
    Node* scaled = insert_typed(graph, "aten::mul", {p->output(), total->output()}, out);
    result = insert_typed(graph, "aten::sub", {grad, scaled->output(), one}, out)->output();
  } else {
    Node* prod = insert_typed(graph, "aten::mul", {grad, y}, out);
    Node* total = insert_typed(graph, "aten::sum", {prod->output(), dims, keep, none}, reduced);
    Node* diff = insert_typed(graph, "aten::sub", {grad, total->output(), one}, out);
    result = insert_typed(graph, "aten::mul", {y, diff->output()}, out)->output();
  }
  n->output()->replaceAllUsesWith(result);
  return true;
}

// The backward of adaptive average pooling where the output size divides the input's (global
// pooling included): each input element gets its window's gradient over the window's area,
// upsample_nearest2d(grad, input size) / (kh * kw) (nearest: index i reads grad[i / kh]).
// Needs both sizes profiled; otherwise it stays as it is (in TorchScript).
bool lower_adaptive_pool_backward(const std::shared_ptr<Graph>& graph, Node* n, const c10::TensorTypePtr& out) {
  auto grad_t = n->input(0)->type()->cast<c10::TensorType>();
  auto self_t = n->input(1)->type()->cast<c10::TensorType>();
  if (!grad_t || !self_t) return false;
  auto g = grad_t->sizes().concrete_sizes();
  auto x = self_t->sizes().concrete_sizes();
  if (!g || !x || g->size() != 4 || x->size() != 4) return false;  // upsample_nearest2d takes NCHW
  const int64_t h = (*g)[2], w = (*g)[3], H = (*x)[2], W = (*x)[3];
  if (h <= 0 || w <= 0 || H % h != 0 || W % w != 0) return false;
  Value* size = graph->insertConstant(c10::IValue(std::vector<int64_t>{H, W}));
  Value* none = graph->insertConstant(c10::IValue());
  Node* up = insert_typed(graph, "aten::upsample_nearest2d", {n->input(0), size, none, none}, out);
  Value* area = graph->insertConstant(at::Scalar(static_cast<double>((H / h) * (W / w))));
  Node* d = insert_typed(graph, "aten::div", {up->output(), area}, out);
  n->output()->replaceAllUsesWith(d->output());
  return true;
}

void lower_for_export(const std::shared_ptr<Graph>& graph) {
  std::vector<Node*> nodes(graph->nodes().begin(), graph->nodes().end());
  static const c10::Symbol kPrivatePool = c10::Symbol::fromQualString("aten::_adaptive_avg_pool2d");
  for (Node* n : nodes) {
    if (n->outputs().size() != 1) continue;
    if (n->kind() == kPrivatePool && n->inputs().size() == 2) {
      // the public op (same schema, whatever the output's profiled type): the exporter has a
      // symbolic for it (global pooling, or average pooling where the output size divides the
      // input's; otherwise the probe says no and it stays in TorchScript)
      torch::jit::WithInsertPoint guard(n);
      Node* r = insert_typed(graph, "aten::adaptive_avg_pool2d", {n->input(0), n->input(1)}, n->output()->type());
      n->output()->replaceAllUsesWith(r->output());
      n->destroy();
      continue;
    }
    auto out = n->output()->type()->cast<c10::TensorType>();
    if (!out || !out->scalarType() || !out->dim()) continue;
    const std::string kind = n->kind().toQualString();
    torch::jit::WithInsertPoint guard(n);
    bool done = false;
    if (kind == "aten::threshold_backward" && n->inputs().size() == 3) {
      auto self = n->input(1)->type()->cast<c10::TensorType>();
      done = self && lower_threshold_backward(graph, n, out, self);
    } else if (kind == "aten::_softmax" && n->inputs().size() == 3) {
      done = lower_private_softmax(graph, n, out, "aten::softmax");
    } else if (kind == "aten::_log_softmax" && n->inputs().size() == 3) {
      done = lower_private_softmax(graph, n, out, "aten::log_softmax");
    } else if (kind == "aten::_softmax_backward_data" && n->inputs().size() == 4) {
      done = lower_softmax_backward(graph, n, out, false);
    } else if (kind == "aten::_log_softmax_backward_data" && n->inputs().size() == 4) {
      done = lower_softmax_backward(graph, n, out, true);
    } else if (kind == "aten::_adaptive_avg_pool2d_backward" && n->inputs().size() == 2) {
      done = lower_adaptive_pool_backward(graph, n, out);
    }
    if (done) n->destroy();
  }
}

// A node whose result depends on its input's memory layout (as_strided reads storage
// positions), anywhere in the block or its sub-blocks.
const Node* addresses_memory(const torch::jit::Block* block) {
  for (const Node* n : block->nodes()) {
    const std::string kind = n->kind().toQualString();
    if (kind == "aten::as_strided" || kind == "aten::as_strided_scatter") return n;
    for (const torch::jit::Block* sub : n->blocks()) {
      if (const Node* found = addresses_memory(sub)) return found;
    }
  }
  return nullptr;
}

void fuse_pass(std::shared_ptr<Graph>& graph) {
  if (!g_enabled.load() || tl_pass_disabled > 0 || g_cb.support == nullptr) {
    return;
  }
  // A TorchScript graph does not say how eager lays each value out in memory, and an ORT
  // group's outputs are row-major where eager's may be transposed views: an as_strided
  // reading one would read other elements.  Such a graph runs in TorchScript, whole.
  if (const Node* n = addresses_memory(graph->block())) {
    reject(n, n->maybeSchema(), "memory");
    return;
  }
  // The profiling executor leaves prim::profile nodes in front of every use; they
  // carry the observed types.  Fold them into the values so the predicate sees dtypes.
  torch::jit::RemoveProfileNodesAndSpecializeTypes(graph);
  torch::jit::EliminateDeadCode(graph);
  lower_for_export(graph);
  torch::jit::CustomFuseGraph(graph, is_supported, kGroup);
}

// State of one ort::CompilationGroup node, shared by every execution of it.
class GroupOp {
 public:
  explicit GroupOp(const Node* node)
      : subgraph_(node->g(torch::jit::attr::Subgraph)),
        n_inputs_(node->inputs().size()),
        n_outputs_(node->outputs().size()),
        name_("ort_group_" + std::to_string(g_group_counter++)) {}

  ~GroupOp() {
    // Leaked if Python is gone (see Callbacks).
    if (runner_ != nullptr && Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      delete runner_;
    }
  }

  void run(Stack& stack) {
    if (g_enabled.load()) {
      const char* why = needs_grad(stack);
      if (why == nullptr && run_on_ort(stack)) return;
      note_torch_run(why != nullptr ? why : "fallback");
    }
    run_in_torchscript(stack);
  }

 private:
  // A no-grad plan of the profiling executor is reused without a guard when inputs
  // later require grad.  ORT results carry no autograd history, so such calls run in
  // TorchScript, which records it.  (With grad profiled, the executor builds a
  // DifferentiableGraph and this pass fuses its forward and backward no-grad graphs.)
  const char* needs_grad(const Stack& stack) const {
    if (!at::GradMode::is_enabled()) return nullptr;
    for (size_t i = stack.size() - n_inputs_; i < stack.size(); ++i) {
      const auto& iv = stack[i];
      if (iv.isTensor() && iv.toTensor().requires_grad()) return "inputs require grad";
    }
    return nullptr;
  }

  bool run_on_ort(Stack& stack) {
    py::gil_scoped_acquire gil;
    // LazyTensor runs graphs on pool threads that have no Python thread state; without
    // this the state is created and destroyed on every call (tens of microseconds).
    static thread_local bool keep_thread_state = false;
    if (!keep_thread_state) {
      gil.inc_ref();
      keep_thread_state = true;
    }
    try {
      if (runner_ == nullptr) {
        py::object r = (*g_cb.factory)(prepare_for_export(subgraph_), name_);
        runner_ = new py::object(r.attr("run"));
      }
      py::list args(n_inputs_);
      const size_t base = stack.size() - n_inputs_;
      for (size_t i = 0; i < n_inputs_; ++i) {
        args[i] = torch::jit::toPyObject(stack[base + i]);
      }
      py::object result = (*runner_)(args);
      if (result.is_none()) return false;
      auto outs = result.cast<py::list>();
      TORCH_CHECK(outs.size() == n_outputs_, name_, ": runner returned ", outs.size(),
                  " outputs, expected ", n_outputs_);
      torch::jit::drop(stack, n_inputs_);
      for (auto o : outs) {
        stack.emplace_back(THPVariable_Unpack(o.ptr()));
      }
      return true;
    } catch (py::error_already_set& e) {
      // A debug-mode mismatch is the user's answer: raise it (TorchScript reports it as a
      // RuntimeError carrying the message).  The runner handles its own ORT failures;
      // anything else is reported and the group falls back to TorchScript.
      if (g_cb.fatal != nullptr && e.matches(*g_cb.fatal)) {
        throw std::runtime_error(e.what());
      }
      e.discard_as_unraisable(name_.c_str());
      return false;
    }
  }

  void note_torch_run(const char* reason) {
    if (g_cb.on_torch_run == nullptr) return;
    py::gil_scoped_acquire gil;
    try {
      (*g_cb.on_torch_run)(name_, reason);
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable(name_.c_str());
    }
  }

  void run_in_torchscript(Stack& stack) {
    std::call_once(code_once_, [this] {
      code_ = std::make_unique<torch::jit::Code>(subgraph_, name_);
    });
    torch::jit::InterpreterState(*code_).run(stack);
  }

  std::shared_ptr<Graph> subgraph_;
  size_t n_inputs_;
  size_t n_outputs_;
  std::string name_;
  py::object* runner_ = nullptr;  // guarded by the GIL
  std::once_flag code_once_;
  std::unique_ptr<torch::jit::Code> code_;
};

torch::jit::Operation make_group_op(const Node* node) {
  auto op = std::make_shared<GroupOp>(node);
  return [op](Stack& stack) { op->run(stack); };
}

// Registered once per process, when the module is first imported.
torch::jit::RegisterPass g_pass(fuse_pass);
torch::jit::RegisterOperators g_ops({torch::jit::Operator(
    kGroup, make_group_op, c10::AliasAnalysisKind::PURE_FUNCTION)});

// Parking PyTorch's OpenMP workers while ORT runs.
//
// After each parallel region an OpenMP worker busy-waits for the next one (libgomp: ~300k
// pause instructions, milliseconds); an ORT run started meanwhile shares its cores with those
// spinning workers and runs up to 1.3-1.9x slower. run_parked opens an OpenMP region on this
// thread (torch's team, when torch and this module share one OpenMP runtime) and parks the
// workers in it, blocked in a condition variable, for the run: their cores go to ORT.
//
// A worker that is asleep already (its spin ended) competes with nothing, and waking it would
// cost a wake-up the region then waits for (milliseconds on an idle virtual CPU): the workers'
// scheduler states are read first (/proc/self/task/<tid>/stat, descriptors kept open) and fn
// runs directly when none of them is running.

std::atomic<int> g_parked{0};  // threads waiting in run_parked now (for tests)

#ifdef _OPENMP
// This thread's OpenMP workers (each master thread has its own team), learned in a region.
struct Workers {
  std::vector<pid_t> tids;
  std::vector<int> stat_fds;  // /proc/self/task/<tid>/stat, one per worker
  ~Workers() { close_all(); }
  void close_all() {
    for (int fd : stat_fds) ::close(fd);
    stat_fds.clear();
    tids.clear();
  }
  void learn(const std::vector<pid_t>& seen) {
    if (seen == tids) return;
    close_all();
    for (pid_t tid : seen) {
      std::string path = "/proc/self/task/" + std::to_string(tid) + "/stat";
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {  // cannot watch them: always park
        close_all();
        return;
      }
      stat_fds.push_back(fd);
    }
    tids = seen;
  }
  // Whether some worker is running or runnable (state R), or it cannot be told.
  bool any_running() const {
    if (stat_fds.empty()) return true;
    char buf[512];
    for (int fd : stat_fds) {
      ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
      if (n <= 0) return true;
      buf[n] = '\0';
      const char* paren = std::strrchr(buf, ')');  // the name may hold spaces and parentheses
      if (paren == nullptr || paren[1] == '\0' || paren[2] == 'R') return true;
    }
    return false;
  }
};
thread_local Workers tl_workers;
#endif

// Calls fn(*args); returns whether the workers were parked for it.
bool run_parked(const py::function& fn, const py::args& args) {
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
  if (omp_in_parallel() || threads <= 1 ||
      (static_cast<int>(tl_workers.tids.size()) == threads - 1 && !tl_workers.any_running())) {
    fn(*args);
    return false;
  }
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  std::vector<pid_t> seen(threads, 0);
  // Only thread 0 (this thread, which holds the GIL) touches Python objects.
#pragma omp parallel
  {
    const int me = omp_get_thread_num();
    if (me == 0) {
      try {
        fn(*args);
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        done = true;
      }
      cv.notify_all();
    } else {
      if (me < threads) seen[me] = static_cast<pid_t>(::syscall(SYS_gettid));
      std::unique_lock<std::mutex> lock(mu);
      ++g_parked;
      cv.wait(lock, [&] { return done; });
      --g_parked;
    }
  }
  if (error) {
    std::rethrow_exception(error);
  }
  tl_workers.learn(std::vector<pid_t>(seen.begin() + 1, seen.end()));
  return true;
#else
  fn(*args);
  return false;
#endif
}

bool openmp_enabled() {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "TorchScript fusion pass and ort::CompilationGroup operator for ort-lazy";
  m.def(
      "install",
      [](py::object support, py::object factory, py::object on_torch_run, py::object fatal,
         py::object rejected) {
        // Replaced callables are leaked: a graph being optimized may still hold them.
        g_cb.support = new py::object(std::move(support));
        g_cb.factory = new py::object(std::move(factory));
        g_cb.on_torch_run = new py::object(std::move(on_torch_run));
        g_cb.fatal = new py::object(std::move(fatal));
        g_cb.rejected = rejected.is_none() ? nullptr : new py::object(std::move(rejected));
      },
      py::arg("support"), py::arg("factory"), py::arg("on_torch_run"), py::arg("fatal") = py::tuple(),
      py::arg("rejected") = py::none(),
      "Install the support predicate, the group runner factory, the fallback hook, the "
      "exception types a group run raises instead of falling back, and the hook told of "
      "aten nodes the fusion pass turns down before asking the predicate.");
  m.def("set_enabled", [](bool on) { g_enabled.store(on); },
        "Turn the fusion pass and ORT execution of groups on or off (process-wide).");
  m.def("is_enabled", [] { return g_enabled.load(); });
  m.def("push_pass_disabled", [] { ++tl_pass_disabled; },
        "Suspend the fusion pass on this thread (while exporting a group).");
  m.def("pop_pass_disabled", [] { --tl_pass_disabled; });
  m.def(
      "set_handle_special_scalars",
      [](bool on) { FLAGS_torch_lazy_handle_special_scalars = on; },
      "LazyTensor: emit 0/1 scalars (add's alpha) as constants, not device data.");
  m.def(
      "clear_lazy_computation_cache",
      [] { torch::lazy::LazyGraphExecutor::Get()->ClearComputationCache(); },
      "Drop LazyTensor's compiled graphs so the next steps are compiled (and fused) anew.");
  m.def("run_parked", &run_parked,
        "fn(*args) on this thread while this thread's other OpenMP threads (PyTorch's intra-op "
        "workers) wait blocked instead of spinning (when one of them is running); returns "
        "whether they were parked.");
  m.def("parked_threads", [] { return g_parked.load(); },
        "How many threads wait in run_parked now.");
  m.def("openmp_enabled", &openmp_enabled, "Whether the bridge was built with OpenMP.");
  m.def("group_symbol", [] { return kGroup.toQualString(); });
  m.attr("torch_version") = ORT_LAZY_STR(ORT_LAZY_TORCH_VERSION);  // torch.__version__ at build
}
