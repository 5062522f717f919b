// The benchmarks' raw cuBLASLt GEMM (see raw_cublaslt.hpp).
//
// Map of this file
//   1. loading: the library the process holds (or finds), every function looked up into Api
//   2. status checks, the device guard, per-(thread, device, stream) workspaces
//   3. Combination: descriptors, layouts and the heuristic's algorithm of one combination
//   4. Prepared, run(), library_description()
#include "raw_cublaslt.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

namespace raw_cublaslt {
namespace {

// ---------------------------------------------------------------- 1. loading

struct Api {
  std::string path;
  std::size_t version = 0;
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtGetVersion) get_version = nullptr;
  decltype(&cublasLtGetStatusName) status_name = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
};

const std::string kSoname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;  // as the engine

template <class Fn>
void load_symbol(void* library, const std::string& path, const char* name, Fn& out) {
  out = reinterpret_cast<Fn>(dlsym(library, name));
  if (out == nullptr)
    throw std::runtime_error("raw cuBLASLt: " + path + " has no symbol " + name +
                             "; the benchmarks need cuBLAS " + std::to_string(CUBLAS_VER_MAJOR) +
                             ".x (" + kSoname + ")");
}

Api load() {
  // The copy the process already holds (the engine's), so both sides of a comparison run one
  // library; then the one the user names; then the loader's search.
  void* library = dlopen(kSoname.c_str(), RTLD_NOW | RTLD_NOLOAD);
  std::string path = kSoname, tried;
  if (library == nullptr) {
    std::vector<std::string> candidates;
    if (const char* p = std::getenv("QRECIPE_CUBLASLT_LIBRARY"); p && *p) candidates.emplace_back(p);
    candidates.push_back(kSoname);
    for (const auto& candidate : candidates) {
      library = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (library) {
        path = candidate;
        break;
      }
      const char* err = dlerror();
      tried += "\n  " + candidate + ": " + (err ? err : "not found");
    }
  }
  if (library == nullptr)
    throw std::runtime_error("raw cuBLASLt: no " + kSoname + " is loaded and none could be "
                             "opened. Tried:" + tried + "\nRun a qrecipe GPU GEMM first (the "
                             "engine finds the library), add its lib folder to "
                             "LD_LIBRARY_PATH, or set QRECIPE_CUBLASLT_LIBRARY to its path");
  Api api;
  load_symbol(library, path, "cublasLtGetVersion", api.get_version);
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(api.get_version), &info) && info.dli_fname) path = info.dli_fname;
  api.path = path;
  load_symbol(library, path, "cublasLtCreate", api.create);
  load_symbol(library, path, "cublasLtDestroy", api.destroy);
  load_symbol(library, path, "cublasLtGetStatusName", api.status_name);
  load_symbol(library, path, "cublasLtMatmulDescCreate", api.desc_create);
  load_symbol(library, path, "cublasLtMatmulDescDestroy", api.desc_destroy);
  load_symbol(library, path, "cublasLtMatmulDescSetAttribute", api.desc_set);
  load_symbol(library, path, "cublasLtMatrixLayoutCreate", api.layout_create);
  load_symbol(library, path, "cublasLtMatrixLayoutDestroy", api.layout_destroy);
  load_symbol(library, path, "cublasLtMatmulPreferenceCreate", api.pref_create);
  load_symbol(library, path, "cublasLtMatmulPreferenceDestroy", api.pref_destroy);
  load_symbol(library, path, "cublasLtMatmulPreferenceSetAttribute", api.pref_set);
  load_symbol(library, path, "cublasLtMatmulAlgoGetHeuristic", api.heuristic);
  load_symbol(library, path, "cublasLtMatmul", api.matmul);
  api.version = api.get_version();
  if (static_cast<int>(api.version / 10000) != CUBLAS_VER_MAJOR)
    throw std::runtime_error("raw cuBLASLt: " + path + " is version " + std::to_string(api.version) +
                             " but the benchmarks were compiled against cuBLAS " +
                             std::to_string(CUBLAS_VER_MAJOR) + ".x headers");
  return api;  // the library stays loaded for the life of the process
}

const Api& api() {
  static std::mutex mutex;
  static std::unique_ptr<Api> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (!loaded) loaded = std::make_unique<Api>(load());
  return *loaded;
}

// ---------------------------------------------------------------- 2. checks, device, workspace

void check(cublasStatus_t status, const char* call, const std::string& what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw std::runtime_error(std::string("raw cuBLASLt: ") + call + " failed with " +
                           api().status_name(status) + " for " + what);
}

void check_cuda(cudaError_t status, const char* call, const std::string& what) {
  if (status == cudaSuccess) return;
  throw std::runtime_error(std::string("raw cuBLASLt: ") + call + " failed with " +
                           cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ") for " +
                           what);
}

// Makes `device` current for its lifetime (cudaSetDevice also makes the device's primary
// context current on this thread, which cuBLASLt needs), then restores the previous one.
class DeviceGuard {
 public:
  DeviceGuard(int device, const std::string& what) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice", what);
    check_cuda(cudaSetDevice(device), "cudaSetDevice", what);
  }
  ~DeviceGuard() { (void)cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

struct DeviceBuffer {
  void* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr) (void)cudaFree(ptr);
  }
};

// One workspace per (thread, device, stream), as the engine keeps them: two GEMMs that may run
// at once never share one. Kept until the thread exits.
void* workspace_for(int device, cudaStream_t stream, const std::string& what) {
  thread_local std::map<std::pair<int, cudaStream_t>, DeviceBuffer> workspaces;
  DeviceBuffer& w = workspaces[{device, stream}];
  if (w.ptr == nullptr) check_cuda(cudaMalloc(&w.ptr, kWorkspaceBytes), "cudaMalloc (workspace)", what);
  return w.ptr;
}

// One cuBLASLt handle per (thread, device), released when the thread exits (as the engine's).
cublasLtHandle_t handle_for(int device) {
  struct Owner {
    cublasLtHandle_t handle = nullptr;
    ~Owner() {
      if (handle) api().destroy(handle);
    }
  };
  thread_local std::map<int, Owner> handles;
  Owner& h = handles[device];
  if (h.handle == nullptr)
    check(api().create(&h.handle), "cublasLtCreate", "the handle of cuda:" + std::to_string(device));
  return h.handle;
}

// Largest power of two (<= 256) dividing the address: what the heuristic must assume.
std::uint32_t alignment(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

bool is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

const char* type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return "f32";
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_8F_E4M3: return "e4m3";
    case CUDA_R_8F_E5M2: return "e5m2";
    default: return "other";
  }
}

std::string describe(const Gemm& g) {
  std::ostringstream os;
  os << "raw TN GEMM " << type_name(g.a.type) << " [" << g.a.outer << "x" << g.k << "] x "
     << type_name(g.b.type) << " [" << g.b.outer << "x" << g.k << "] -> " << type_name(g.out_type)
     << (g.fast_accumulation ? ", fast accumulation" : "") << " on cuda:" << g.device;
  return os.str();
}

}  // namespace

// ---------------------------------------------------------------- 3. one combination

namespace detail {

// The cuBLASLt objects of one combination (shapes, types, scale modes, alignments), made once;
// launch() runs it on any buffers of that combination.
class Combination {
 public:
  explicit Combination(const Gemm& g) : what_(describe(g)) {
    if (g.a.data == nullptr || g.b.data == nullptr || g.out == nullptr || g.k <= 0 ||
        g.a.outer <= 0 || g.b.outer <= 0)
      throw std::runtime_error("raw cuBLASLt: " + what_ + ": every buffer must be set and every "
                               "extent positive");
    fp8_ = is_fp8(g.a.type) || is_fp8(g.b.type);
    if (fp8_ && (g.a.scale == nullptr || g.b.scale == nullptr))
      throw std::runtime_error("raw cuBLASLt: " + what_ + ": FP8 operands need their scales");
    const Api& lt = api();
    DeviceGuard guard(g.device, what_);
    check(lt.desc_create(&desc_.p, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate", what_);
    // cuBLAS A_c = our B (K x N stored, op T), B_c = our A (K x M stored, op N): the engine's TN.
    const cublasOperation_t op_a = CUBLAS_OP_T, op_b = CUBLAS_OP_N;
    set(CUBLASLT_MATMUL_DESC_TRANSA, op_a, "TRANSA");
    set(CUBLASLT_MATMUL_DESC_TRANSB, op_b, "TRANSB");
    if (fp8_) {
      const std::int8_t fast = g.fast_accumulation ? 1 : 0;
      set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast, "FAST_ACCUM");
      const std::int32_t mode_a = g.b.scale_mode, mode_b = g.a.scale_mode;
      set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode_a, "A_SCALE_MODE");
      set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode_b, "B_SCALE_MODE");
    }
    const std::uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, "EPILOGUE");
    set_scale_pointers(g);
    const auto m = static_cast<std::uint64_t>(g.b.outer), n = static_cast<std::uint64_t>(g.a.outer),
               k = static_cast<std::uint64_t>(g.k);
    check(lt.layout_create(&a_.p, g.b.type, k, m, g.k), "cublasLtMatrixLayoutCreate(A)", what_);
    check(lt.layout_create(&b_.p, g.a.type, k, n, g.k), "cublasLtMatrixLayoutCreate(B)", what_);
    check(lt.layout_create(&d_.p, g.out_type, m, n, g.b.outer), "cublasLtMatrixLayoutCreate(C/D)", what_);

    Owned<cublasLtMatmulPreference_t, PrefDestroy> pref;
    check(lt.pref_create(&pref.p), "cublasLtMatmulPreferenceCreate", what_);
    const std::uint64_t workspace = kWorkspaceBytes;
    check(lt.pref_set(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace),
          "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", what_);
    // In cuBLAS terms: A_c = our B, B_c = our A, C = D = out.
    const std::uint32_t align[4] = {alignment(g.b.data), alignment(g.a.data), alignment(g.out),
                                    alignment(g.out)};
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i)
      check(lt.pref_set(pref.p, align_attr[i], &align[i], sizeof align[i]),
            "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)", what_);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t s =
        lt.heuristic(handle_for(g.device), desc_.p, a_.p, b_.p, d_.p, d_.p, pref.p, 1, &result, &found);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE ||
        (s == CUBLAS_STATUS_SUCCESS && found == 0))
      throw Unsupported("raw cuBLASLt: no algorithm for " + what_ + " (" +
                        (s == CUBLAS_STATUS_SUCCESS ? std::string("none found") : lt.status_name(s)) +
                        ")");
    check(s, "cublasLtMatmulAlgoGetHeuristic", what_);
    check(result.state, "cublasLtMatmulAlgoGetHeuristic (result state)", what_);
    algo_ = result.algo;
  }

  // Enqueues the combination on g's buffers (of this combination) on `stream`.
  void launch(const Gemm& g, cudaStream_t stream) {
    const Api& lt = api();
    DeviceGuard guard(g.device, what_);
    set_scale_pointers(g);
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t s =
        lt.matmul(handle_for(g.device), desc_.p, &alpha, g.b.data, a_.p, g.a.data, b_.p, &beta, g.out,
                  d_.p, g.out, d_.p, &algo_, workspace_for(g.device, stream, what_), kWorkspaceBytes,
                  stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED && !verified_)
      throw Unsupported(std::string("raw cuBLASLt: cublasLtMatmul answered ") + lt.status_name(s) +
                        " for " + what_);
    check(s, "cublasLtMatmul", what_);
    verified_ = true;
  }

 private:
  // RAII owners of the cuBLASLt objects (destroyed on every path, construction failures
  // included).
  struct DescDestroy {
    void operator()(cublasLtMatmulDesc_t p) const { api().desc_destroy(p); }
  };
  struct LayoutDestroy {
    void operator()(cublasLtMatrixLayout_t p) const { api().layout_destroy(p); }
  };
  struct PrefDestroy {
    void operator()(cublasLtMatmulPreference_t p) const { api().pref_destroy(p); }
  };
  template <class T, class Destroy>
  struct Owned {
    T p = nullptr;
    Owned() = default;
    Owned(const Owned&) = delete;
    Owned& operator=(const Owned&) = delete;
    ~Owned() {
      if (p) Destroy{}(p);
    }
  };

  template <class T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& value, const char* name) {
    check(api().desc_set(desc_.p, attr, &value, sizeof value),
          (std::string("cublasLtMatmulDescSetAttribute(") + name + ")").c_str(), what_);
  }

  // The scale pointers change from call to call (the data pointers go to cublasLtMatmul).
  void set_scale_pointers(const Gemm& g) {
    if (!fp8_) return;
    set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, g.b.scale, "A_SCALE_POINTER");
    set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, g.a.scale, "B_SCALE_POINTER");
  }

  std::string what_;
  bool fp8_ = false;
  bool verified_ = false;  // ran once: a later NOT_SUPPORTED is an error, not an answer
  Owned<cublasLtMatmulDesc_t, DescDestroy> desc_;
  Owned<cublasLtMatrixLayout_t, LayoutDestroy> a_, b_, d_;
  cublasLtMatmulAlgo_t algo_{};
};

}  // namespace detail

// ---------------------------------------------------------------- 4. entries

Prepared::Prepared(const Gemm& gemm) : gemm_(gemm), combination_(std::make_unique<detail::Combination>(gemm)) {}
Prepared::~Prepared() = default;
void Prepared::run(cudaStream_t stream) const { combination_->launch(gemm_, stream); }

void run(const Gemm& g, cudaStream_t stream) {
  // Everything the heuristic's choice depends on (the pointers only through their alignment).
  using Key = std::tuple<int, int, std::int64_t, int, bool, std::uint32_t, int, std::int64_t, int,
                         bool, std::uint32_t, std::int64_t, int, std::uint32_t, bool>;
  const Key key{g.device,
                g.a.type, g.a.outer, g.a.scale_mode, g.a.scale != nullptr, alignment(g.a.data),
                g.b.type, g.b.outer, g.b.scale_mode, g.b.scale != nullptr, alignment(g.b.data),
                g.k, g.out_type, alignment(g.out), g.fast_accumulation};
  thread_local std::map<Key, std::unique_ptr<detail::Combination>> prepared;
  auto it = prepared.find(key);
  if (it == prepared.end()) it = prepared.emplace(key, std::make_unique<detail::Combination>(g)).first;
  it->second->launch(g, stream);
}

std::string library_description() {
  const Api& lt = api();
  return lt.path + " (cuBLASLt " + std::to_string(lt.version) + ")";
}

}  // namespace raw_cublaslt
