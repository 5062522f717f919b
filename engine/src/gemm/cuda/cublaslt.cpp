// Lazy cuBLASLt: the function table, per-thread handles, workspaces and prepared GEMMs
// (see cublaslt.hpp).
//
// Map of this file
//   1. loading: candidate paths, dlopen, dlsym of every function into Api, version check
//   2. status checks and names for messages
//   3. RAII owners of cuBLASLt descriptors; per-thread handles and workspaces
//   4. prepared GEMMs: the cache key, descriptor setup, the heuristic
//   5. matmul()
#include "gemm/cuda/cublaslt.hpp"

#include <dlfcn.h>

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "qrecipe/cuda.hpp"
#include "qrecipe/error.hpp"
#include "qrecipe/tensor.hpp"

namespace qrecipe::cublaslt {
namespace {

// ---------------------------------------------------------------- 1. loading

// Every cuBLASLt function the engine calls. The types come from the header; the symbols are
// never referenced directly, so libqrecipe has no link-time dependency on libcublasLt.
struct Api {
  std::string path;
  std::size_t version = 0;
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtGetVersion) get_version = nullptr;
  decltype(&cublasLtGetStatusName) status_name = nullptr;
  decltype(&cublasLtGetStatusString) status_string = nullptr;
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

const char* const kLibraryName = "libcublasLt.so.13";

std::vector<std::string> candidate_paths() {
  std::vector<std::string> paths;
  if (const char* explicit_path = std::getenv("QRECIPE_CUBLASLT_LIBRARY"); explicit_path && *explicit_path)
    paths.emplace_back(explicit_path);
  paths.emplace_back(kLibraryName);  // the dynamic loader's own search
#if defined(QRECIPE_CUBLASLT_INCLUDE_DIR)
  // Beside the headers this build was configured with: <toolkit>/include -> <toolkit>/lib64,
  // <site-packages>/nvidia/cu13/include -> .../cu13/lib.
  for (const char* sub : {"/../lib/", "/../lib64/"})
    paths.push_back(std::string(QRECIPE_CUBLASLT_INCLUDE_DIR) + sub + kLibraryName);
#endif
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* root = std::getenv(var); root && *root)
      paths.push_back(std::string(root) + "/lib64/" + kLibraryName);
  for (const char* dir : {"/usr/local/cuda/lib64/", "/usr/local/cuda/targets/x86_64-linux/lib/"})
    paths.push_back(std::string(dir) + kLibraryName);
  return paths;
}

template <class Fn>
void load_symbol(void* library, const std::string& path, const char* name, Fn& out) {
  dlerror();  // clear any earlier error
  void* symbol = dlsym(library, name);
  const char* err = dlerror();
  QR_CHECK_CODE(symbol != nullptr && err == nullptr, QR_STATUS_UNSUPPORTED, "cuBLASLt library ",
                path, " has no symbol ", name, " (", err ? err : "null", "); qrecipe needs cuBLAS ",
                kExpectedMajor, ".x: point QRECIPE_CUBLASLT_LIBRARY at a ", kLibraryName,
                " from CUDA ", kExpectedMajor, " (toolkit or the nvidia-cublas wheel)");
  out = reinterpret_cast<Fn>(symbol);
}

Api load() {
  std::string tried;
  void* library = nullptr;
  std::string path;
  for (const auto& candidate : candidate_paths()) {
    library = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library) {
      path = candidate;
      break;
    }
    const char* err = dlerror();
    tried += "\n  " + candidate + ": " + (err ? err : "not found");
  }
  QR_CHECK_CODE(library != nullptr, QR_STATUS_UNSUPPORTED, "GPU GEMMs need cuBLASLt (", kLibraryName,
                ", cuBLAS ", kExpectedMajor, ".x as shipped with CUDA ", kExpectedMajor,
                "; this build was compiled against cuBLAS ", CUBLAS_VER_MAJOR, ".", CUBLAS_VER_MINOR,
                " headers) and none could be loaded. Tried:", tried,
                "\nInstall the CUDA ", kExpectedMajor, " toolkit or `pip install nvidia-cublas`, add its "
                "lib folder to LD_LIBRARY_PATH, or set QRECIPE_CUBLASLT_LIBRARY to the library's path");
  // Resolved with realpath-like detail for messages: where dlopen actually found it.
  if (path == kLibraryName) {
    Dl_info info{};
    void* any = dlsym(library, "cublasLtGetVersion");
    if (any && dladdr(any, &info) && info.dli_fname) path = info.dli_fname;
  }
  Api api;
  api.path = path;
  load_symbol(library, path, "cublasLtCreate", api.create);
  load_symbol(library, path, "cublasLtDestroy", api.destroy);
  load_symbol(library, path, "cublasLtGetVersion", api.get_version);
  load_symbol(library, path, "cublasLtGetStatusName", api.status_name);
  load_symbol(library, path, "cublasLtGetStatusString", api.status_string);
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
  // cublasLtGetVersion() is major * 10000 + minor * 100 + patch (130100 for 13.1.0).
  QR_CHECK_CODE(static_cast<int>(api.version / 10000) == kExpectedMajor, QR_STATUS_UNSUPPORTED,
                "cuBLASLt at ", path, " is version ", api.version, " but this build of qrecipe "
                "needs cuBLAS ", kExpectedMajor, ".x (compiled against ", CUBLAS_VER_MAJOR, ".",
                CUBLAS_VER_MINOR, " headers); point QRECIPE_CUBLASLT_LIBRARY at a ", kLibraryName);
  // The library stays loaded for the life of the process (handles and algorithms refer to it).
  return api;
}

// Loaded once per process; a failed load throws and is retried by the next call.
const Api& api() {
  static std::mutex mutex;
  static std::unique_ptr<Api> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (!loaded) loaded = std::make_unique<Api>(load());
  return *loaded;
}

// ---------------------------------------------------------------- 2. status checks

std::string status_text(const Api& lt, cublasStatus_t status) {
  return std::string(lt.status_name(status)) + " (" + lt.status_string(status) + ")";
}

void check(const Api& lt, cublasStatus_t status, const char* call, const std::string& what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  QR_THROW_CODE(QR_STATUS_DEVICE_ERROR, "cuBLASLt call ", call, " failed with ",
                status_text(lt, status), " for ", what, " (library ", lt.path, ", version ",
                lt.version, "). An earlier asynchronous CUDA error also surfaces here: rerun with "
                "CUDA_LAUNCH_BLOCKING=1 to find it");
}

// ---------------------------------------------------------------- 3. owners, handles, workspaces

struct DescOwner {
  cublasLtMatmulDesc_t desc = nullptr;
  ~DescOwner() {
    if (desc) api().desc_destroy(desc);
  }
};
struct LayoutOwner {
  cublasLtMatrixLayout_t layout = nullptr;
  ~LayoutOwner() {
    if (layout) api().layout_destroy(layout);
  }
};
struct PrefOwner {
  cublasLtMatmulPreference_t pref = nullptr;
  ~PrefOwner() {
    if (pref) api().pref_destroy(pref);
  }
};

// One cuBLASLt handle per (thread, device). Handles are cheap to keep and are released when
// the thread exits.
struct HandleOwner {
  cublasLtHandle_t handle = nullptr;
  ~HandleOwner() {
    if (handle) api().destroy(handle);
  }
};

cublasLtHandle_t handle_for(const Api& lt, int device) {
  thread_local std::map<int, HandleOwner> handles;
  HandleOwner& h = handles[device];
  if (!h.handle)
    check(lt, lt.create(&h.handle), "cublasLtCreate", "the handle of cuda:" + std::to_string(device));
  return h.handle;
}

// One workspace per (thread, device, stream): two GEMMs that may run at once never share one.
void* workspace_for(int device, void* stream) {
  thread_local std::map<std::pair<int, void*>, Buffer> workspaces;
  auto it = workspaces.find({device, stream});
  if (it == workspaces.end())
    it = workspaces
             .emplace(std::make_pair(device, stream),
                      Buffer(cuda_allocator(), kWorkspaceBytes, Device::cuda(device)))
             .first;
  return it->second.data();
}

// ---------------------------------------------------------------- 4. prepared GEMMs

// Largest power of two (<= 256) dividing the address: what the heuristic must assume.
std::uint32_t alignment(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

// Everything the heuristic's choice depends on.
struct Key {
  int device;
  int a_type, a_op, a_scale_mode, a_has_scale;
  std::int64_t a_rows, a_cols, a_ld;
  int b_type, b_op, b_scale_mode, b_has_scale;
  std::int64_t b_rows, b_cols, b_ld;
  int d_type;
  std::int64_t m, n, k, ldd;
  int bias, bias_type, fast_accumulation, device_scalars;
  std::uint32_t align_a, align_b, align_d, align_bias;
  auto operator<=>(const Key&) const = default;
};

Key make_key(const MatmulArgs& x) {
  return Key{x.device,
             static_cast<int>(x.a.type), static_cast<int>(x.a.op), static_cast<int>(x.a.scale_mode),
             x.a.scale != nullptr, x.a.rows, x.a.cols, x.a.ld,
             static_cast<int>(x.b.type), static_cast<int>(x.b.op), static_cast<int>(x.b.scale_mode),
             x.b.scale != nullptr, x.b.rows, x.b.cols, x.b.ld,
             static_cast<int>(x.d_type), x.m, x.n, x.k, x.ldd,
             x.bias != nullptr, static_cast<int>(x.bias_type), x.fast_accumulation, x.device_scalars != nullptr,
             alignment(x.a.data), alignment(x.b.data), alignment(x.d),
             x.bias ? alignment(x.bias) : 256u};
}

struct Prepared {
  bool supported = false;
  bool verified = false;  // ran once: a later NOT_SUPPORTED is an error, not an answer
  std::string unsupported_status;
  DescOwner desc;
  LayoutOwner a, b, d;
  cublasLtMatmulAlgo_t algo{};
};

bool is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

template <class T>
void set_desc(const Api& lt, cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
              const T& value, const char* attr_name, const std::string& what) {
  const cublasStatus_t s = lt.desc_set(desc, attr, &value, sizeof(value));
  if (s != CUBLAS_STATUS_SUCCESS)
    check(lt, s, (std::string("cublasLtMatmulDescSetAttribute(") + attr_name + ")").c_str(), what);
}

// The pointers that change from call to call (the heuristic also reads them, for alignment).
void set_pointers(const Api& lt, const Prepared& p, const MatmulArgs& x, const std::string& what) {
  if (x.a.scale)
    set_desc(lt, p.desc.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, x.a.scale,
             "CUBLASLT_MATMUL_DESC_A_SCALE_POINTER", what);
  if (x.b.scale)
    set_desc(lt, p.desc.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x.b.scale,
             "CUBLASLT_MATMUL_DESC_B_SCALE_POINTER", what);
  if (x.bias)
    set_desc(lt, p.desc.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, x.bias,
             "CUBLASLT_MATMUL_DESC_BIAS_POINTER", what);
}

std::unique_ptr<Prepared> prepare(const Api& lt, const MatmulArgs& x, const std::string& what) {
  auto p = std::make_unique<Prepared>();
  check(lt, lt.desc_create(&p->desc.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate",
        what);
  const cublasOperation_t op_a = x.a.op, op_b = x.b.op;
  set_desc(lt, p->desc.desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a, "CUBLASLT_MATMUL_DESC_TRANSA", what);
  set_desc(lt, p->desc.desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b, "CUBLASLT_MATMUL_DESC_TRANSB", what);
  if (is_fp8(x.a.type) || is_fp8(x.b.type)) {
    const std::int8_t fast = x.fast_accumulation ? 1 : 0;
    set_desc(lt, p->desc.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast, "CUBLASLT_MATMUL_DESC_FAST_ACCUM",
             what);
  }
  if (x.a.scale) {
    const std::int32_t mode = x.a.scale_mode;
    set_desc(lt, p->desc.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode,
             "CUBLASLT_MATMUL_DESC_A_SCALE_MODE", what);
  }
  if (x.b.scale) {
    const std::int32_t mode = x.b.scale_mode;
    set_desc(lt, p->desc.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode,
             "CUBLASLT_MATMUL_DESC_B_SCALE_MODE", what);
  }
  if (x.device_scalars) {
    const std::int32_t mode = CUBLASLT_POINTER_MODE_DEVICE;
    set_desc(lt, p->desc.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, mode, "CUBLASLT_MATMUL_DESC_POINTER_MODE",
             what);
  }
  if (x.bias) {
    const std::int32_t type = x.bias_type;
    set_desc(lt, p->desc.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, type,
             "CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE", what);
  }
  const std::uint32_t epilogue = x.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  set_desc(lt, p->desc.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, "CUBLASLT_MATMUL_DESC_EPILOGUE",
           what);
  set_pointers(lt, *p, x, what);

  check(lt, lt.layout_create(&p->a.layout, x.a.type, static_cast<std::uint64_t>(x.a.rows),
                             static_cast<std::uint64_t>(x.a.cols), x.a.ld),
        "cublasLtMatrixLayoutCreate(A)", what);
  check(lt, lt.layout_create(&p->b.layout, x.b.type, static_cast<std::uint64_t>(x.b.rows),
                             static_cast<std::uint64_t>(x.b.cols), x.b.ld),
        "cublasLtMatrixLayoutCreate(B)", what);
  check(lt, lt.layout_create(&p->d.layout, x.d_type, static_cast<std::uint64_t>(x.m),
                             static_cast<std::uint64_t>(x.n), x.ldd),
        "cublasLtMatrixLayoutCreate(C/D)", what);

  PrefOwner pref;
  check(lt, lt.pref_create(&pref.pref), "cublasLtMatmulPreferenceCreate", what);
  const std::uint64_t workspace = kWorkspaceBytes;
  check(lt, lt.pref_set(pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace),
        "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", what);
  // Split-K partial sums in FP32 only. The INPLACE and OUTPUT_TYPE schemes add the partials in
  // the output type: a BF16 output then rounds every partial sum (and, when accumulating, the
  // sum with C) and leaves the FP32-accumulation bound of the CPU reference, which the GPU
  // grouped suite saw on small per-expert shapes (96 x 192, K 256).
  const std::uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  check(lt, lt.pref_set(pref.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions, sizeof reductions),
        "cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)", what);
  const std::uint32_t align[4] = {alignment(x.a.data), alignment(x.b.data), alignment(x.d), alignment(x.d)};
  const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    check(lt, lt.pref_set(pref.pref, align_attr[i], &align[i], sizeof align[i]),
          "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)", what);

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s = lt.heuristic(handle_for(lt, x.device), p->desc.desc, p->a.layout, p->b.layout,
                                        p->d.layout, p->d.layout, pref.pref, 1, &result, &found);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE ||
      (s == CUBLAS_STATUS_SUCCESS && found == 0)) {
    p->supported = false;
    p->unsupported_status = s == CUBLAS_STATUS_SUCCESS ? "no algorithm" : status_text(lt, s);
    return p;
  }
  check(lt, s, "cublasLtMatmulAlgoGetHeuristic", what);
  check(lt, result.state, "cublasLtMatmulAlgoGetHeuristic (result state)", what);
  p->algo = result.algo;
  p->supported = true;
  return p;
}

std::string describe(const MatmulArgs& x) {
  std::ostringstream os;
  auto op = [](cublasOperation_t o) { return o == CUBLAS_OP_N ? "N" : "T"; };
  os << (x.what ? x.what() : std::string("a GEMM")) << " [cuBLASLt " << op(x.a.op) << op(x.b.op) << " m=" << x.m << " n=" << x.n
     << " k=" << x.k << ", A " << type_name(x.a.type) << " " << x.a.rows << "x" << x.a.cols
     << " ld " << x.a.ld << ", B " << type_name(x.b.type) << " " << x.b.rows << "x" << x.b.cols
     << " ld " << x.b.ld << ", D " << type_name(x.d_type) << " ld " << x.ldd
     << (x.bias ? std::string(", ") + type_name(x.bias_type) + " bias epilogue" : std::string())
     << (x.fast_accumulation ? ", fast accumulation" : "")
     << (x.device_scalars ? ", alpha/beta in device memory" : "")
     << " on cuda:" << x.device << "]";
  return os.str();
}

}  // namespace

// ---------------------------------------------------------------- 5. matmul

const char* type_name(cudaDataType_t type) {
  switch (type) {
    case CUDA_R_32F: return "f32";
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_16F: return "f16";
    case CUDA_R_8F_E4M3: return "e4m3";
    case CUDA_R_8F_E5M2: return "e5m2";
    default: return "other";
  }
}

std::string library_description() {
  const Api& lt = api();
  return lt.path + " (cuBLASLt " + std::to_string(lt.version) + ")";
}

Outcome matmul(const MatmulArgs& x, std::string* why) {
  const Api& lt = api();
  thread_local std::map<Key, std::unique_ptr<Prepared>> prepared;
  const Key key = make_key(x);
  auto it = prepared.find(key);
  if (it == prepared.end()) it = prepared.emplace(key, prepare(lt, x, describe(x))).first;
  Prepared& p = *it->second;
  if (!p.supported) {
    if (why) *why = p.unsupported_status;
    return Outcome::unsupported;
  }

  const std::string what = p.verified ? std::string() : describe(x);
  if (p.verified) {
    // Hot path: no string work unless something fails.
    if (x.a.scale || x.b.scale || x.bias) set_pointers(lt, p, x, "a cached GEMM");
  } else {
    set_pointers(lt, p, x, what);
  }
  void* workspace = workspace_for(x.device, x.stream);
  const cublasStatus_t s =
      lt.matmul(handle_for(lt, x.device), p.desc.desc, x.device_scalars ? x.device_scalars : &x.alpha,
                x.a.data, p.a.layout, x.b.data, p.b.layout,
                x.device_scalars ? x.device_scalars + 1 : &x.beta, x.d, p.d.layout, x.d, p.d.layout, &p.algo, workspace,
                kWorkspaceBytes, static_cast<cudaStream_t>(x.stream));
  if (s == CUBLAS_STATUS_NOT_SUPPORTED && !p.verified) {
    p.supported = false;
    p.unsupported_status = status_text(lt, s) + " from cublasLtMatmul";
    if (why) *why = p.unsupported_status;
    return Outcome::unsupported;
  }
  if (s != CUBLAS_STATUS_SUCCESS) check(lt, s, "cublasLtMatmul", p.verified ? describe(x) : what);
  p.verified = true;
  return Outcome::done;
}

}  // namespace qrecipe::cublaslt
