// The cuDNN path (cuda/cudnn_sdpa.h): cuDNN's SDPA graph through the cuDNN frontend (header-only, PyPI's
// nvidia-cudnn-frontend), with the library loaded at run time. Compiled where the CUDA backend is built and the
// frontend's headers were found (ATTN_HAVE_CUDNN).
//
// One graph per shape (a key of everything the graph depends on: sizes, strides, dtype, mask, scale, device),
// built on first use and kept (up to kMaxPlans per device), as FlashInfer and PyTorch keep theirs; what varies
// per call (the tensors' addresses, key lengths, page tables) is in the variant pack. One cuDNN handle per
// device; calls on a device are serialised by a mutex (a handle's stream is per handle).
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <cuda_runtime_api.h>
#include <cudnn_frontend.h>

#include "core/backward_problem.h"
#include "core/problem.h"
#include "cuda/cudnn_sdpa.h"
#include "cuda/runtime.h"
#include "cuda/scratch.h"

namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;  // the frontend's calls into cuDNN go through this (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)
}  // namespace cudnn_frontend

namespace attn::cuda::cudnn {
namespace fe = cudnn_frontend;
namespace {

using i64 = std::int64_t;

enum Uid : i64 { kQ = 1, kK, kV, kO, kStats, kSeqQ, kSeqKv, kPageK, kPageV, kDO, kDQ, kDK, kDV };

// The library, loaded once: $ATTN_CUDNN_LIBRARY, else libcudnn.so.9 from the loader's path (the toolkit's, or
// PyPI's nvidia-cudnn-cu13 where LD_LIBRARY_PATH names it).
struct Library {
  bool loaded = false;
  std::string error;
  std::string version;
};

const Library& library() {
  static const Library lib = [] {
    Library l;
    const char* env = std::getenv("ATTN_CUDNN_LIBRARY");
    const char* name = env && *env ? env : "libcudnn.so.9";
    void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* why = dlerror();
      l.error = std::string("cuDNN is not available (dlopen ") + name + ": " + (why ? why : "failed") +
                "; set ATTN_CUDNN_LIBRARY or LD_LIBRARY_PATH)";
      return l;
    }
    fe::cudnn_dlhandle = h;
    try {
      const std::size_t v = fe::detail::get_backend_version();
      l.version = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
      if (v < 90000) {
        l.error = "cuDNN " + l.version + " is too old; expected 9.0 or later";
        return l;
      }
    } catch (const std::exception& e) {
      l.error = std::string("cuDNN is not usable (") + e.what() + ")";
      return l;
    }
    l.loaded = true;
    return l;
  }();
  return lib;
}

Status refused(const std::string& what) { return Status::Unsupported("backend", "cudnn: " + what); }

Status cuda_failed(cudaError_t e, const char* what) {
  return refused(std::string(what) + " failed (" + cudaGetErrorName(e) + ": " + cudaGetErrorString(e) + ")");
}

// Restores the calling thread's device on the way out.
struct DeviceScope {
  int previous = 0;
  cudaError_t error;
  explicit DeviceScope(int device) {
    (void)cudaGetDevice(&previous);
    error = cudaSetDevice(device);
  }
  ~DeviceScope() { (void)cudaSetDevice(previous); }
};

// A graph and what executing it needs.
struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  i64 workspace = 0;
  Status status;  // cuDNN's refusal, kept so that a refused shape is not built again
};

constexpr std::size_t kMaxPlans = 512;  // graphs kept per device

// Per device: the handle, the kept graphs, and the lock that serialises their use.
struct DeviceState {
  std::mutex mutex;
  cudnnHandle_t handle = nullptr;
  Status handle_status;
  std::map<std::string, Plan> plans;
};

DeviceState& state(int device) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<DeviceState>> states;
  const std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<DeviceState>& s = states[device];
  if (!s) s = std::make_unique<DeviceState>();
  return *s;
}

// The handle of the state's device (created on first use; the calling thread's device is that device).
Status handle(DeviceState& s) {
  if (s.handle != nullptr) return Status::Ok();
  if (!s.handle_status.ok()) return s.handle_status;
  const cudnnStatus_t st = fe::detail::create_handle(&s.handle);
  if (st != CUDNN_STATUS_SUCCESS) {
    s.handle = nullptr;
    s.handle_status = refused(std::string("cudnnCreate failed (") + fe::detail::get_error_string(st) + ")");
    return s.handle_status;
  }
  return Status::Ok();
}

fe::DataType_t io_type(DType t) { return t == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF; }

std::vector<i64> dims(i64 a, i64 b, i64 c, i64 d) { return {a, b, c, d}; }
std::vector<i64> strides(const core::Strided& t) { return {t.stride[0], t.stride[1], t.stride[2], t.stride[3]}; }

// Every key length is Skv: no padding mask (and no key-length tensors) unless the K/V are paged, which cuDNN reads
// only with one.
bool padded(const core::Problem& p) {
  if (p.paged) return true;
  for (const i64 n : p.kv_len)
    if (n != p.Skv) return true;
  return false;
}

// Bottom-right causal with one query per sequence is no mask (cudnn_rules.cc: every length is >= 1); over a square
// score matrix (Sq = Skv, no key lengths) it is the top-left mask, which cuDNN's engines handle best.
Causal causal_of(const core::Problem& p) {
  if (p.causal != Causal::bottom_right) return p.causal;
  if (p.Sq == 1) return Causal::none;
  return p.Sq == p.Skv && !padded(p) ? Causal::top_left : Causal::bottom_right;
}

std::string key_of(const core::Problem& p, bool backward, const core::BackwardProblem* bp) {
  std::string k = backward ? "bwd" : "fwd";
  const auto add = [&](i64 v) { k += ',' + std::to_string(v); };
  const auto add_strides = [&](const core::Strided& t) {
    for (const i64 s : t.stride) add(s);
  };
  add(p.device.index);
  add(static_cast<i64>(p.q.dtype));
  for (const i64 v : {p.B, p.Hq, p.Hkv, p.Sq, p.Skv, p.Dk, p.Dv}) add(v);
  add(static_cast<i64>(causal_of(p)));
  add(padded(p));
  std::uint64_t scale_bits;
  std::memcpy(&scale_bits, &p.scale, sizeof scale_bits);
  k += ',' + std::to_string(scale_bits);
  add_strides(p.q), add_strides(p.k), add_strides(p.v), add_strides(p.out);
  add(p.lse.has_value());
  if (p.paged) add(p.paged->page_size), add(p.paged->pages), add(p.paged->table_stride[0]);
  if (bp) add_strides(bp->dout), add_strides(bp->dq), add_strides(bp->dk), add_strides(bp->dv);
  return k;
}

// The inputs both graphs share: Q, K, V (paged: the page pools and their tables), the key lengths.
struct Inputs {
  std::shared_ptr<fe::graph::Tensor_attributes> q, k, v, seq_q, seq_kv, page_k, page_v;
};

Inputs add_inputs(fe::graph::Graph& g, const core::Problem& p) {
  Inputs in;
  in.q = g.tensor(fe::graph::Tensor_attributes().set_name("Q").set_uid(kQ).set_dim(dims(p.B, p.Hq, p.Sq, p.Dk)).set_stride(strides(p.q)));
  if (p.paged) {
    const i64 pages = p.paged->pages, ps = p.paged->page_size, width = p.Skv / ps;
    in.k = g.tensor(fe::graph::Tensor_attributes().set_name("K").set_uid(kK).set_dim(dims(pages, p.Hkv, ps, p.Dk)).set_stride(strides(p.k)));
    in.v = g.tensor(fe::graph::Tensor_attributes().set_name("V").set_uid(kV).set_dim(dims(pages, p.Hkv, ps, p.Dv)).set_stride(strides(p.v)));
    const std::vector<i64> table_strides{p.paged->table_stride[0], p.paged->table_stride[0], 1, 1};
    in.page_k = g.tensor(fe::graph::Tensor_attributes().set_name("page_table_k").set_uid(kPageK)
                             .set_dim(dims(p.B, 1, width, 1)).set_stride(table_strides).set_data_type(fe::DataType_t::INT32));
    in.page_v = g.tensor(fe::graph::Tensor_attributes().set_name("page_table_v").set_uid(kPageV)
                             .set_dim(dims(p.B, 1, width, 1)).set_stride(table_strides).set_data_type(fe::DataType_t::INT32));
  } else {
    in.k = g.tensor(fe::graph::Tensor_attributes().set_name("K").set_uid(kK).set_dim(dims(p.B, p.Hkv, p.Skv, p.Dk)).set_stride(strides(p.k)));
    in.v = g.tensor(fe::graph::Tensor_attributes().set_name("V").set_uid(kV).set_dim(dims(p.B, p.Hkv, p.Skv, p.Dv)).set_stride(strides(p.v)));
  }
  if (padded(p)) {
    in.seq_q = g.tensor(fe::graph::Tensor_attributes().set_name("seq_q").set_uid(kSeqQ).set_dim(dims(p.B, 1, 1, 1))
                            .set_stride({1, 1, 1, 1}).set_data_type(fe::DataType_t::INT32));
    in.seq_kv = g.tensor(fe::graph::Tensor_attributes().set_name("seq_kv").set_uid(kSeqKv).set_dim(dims(p.B, 1, 1, 1))
                             .set_stride({1, 1, 1, 1}).set_data_type(fe::DataType_t::INT32));
  }
  return in;
}

// The masks both graphs share.
template <class Attributes>
void set_masks(Attributes& a, const core::Problem& p, const Inputs& in) {
  a.set_attn_scale(static_cast<float>(p.scale));
  const Causal c = causal_of(p);
  if (c == Causal::top_left) a.set_causal_mask(true);
  if (c == Causal::bottom_right) a.set_causal_mask_bottom_right(true);
  if (in.seq_q) a.set_padding_mask(true).set_seq_len_q(in.seq_q).set_seq_len_kv(in.seq_kv);
}

Status finish(fe::graph::Graph& g, cudnnHandle_t h, Plan* plan) {
  const auto check = [&](fe::error_t e, const char* step) {
    return e.is_good() ? Status::Ok() : refused(std::string(step) + ": " + e.get_message());
  };
  if (Status s = check(g.validate(), "validate"); !s) return s;
  if (Status s = check(g.build_operation_graph(h), "build_operation_graph"); !s) return s;
  if (Status s = check(g.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans"); !s) return s;
  if (Status s = check(g.check_support(), "check_support"); !s) return s;
  if (Status s = check(g.build_plans(), "build_plans"); !s) return s;
  if (Status s = check(g.get_workspace_size(plan->workspace), "get_workspace_size"); !s) return s;
  return Status::Ok();
}

// A graph in p's I/O dtype computing in fp32.
std::shared_ptr<fe::graph::Graph> new_graph(const core::Problem& p) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(io_type(p.q.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

Status build_forward(const core::Problem& p, cudnnHandle_t h, Plan* plan) {
  auto g = new_graph(p);
  const Inputs in = add_inputs(*g, p);
  auto a = fe::graph::SDPA_attributes().set_name("attn_sdpa").set_generate_stats(p.lse.has_value());
  set_masks(a, p, in);
  if (p.paged)
    a.set_paged_attention_k_table(in.page_k).set_paged_attention_v_table(in.page_v)
        .set_paged_attention_max_seq_len_kv(static_cast<int>(p.Skv));
  auto [o, stats] = g->sdpa(in.q, in.k, in.v, a);
  o->set_output(true).set_uid(kO).set_dim(dims(p.B, p.Hq, p.Sq, p.Dv)).set_stride(strides(p.out));
  if (p.lse)
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(dims(p.B, p.Hq, p.Sq, 1))
        .set_stride({p.Hq * p.Sq, p.Sq, 1, 1});
  if (Status s = finish(*g, h, plan); !s) return s;
  plan->graph = std::move(g);
  return Status::Ok();
}

Status build_backward(const core::BackwardProblem& bp, cudnnHandle_t h, Plan* plan) {
  const core::Problem& p = bp.fwd;
  auto g = new_graph(p);
  const Inputs in = add_inputs(*g, p);
  auto o = g->tensor(fe::graph::Tensor_attributes().set_name("O").set_uid(kO).set_dim(dims(p.B, p.Hq, p.Sq, p.Dv)).set_stride(strides(p.out)));
  auto dout = g->tensor(fe::graph::Tensor_attributes().set_name("dO").set_uid(kDO).set_dim(dims(p.B, p.Hq, p.Sq, p.Dv)).set_stride(strides(bp.dout)));
  auto stats = g->tensor(fe::graph::Tensor_attributes().set_name("stats").set_uid(kStats).set_dim(dims(p.B, p.Hq, p.Sq, 1))
                             .set_stride({p.Hq * p.Sq, p.Sq, 1, 1}).set_data_type(fe::DataType_t::FLOAT));
  auto a = fe::graph::SDPA_backward_attributes().set_name("attn_sdpa_backward").set_deterministic_algorithm(true);
  set_masks(a, p, in);
  auto [dq, dk, dv] = g->sdpa_backward(in.q, in.k, in.v, o, dout, stats, a);
  dq->set_output(true).set_uid(kDQ).set_dim(dims(p.B, p.Hq, p.Sq, p.Dk)).set_stride(strides(bp.dq));
  dk->set_output(true).set_uid(kDK).set_dim(dims(p.B, p.Hkv, p.Skv, p.Dk)).set_stride(strides(bp.dk));
  dv->set_output(true).set_uid(kDV).set_dim(dims(p.B, p.Hkv, p.Skv, p.Dv)).set_stride(strides(bp.dv));
  if (Status s = finish(*g, h, plan); !s) return s;
  plan->graph = std::move(g);
  return Status::Ok();
}

// The plan for (p, bp), built on first use; the caller holds the device's lock and is on its device.
template <class Build>
Status plan_for(DeviceState& s, const std::string& key, Build&& build, const Plan** out) {
  auto it = s.plans.find(key);
  if (it == s.plans.end()) {
    // Bounded: a server whose calls bring ever new shapes (prefill lengths) would otherwise keep every graph.
    // Past kMaxPlans the kept graphs are dropped and rebuilt as they are asked for again.
    if (s.plans.size() >= kMaxPlans) s.plans.clear();
    Plan plan;
    if (Status st = handle(s); !st) return st;
    try {
      plan.status = build(s.handle, &plan);
    } catch (const std::exception& e) {
      plan.status = refused(std::string("the graph could not be built (") + e.what() + ")");
    }
    if (!plan.status.ok()) plan.graph.reset();
    it = s.plans.emplace(key, std::move(plan)).first;
  }
  *out = &it->second;
  return it->second.status;
}

Status ready() {
  if (Status s = require_device(); !s) return s;
  const Library& lib = library();
  if (!lib.loaded) return refused(lib.error);
  return Status::Ok();
}

// Executes `plan` on p's stream with the pointers of `pack`, the key lengths (and page tables) added, and the
// workspace from attn's pool.
Status execute(DeviceState& s, const core::Problem& p, const Plan& plan, std::unordered_map<i64, void*>& pack) {
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const int dev = p.device.index;
  const cudnnStatus_t st = fe::detail::set_stream(s.handle, stream);
  if (st != CUDNN_STATUS_SUCCESS) return refused(std::string("cudnnSetStream failed (") + fe::detail::get_error_string(st) + ")");
  // Scratch: the workspace, then the key lengths as int32 (query lengths Sq, key lengths kv_len).
  const bool pad = padded(p);
  const std::size_t ws = static_cast<std::size_t>((plan.workspace + 255) / 256 * 256);
  const std::size_t lens = pad ? static_cast<std::size_t>(2 * p.B) * sizeof(std::int32_t) : 0;
  void* scratch = nullptr;
  if (ws + lens > 0)
    if (cudaError_t e = scratch_alloc(&scratch, ws + lens, dev, stream); e != cudaSuccess)
      return cuda_failed(e, "the workspace's allocation");
  cudaError_t e = cudaSuccess;
  if (pad) {
    std::vector<std::int32_t> host(static_cast<std::size_t>(2 * p.B));
    for (i64 b = 0; b < p.B; ++b) {
      host[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(p.Sq);
      host[static_cast<std::size_t>(p.B + b)] = static_cast<std::int32_t>(p.kv_len[static_cast<std::size_t>(b)]);
    }
    auto* dev_lens = reinterpret_cast<std::int32_t*>(static_cast<char*>(scratch) + ws);
    e = cudaMemcpyAsync(dev_lens, host.data(), lens, cudaMemcpyHostToDevice, stream);
    pack[kSeqQ] = dev_lens;
    pack[kSeqKv] = dev_lens + p.B;
  }
  if (p.paged) {
    pack[kPageK] = const_cast<std::int32_t*>(p.paged->table);
    pack[kPageV] = const_cast<std::int32_t*>(p.paged->table);
  }
  Status result = Status::Ok();
  if (e != cudaSuccess) {
    result = cuda_failed(e, "the key lengths' copy");
  } else {
    fe::error_t run = plan.graph->execute(s.handle, pack, ws > 0 ? scratch : nullptr);
    if (!run.is_good()) result = refused("execute: " + run.get_message());
  }
  if (scratch)
    if (cudaError_t f = cudaFreeAsync(scratch, stream); f != cudaSuccess && result.ok())
      result = cuda_failed(f, "the workspace's release");
  return result;
}

void* ptr(const core::Strided& t) { return const_cast<void*>(t.data); }

// The one way in: cuDNN loaded, p's device current and its state locked, the graph of p (the backward's when bp
// is given) built or found; then f(state, plan).
template <class F>
Status with_plan(const core::Problem& p, const core::BackwardProblem* bp, F&& f) {
  if (Status s = ready(); !s) return s;
  DeviceState& s = state(p.device.index);
  const std::lock_guard<std::mutex> lock(s.mutex);
  DeviceScope scope(p.device.index);
  if (scope.error != cudaSuccess) return cuda_failed(scope.error, "cudaSetDevice");
  const Plan* plan = nullptr;
  const Status st = plan_for(s, key_of(p, bp != nullptr, bp), [&](cudnnHandle_t h, Plan* out) {
    return bp ? build_backward(*bp, h, out) : build_forward(p, h, out);
  }, &plan);
  if (!st) return st;
  return f(s, *plan);
}

}  // namespace

std::string version() {
  const Library& lib = library();
  return lib.loaded ? lib.version : lib.error;
}

Status prepare(const core::Problem& p, i64* workspace_bytes) {
  *workspace_bytes = 0;
  return with_plan(p, nullptr, [&](DeviceState&, const Plan& plan) {
    *workspace_bytes = plan.workspace;
    return Status::Ok();
  });
}

Status prepare_backward(const core::BackwardProblem& bp, i64* workspace_bytes) {
  *workspace_bytes = 0;
  return with_plan(bp.fwd, &bp, [&](DeviceState&, const Plan& plan) {
    *workspace_bytes = plan.workspace;
    return Status::Ok();
  });
}

Status run(const core::Problem& p) {
  if (p.B * p.Hq * p.Sq == 0) return ready();
  return with_plan(p, nullptr, [&](DeviceState& s, const Plan& plan) {
    std::unordered_map<i64, void*> pack{{kQ, ptr(p.q)}, {kK, ptr(p.k)}, {kV, ptr(p.v)}, {kO, ptr(p.out)}};
    if (p.lse) pack[kStats] = ptr(*p.lse);
    return execute(s, p, plan, pack);
  });
}

Status run_backward(const core::BackwardProblem& bp) {
  const core::Problem& p = bp.fwd;
  if (p.B * p.Hq * p.Sq == 0 && p.B * p.Hkv * p.Skv == 0) return ready();
  return with_plan(p, &bp, [&](DeviceState& s, const Plan& plan) {
    std::unordered_map<i64, void*> pack{{kQ, ptr(p.q)},       {kK, ptr(p.k)},       {kV, ptr(p.v)},
                                        {kO, ptr(p.out)},     {kStats, ptr(*p.lse)}, {kDO, ptr(bp.dout)},
                                        {kDQ, ptr(bp.dq)},    {kDK, ptr(bp.dk)},    {kDV, ptr(bp.dv)}};
    return execute(s, p, plan, pack);
  });
}

}  // namespace attn::cuda::cudnn
