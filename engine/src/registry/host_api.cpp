// The host table every plugin receives (qr_host_api), and the conversion of the qr_status
// values plugins return into qrecipe::Error.
//
// Every function here is a noexcept trampoline: exceptions from the engine become statuses.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>

#include "qrecipe/cuda.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/registry.hpp"
#include "qrecipe/spec.hpp"

struct qr_error {
  std::int32_t code;
  std::string where;
  std::string message;
};

namespace qrecipe {
namespace {

// Returned when even an error object cannot be allocated; never freed.
qr_error g_out_of_memory{QR_STATUS_OUT_OF_MEMORY, "", "out of memory while reporting an error"};

qr_status make_error(std::int32_t code, const char* where, const char* message) noexcept {
  try {
    return new qr_error{code, where ? where : "", message ? message : ""};
  } catch (...) {
    return &g_out_of_memory;
  }
}

template <class Fn>
qr_status host_guard(Fn&& fn) noexcept {
  try {
    fn();
    return nullptr;
  } catch (const Error& e) {
    return make_error(e.code(), e.where().c_str(), e.message().c_str());
  } catch (const std::bad_alloc&) {
    return &g_out_of_memory;
  } catch (const std::exception& e) {
    return make_error(QR_STATUS_INTERNAL, "", e.what());
  } catch (...) {
    return make_error(QR_STATUS_INTERNAL, "", "unknown exception in the engine");
  }
}

int log_threshold() {
  static const int level = [] {
    const char* env = std::getenv("QRECIPE_LOG_LEVEL");
    if (!env) return static_cast<int>(QR_LOG_WARNING);
    const std::string s(env);
    if (s == "debug") return static_cast<int>(QR_LOG_DEBUG);
    if (s == "info") return static_cast<int>(QR_LOG_INFO);
    if (s == "error") return static_cast<int>(QR_LOG_ERROR);
    return static_cast<int>(QR_LOG_WARNING);
  }();
  return level;
}

void host_log(std::int32_t level, const char* plugin, const char* message) noexcept {
  if (level < log_threshold()) return;
  static const char* const kNames[] = {"debug", "info", "warning", "error"};
  const char* name = (level >= 0 && level <= 3) ? kNames[level] : "log";
  std::fprintf(stderr, "[qrecipe %s] %s: %s\n", name, plugin ? plugin : "?", message ? message : "");
}

qr_status host_scaling_state_acquire(qr_host_context* ctx, const qr_scaling_request* request,
                                     qr_scaling_state* out) noexcept {
  return host_guard([&] {
    QR_CHECK(ctx && request && out, "scaling_state_acquire called with null arguments");
    QR_CHECK(request->struct_size >= sizeof(qr_scaling_request), "qr_scaling_request struct_size ",
             request->struct_size, " < ", sizeof(qr_scaling_request));
    *out = Engine::from_host_context(ctx)->acquire_scaling_state(
        *request, Engine::creating_owner(), Engine::creating_share());
  });
}

qr_status host_scaling_state_move(qr_host_context* ctx, qr_scaling_state* state,
                                  qr_device device) noexcept {
  return host_guard([&] {
    QR_CHECK(ctx && state, "scaling_state_move called with null arguments");
    *state = Engine::from_host_context(ctx)->move_scaling_state(state->amax_history, device);
  });
}

// A quantizer the host made on behalf of a plugin (the sub-quantizers of a format built from
// other formats).
struct HostQuantizer {
  std::shared_ptr<Quantizer> quantizer;
};
Quantizer& unwrap(qr_host_quantizer* q) {
  QR_CHECK(q != nullptr, "null host quantizer");
  auto* hq = reinterpret_cast<HostQuantizer*>(q);
  QR_CHECK(hq->quantizer != nullptr, "host quantizer for format 'none' has no operations");
  return *hq->quantizer;
}

qr_status host_quantizer_create(qr_host_context* ctx, const qr_quantizer_spec* spec,
                                const qr_role* role, qr_host_quantizer** out) noexcept {
  return host_guard([&] {
    QR_CHECK(ctx && spec && role && out, "quantizer_create called with null arguments");
    const QuantizerSpec cpp = CSpec::to_cpp(*spec);
    auto q = Engine::from_host_context(ctx)->make_quantizer(cpp, QuantizerRole::from_c(*role));
    QR_CHECK(q != nullptr, "sub-quantizer spec '", cpp.str(),
             "' is format none; a plugin must handle high precision itself");
    *out = reinterpret_cast<qr_host_quantizer*>(new HostQuantizer{std::move(q)});
  });
}

void host_quantizer_destroy(qr_host_quantizer* q) noexcept {
  delete reinterpret_cast<HostQuantizer*>(q);
}

qr_status host_quantizer_layout(qr_host_quantizer* q, std::int64_t rows, std::int64_t cols,
                                std::int32_t direction, qr_direction_layout* out) noexcept {
  return host_guard([&] {
    *out = unwrap(q).layout(rows, cols, static_cast<qr_direction>(direction));
  });
}

qr_status host_quantizer_compute_amax(qr_host_quantizer* q, const qr_tensor_view* src,
                                      void* stream, float* amax_out) noexcept {
  return host_guard([&] {
    const auto a = unwrap(q).compute_amax(TensorView(*src), stream);
    amax_out[0] = a[0];
    amax_out[1] = a[1];
  });
}

qr_status host_quantizer_quantize(qr_host_quantizer* q, const qr_tensor_view* src,
                                  const qr_quantize_args* args, qr_quantized_tensor* dst) noexcept {
  return host_guard([&] {
    Quantizer& quantizer = unwrap(q);
    const auto& c = quantizer.plugin().c();
    throw_if_error(c.quantize(quantizer.handle(), src, args, dst),
                   "sub-quantizer '" + quantizer.format() + "' quantize");
  });
}

qr_status host_quantizer_dequantize(qr_host_quantizer* q, const qr_quantized_tensor* src,
                                    std::int32_t direction, const qr_tensor_view* dst,
                                    void* stream) noexcept {
  return host_guard([&] {
    Quantizer& quantizer = unwrap(q);
    const auto& c = quantizer.plugin().c();
    throw_if_error(c.dequantize(quantizer.handle(), src, direction, dst, stream),
                   "sub-quantizer '" + quantizer.format() + "' dequantize");
  });
}

// Status accessors: let a plugin forward the error of a host call (a sub-quantizer's) with its
// own context instead of a generic "the host call failed".
std::int32_t host_error_code(qr_status status) noexcept {
  return status ? status->code : QR_STATUS_OK;
}
const char* host_error_where(qr_status status) noexcept {
  return status ? status->where.c_str() : "";
}
const char* host_error_message(qr_status status) noexcept {
  return status ? status->message.c_str() : "";
}
void host_error_free(qr_status status) noexcept {
  if (status != &g_out_of_memory) delete status;
}

qr_status host_quantizer_describe(qr_host_quantizer* q, char* buffer,
                                  std::size_t capacity) noexcept {
  return host_guard([&] {
    QR_CHECK(buffer != nullptr || capacity == 0, "quantizer_describe called with a null buffer");
    const std::string s = unwrap(q).describe();
    if (capacity == 0) return;
    const std::size_t n = s.size() < capacity - 1 ? s.size() : capacity - 1;
    s.copy(buffer, n);
    buffer[n] = '\0';
  });
}

// Scratch memory for a plugin's intermediates (plugin_abi.h): CPU from the engine's allocator,
// CUDA stream-ordered on the caller's stream (cuda.hpp allocate_async / free_async).
qr_status host_scratch_alloc(qr_host_context* ctx, qr_device device, std::size_t bytes,
                             void* stream, void** out) noexcept {
  return host_guard([&] {
    QR_CHECK(ctx && out, "scratch_alloc called with null arguments");
    *out = nullptr;
    const Device d = Device::from_c(device);
    if (d.is_cuda()) {
      *out = allocate_async(bytes, d, stream);
      return;
    }
    QR_CHECK_CODE(d.is_cpu(), QR_STATUS_UNSUPPORTED, "scratch_alloc on unknown device type ",
                  device.type, "; expected cpu or cuda");
    Allocator& allocator = *Engine::from_host_context(ctx)->allocator();
    void* p = allocator.allocate(bytes, d);
    try {
      allocator.zero(p, bytes, d);
    } catch (...) {
      allocator.deallocate(p, bytes, d);
      throw;
    }
    *out = p;
  });
}

void host_scratch_free(qr_host_context* ctx, void* ptr, std::size_t bytes, qr_device device,
                       void* stream) noexcept {
  if (ptr == nullptr) return;
  const Device d = Device::from_c(device);
  if (d.is_cuda())
    free_async(ptr, bytes, d, stream);
  else if (ctx != nullptr)
    Engine::from_host_context(ctx)->allocator()->deallocate(ptr, bytes, d);
}

// The extra `name` of the plugin behind a host-made quantizer, and that quantizer's own handle.
qr_status host_quantizer_extra(qr_host_quantizer* q, const char* name, void** fn,
                               qr_quantizer** inner) noexcept {
  return host_guard([&] {
    QR_CHECK(name && fn && inner, "quantizer_extra called with null arguments");
    Quantizer& quantizer = unwrap(q);
    const auto& c = quantizer.plugin().c();
    *fn = c.get_proc_address ? c.get_proc_address(name) : nullptr;
    *inner = quantizer.handle();
  });
}

const qr_host_api kHostApi = {
    sizeof(qr_host_api),
    QR_PLUGIN_ABI_VERSION,
    &make_error,
    &host_log,
    &host_scaling_state_acquire,
    &host_quantizer_create,
    &host_quantizer_destroy,
    &host_quantizer_layout,
    &host_quantizer_compute_amax,
    &host_quantizer_quantize,
    &host_quantizer_dequantize,
    &host_error_code,
    &host_error_where,
    &host_error_message,
    &host_error_free,
    &host_quantizer_describe,
    &host_scaling_state_move,
    &host_scratch_alloc,
    &host_scratch_free,
    &host_quantizer_extra,
};

}  // namespace

const qr_host_api* host_api() { return &kHostApi; }

void throw_if_error(qr_status status, const std::string& context) {
  if (status == nullptr) return;
  const auto code = static_cast<qr_status_code>(status->code);
  std::string where = status->where;
  std::string message = status->message;
  if (status != &g_out_of_memory) delete status;
  throw Error(code, std::move(where), context.empty() ? message : context + ": " + message);
}

}  // namespace qrecipe
