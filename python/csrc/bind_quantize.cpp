// qrecipe._C: Quantizer (a resolved quantizer: quantize a torch tensor, describe itself),
// QuantizedTensor (bytes and scales per direction as torch tensors aliasing engine buffers)
// and the grouped quantization of row groups (GroupedLinear's experts).
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "py_types.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/spec.hpp"

namespace qrecipe::python {
namespace {

py::dict layout_dict(const qr_direction_layout& l) {
  py::dict d;
  d["format"] = l.format ? std::string(l.format) : std::string();
  d["data_dtype"] = std::string(dtype_name(static_cast<DType>(l.data_dtype)));
  d["data_shape"] = std::vector<std::int64_t>(l.data_shape, l.data_shape + l.data_ndim);
  d["data_transposed"] = l.data_transposed != 0;
  static const char* const kScaleModes[] = {"none", "tensor", "block", "block+tensor"};
  d["scale_mode"] = (l.scale_mode >= 0 && l.scale_mode < 4) ? kScaleModes[l.scale_mode] : "unknown";
  d["scale_dtype"] = std::string(dtype_name(static_cast<DType>(l.scale_dtype)));
  d["scale_shape"] = std::vector<std::int64_t>(l.scale_shape, l.scale_shape + l.scale_ndim);
  d["scale_transposed"] = l.scale_transposed != 0;
  d["block"] = py::make_tuple(l.block_rows, l.block_cols);
  d["has_amax"] = l.has_amax != 0;
  return d;
}

// An amax argument: two host floats, or a float32 tensor of 2 elements on the source's device.
using AmaxArg = std::optional<std::variant<at::Tensor, std::array<float, 2>>>;

// A [rowwise, columnwise] amax pair in device memory next to `src`: float32, 2 elements,
// contiguous, on src's device. `what` names the call in errors.
void check_amax_tensor(const at::Tensor& amax, const at::Tensor& src, const char* what) {
  QR_CHECK(amax.scalar_type() == at::kFloat, what, ": the amax tensor must be torch.float32, "
           "got ", c10::toString(amax.scalar_type()));
  QR_CHECK(amax.numel() == 2 && amax.dim() == 1, what, ": the amax tensor must have shape (2,) "
           "([rowwise, columnwise]), got ", amax.sizes());
  QR_CHECK(amax.is_contiguous(), what, ": the amax tensor must be contiguous");
  QR_CHECK(amax.device() == src.device(), what, ": the amax tensor is on ", amax.device().str(),
           " but the tensor is on ", src.device().str(), "; keep it on the tensor's device (a "
           "list of two floats passes it on the host)");
}

// Fills options.amax / options.device_amax from `amax` (the tensor stays alive in the caller).
void set_amax(QuantizeOptions& options, const AmaxArg& amax, const at::Tensor& src,
              const char* what) {
  if (!amax) return;
  if (const auto* t = std::get_if<at::Tensor>(&*amax)) {
    check_amax_tensor(*t, src, what);
    options.device_amax = t->data_ptr<float>();
  } else {
    options.amax = std::get<std::array<float, 2>>(*amax);
  }
}

// `amax`: [rowwise, columnwise] amaxes the caller already reduced (over a tensor-parallel
// group: compute_amax on every rank's shard, then a max all-reduce), so every shard is scaled
// as the whole tensor would be; nullopt: the format computes the amax of `src` itself. As two
// host floats, or as a float32 tensor of shape (2,) on src's device (compute_amax_device's
// result, reduced there): the kernels then read it on the device, with no host round trip
// where the plugin has the device-amax extras (Quantizer.has_device_amax).
PyQuantized quantize(const PyQuantizer& q, const at::Tensor& src, std::uint32_t usage,
                     std::optional<std::uint64_t> rng_offset, const AmaxArg& amax) {
  const TensorView view = to_view(src, "tensor to quantize");
  QuantizeOptions options;
  options.rng_offset = rng_offset;
  set_amax(options, amax, src, "Quantizer.quantize");
  options.stream = current_stream(src);
  QuantizedTensor out;
  {
    py::gil_scoped_release no_gil;
    out = q.quantizer->quantize(view, usage, options, torch_allocator());
  }
  return PyQuantized{std::make_shared<QuantizedTensor>(std::move(out)), q};
}

// Quantizer::quantize_decoded: for operands of emulated GEMMs (docs/gemm.md, "Decoded
// operands"); `decoded_usage` (a subset of usage) names the directions whose BF16 operand the
// plugin's kernel writes too (CUDA; otherwise the first GEMM decodes and keeps it).
PyQuantized quantize_decoded(const PyQuantizer& q, const at::Tensor& src, std::uint32_t usage,
                             std::uint32_t decoded_usage) {
  const TensorView view = to_view(src, "tensor to quantize");
  QuantizeOptions options;
  options.stream = current_stream(src);
  QuantizedTensor out;
  {
    py::gil_scoped_release no_gil;
    out = q.quantizer->quantize_decoded(view, usage, decoded_usage, options, torch_allocator());
  }
  return PyQuantized{std::make_shared<QuantizedTensor>(std::move(out)), q};
}

at::Tensor dequantize(const PyQuantized& q, const std::string& direction, at::ScalarType dtype) {
  QR_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
           "dequantize decodes to torch.float32 or torch.bfloat16, got ", c10::toString(dtype));
  const qr_direction d = parse_direction(direction);
  const auto& data = q.tensor->direction(d).data;  // throws if the direction is absent
  const at::Tensor out = at::empty(
      {q.tensor->rows(), q.tensor->cols()},
      at::TensorOptions().dtype(dtype).device(torch_device(Device::from_c(data.device))));
  void* stream = current_stream(out);
  py::gil_scoped_release no_gil;
  q.quantizer.quantizer->dequantize(*q.tensor, d, to_view(out, "dequantize output"), stream);
  return out;
}

// A spec as the dictionary a recipe rule's quantizer would be written as (nested for the
// hybrid format's halves): Recipe.from_dict({"defaults": spec_dict(...)}) makes it again.
py::dict spec_dict(const QuantizerSpec& spec) {
  py::dict d;
  d["format"] = spec.format;
  for (const auto& [key, value] : spec.options) {
    switch (value.type) {
      case QR_OPTION_BOOL: d[key.c_str()] = value.bool_value; break;
      case QR_OPTION_INT: d[key.c_str()] = value.int_value; break;
      case QR_OPTION_FLOAT: d[key.c_str()] = value.float_value; break;
      case QR_OPTION_QUANTIZER:
        if (value.spec) {
          d[key.c_str()] = spec_dict(*value.spec);
        } else {
          py::dict none;
          none["format"] = "none";
          d[key.c_str()] = none;
        }
        break;
      default: d[key.c_str()] = value.string_value; break;
    }
  }
  return d;
}

// A quantized tensor of `q`'s layout whose buffers are copies of `buffers` ({direction:
// {"data", "scale_inv", "amax": tensor or None}}): how a pickled or deep-copied quantized
// weight is rebuilt from its plain tensors. Sizes and dtypes are checked against the layout.
PyQuantized from_buffers(const PyQuantizer& q, std::int64_t rows, std::int64_t cols,
                         std::uint32_t usage, const py::dict& buffers, const at::Device& device) {
  QR_CHECK(usage != 0 && (usage & ~(QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE)) == 0,
           "from_buffers: usage must be rowwise (1), columnwise (2) or both (3), got ", usage);
  std::array<qr_direction_layout, 2> layouts{};
  for (auto d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE})
    if (usage & usage_bit(d)) layouts[d] = q.quantizer->layout(rows, cols, d);
  auto tensor = std::make_shared<QuantizedTensor>(q.quantizer->format(), rows, cols, usage,
                                                  layouts, engine_device(device, "from_buffers"),
                                                  torch_allocator());
  for (auto d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    if (!(usage & usage_bit(d))) continue;
    const char* dname = direction_name(d);
    QR_CHECK(buffers.contains(dname), "from_buffers: no '", dname, "' buffers given");
    const auto given = buffers[dname].cast<py::dict>();
    const auto& dd = tensor->direction(d);
    const std::pair<const char*, const qr_tensor_view*> kinds[] = {
        {"data", &dd.data}, {"scale_inv", &dd.scale_inv}, {"amax", &dd.amax}};
    for (const auto& [kind, view] : kinds) {
      if (view->data == nullptr) continue;
      QR_CHECK(given.contains(kind) && !given[kind].is_none(), "from_buffers: the layout of ",
               dname, " has a '", kind, "' buffer but none was given");
      const auto src = given[kind].cast<at::Tensor>();
      at::Tensor dst = alias_tensor(TensorView(*view), tensor);
      QR_CHECK(src.scalar_type() == dst.scalar_type() && src.numel() == dst.numel(),
               "from_buffers: ", dname, " ", kind, " must be ", c10::toString(dst.scalar_type()),
               " with ", dst.numel(), " elements (layout ", dst.sizes(), "), got ",
               c10::toString(src.scalar_type()), " of shape ", src.sizes());
      dst.copy_(src.reshape(dst.sizes()));
    }
  }
  return PyQuantized{tensor, q};
}

// The address given for a part of zero bytes (a group without rows): torch may hand such a
// tensor a null pointer, and QuantizedTensor::over wants memory for every part the layout
// has. Nothing is ever read from or written to it.
void* empty_part() {
  alignas(256) static std::uint8_t none[256];
  return none;
}

// A quantized tensor of `q`'s layout over the memory of `buffers` (same form as from_buffers),
// without a copy: how a saved operand is rebuilt from the plain tensors torch's saved-tensor
// hooks handed back (CPU offload moves them and returns new ones). The tensors are kept alive
// by the result. Each must have the layout's dtype and element count, be contiguous, sit on
// `device` and start on a 16-byte boundary (what kernels reading the parts assume); a tensor
// that does not is an error naming it.
PyQuantized from_tensors(const PyQuantizer& q, std::int64_t rows, std::int64_t cols,
                         std::uint32_t usage, const py::dict& buffers, const at::Device& device) {
  QR_CHECK(usage != 0 && (usage & ~(QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE)) == 0,
           "from_tensors: usage must be rowwise (1), columnwise (2) or both (3), got ", usage);
  const Device where = engine_device(device, "from_tensors");
  std::array<qr_direction_layout, 2> layouts{};
  std::array<std::array<void*, 3>, 2> parts{};
  std::array<std::shared_ptr<const void>, 2> owners{};
  for (auto d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    if (!(usage & usage_bit(d))) continue;
    const qr_direction_layout l = q.quantizer->layout(rows, cols, d);
    layouts[d] = l;
    const char* dname = direction_name(d);
    QR_CHECK(buffers.contains(dname), "from_tensors: no '", dname, "' buffers given");
    const auto given = buffers[dname].cast<py::dict>();
    auto keep = std::make_shared<std::vector<at::Tensor>>();
    // Each part's byte size as the engine computes it (4-bit codes packed per row).
    auto bytes_of = [](DType dtype, int ndim, const std::int64_t* shape) {
      return static_cast<std::int64_t>(
          TensorView(nullptr, dtype, std::vector<std::int64_t>(shape, shape + ndim),
                     Device::cpu()).nbytes());
    };
    const std::int64_t one[1] = {1};
    struct Part {
      const char* kind;
      bool present;
      DType dtype;
      std::int64_t bytes;
    };
    const Part kinds[3] = {
        {"data", true, static_cast<DType>(l.data_dtype),
         bytes_of(static_cast<DType>(l.data_dtype), l.data_ndim, l.data_shape)},
        {"scale_inv", l.scale_ndim > 0, static_cast<DType>(l.scale_dtype),
         l.scale_ndim > 0 ? bytes_of(static_cast<DType>(l.scale_dtype), l.scale_ndim,
                                     l.scale_shape) : 0},
        {"amax", l.has_amax != 0, DType::f32, bytes_of(DType::f32, 1, one)}};
    for (int k = 0; k < 3; ++k) {
      if (!kinds[k].present) continue;
      QR_CHECK(given.contains(kinds[k].kind) && !given[kinds[k].kind].is_none(),
               "from_tensors: the layout of ", dname, " has a '", kinds[k].kind,
               "' buffer but none was given");
      const auto t = given[kinds[k].kind].cast<at::Tensor>();
      const std::int64_t bytes = kinds[k].bytes;
      QR_CHECK(t.scalar_type() == storage_dtype(kinds[k].dtype) &&
                   t.numel() * static_cast<std::int64_t>(t.element_size()) == bytes,
               "from_tensors: ", dname, " ", kinds[k].kind, " must be ",
               c10::toString(storage_dtype(kinds[k].dtype)), " holding ", bytes, " bytes, got ",
               c10::toString(t.scalar_type()), " of shape ", t.sizes());
      QR_CHECK(t.is_contiguous() && t.device() == device, "from_tensors: ", dname, " ",
               kinds[k].kind, " must be contiguous on ", device.str(), ", got ",
               t.is_contiguous() ? "" : "a non-contiguous tensor ", "on ", t.device().str());
      QR_CHECK(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0, "from_tensors: ",
               dname, " ", kinds[k].kind, " does not start on a 16-byte boundary; pass a "
               "tensor of its own (e.g. .clone())");
      parts[d][k] = bytes == 0 ? empty_part() : t.data_ptr();
      keep->push_back(t);
    }
    owners[d] = keep;
  }
  auto tensor = std::make_shared<QuantizedTensor>(QuantizedTensor::over(
      q.quantizer->format(), rows, cols, usage, layouts, parts, where, owners));
  return PyQuantized{tensor, q};
}

// ---------------------------------------------------------------- one tensor per direction
// A direction of a quantized tensor as ONE uint8 tensor, laid out as a single quantization
// allocates it (QuantizedTensor: [scale | amax | data], each part on a 256-byte boundary):
// what the torch.library operators return for a saved operand (an operator's outputs may not
// alias each other, so the three parts cannot be three outputs). Offsets of the parts in it:
struct StorageParts {
  std::int64_t scale = 0, amax = 0, data = 0, total = 0;
  std::int64_t scale_bytes = 0, amax_bytes = 0, data_bytes = 0;
};

StorageParts storage_parts(const qr_direction_layout& l) {
  constexpr std::int64_t kAlign = 256;  // QuantizedTensor::kPartAlignment
  auto round_up = [](std::int64_t b) { return (b + kAlign - 1) / kAlign * kAlign; };
  auto bytes_of = [](DType dtype, int ndim, const std::int64_t* shape) {
    return static_cast<std::int64_t>(
        TensorView(nullptr, dtype, std::vector<std::int64_t>(shape, shape + ndim),
                   Device::cpu()).nbytes());
  };
  StorageParts p;
  p.scale_bytes = l.scale_ndim > 0
                      ? bytes_of(static_cast<DType>(l.scale_dtype), l.scale_ndim, l.scale_shape)
                      : 0;
  p.amax_bytes = l.has_amax ? 4 : 0;
  p.data_bytes = bytes_of(static_cast<DType>(l.data_dtype), l.data_ndim, l.data_shape);
  p.amax = round_up(p.scale_bytes);
  p.data = p.amax + round_up(p.amax_bytes);
  p.total = p.data + p.data_bytes;
  return p;
}

// The uint8 tensor of one direction: an alias of the allocation when the tensor was quantized
// on its own (the parts sit at storage_parts' offsets), else a packed copy (a group of a
// grouped quantization, whose parts sit elsewhere).
at::Tensor direction_storage(const PyQuantized& q, const std::string& direction) {
  const qr_direction_data& dd = q.direction(direction);
  const StorageParts p = storage_parts(dd.layout);
  auto* data = static_cast<std::uint8_t*>(dd.data.data);
  std::uint8_t* base = data - p.data;
  const bool single =
      (p.scale_bytes == 0 || dd.scale_inv.data == base + p.scale) &&
      (p.amax_bytes == 0 || dd.amax.data == base + p.amax);
  const auto options = at::TensorOptions().dtype(at::kByte).device(
      torch_device(Device::from_c(dd.data.device)));
  if (single) {
    std::shared_ptr<const void> owner = q.tensor;
    return at::from_blob(base, {p.total}, [keep = std::move(owner)](void*) mutable {
      keep.reset();
    }, options);
  }
  at::Tensor out = at::zeros({p.total}, options);
  auto copy_part = [&](const void* src, std::int64_t offset, std::int64_t bytes) {
    if (bytes == 0) return;
    at::Tensor from = at::from_blob(const_cast<void*>(src), {bytes}, options);
    out.narrow(0, offset, bytes).copy_(from);
  };
  copy_part(dd.scale_inv.data, p.scale, p.scale_bytes);
  copy_part(dd.amax.data, p.amax, p.amax_bytes);
  copy_part(dd.data.data, p.data, p.data_bytes);
  return out;
}

// A quantized tensor over the per-direction uint8 tensors direction_storage made (moved,
// copied or handed back by saved-tensor hooks), without a copy.
PyQuantized from_storage(const PyQuantizer& q, std::int64_t rows, std::int64_t cols,
                         std::uint32_t usage, const py::dict& storages,
                         const at::Device& device) {
  QR_CHECK(usage != 0 && (usage & ~(QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE)) == 0,
           "from_storage: usage must be rowwise (1), columnwise (2) or both (3), got ", usage);
  const Device where = engine_device(device, "from_storage");
  std::array<qr_direction_layout, 2> layouts{};
  std::array<std::array<void*, 3>, 2> parts{};
  std::array<std::shared_ptr<const void>, 2> owners{};
  for (auto d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    if (!(usage & usage_bit(d))) continue;
    const char* dname = direction_name(d);
    layouts[d] = q.quantizer->layout(rows, cols, d);
    const StorageParts p = storage_parts(layouts[d]);
    QR_CHECK(storages.contains(dname), "from_storage: no '", dname, "' tensor given");
    const auto t = storages[dname].cast<at::Tensor>();
    QR_CHECK(t.scalar_type() == at::kByte && t.dim() == 1 && t.numel() == p.total &&
                 t.is_contiguous() && t.device() == device,
             "from_storage: the ", dname, " tensor must be a contiguous uint8 tensor of ",
             p.total, " bytes on ", device.str(), ", got ", c10::toString(t.scalar_type()),
             " of shape ", t.sizes(), " on ", t.device().str());
    auto* base = static_cast<std::uint8_t*>(p.total == 0 ? empty_part() : t.data_ptr());
    QR_CHECK(reinterpret_cast<std::uintptr_t>(base) % 16 == 0, "from_storage: the ", dname,
             " tensor does not start on a 16-byte boundary; pass a tensor of its own");
    // Every part the layout has gets its address, even one of zero bytes (no rows).
    parts[d] = {base + p.data, layouts[d].scale_ndim > 0 ? base + p.scale : nullptr,
                layouts[d].has_amax ? base + p.amax : nullptr};
    owners[d] = std::make_shared<at::Tensor>(t);
  }
  auto tensor = std::make_shared<QuantizedTensor>(QuantizedTensor::over(
      q.quantizer->format(), rows, cols, usage, layouts, parts, where, owners));
  return PyQuantized{tensor, q};
}

// ---------------------------------------------------------------- grouped quantization
// Engine::quantize_grouped on a torch tensor (GroupedLinear's single grouped weight): one
// QuantizedTensor per row group, each byte-identical to quantizer.quantize(rows of that group),
// in ONE plugin call when the format fills the quantize_grouped extra (plugin_abi.h), otherwise
// through the engine's per-group loop.
std::vector<PyQuantized> quantize_grouped(const PyQuantizer& q, const at::Tensor& src,
                                          const std::vector<std::int64_t>& group_rows,
                                          std::uint32_t usage,
                                          std::optional<std::uint64_t> rng_offset) {
  QR_CHECK(q.engine != nullptr, "quantize_grouped: the quantizer has no engine; take it from "
           "Engine.resolve or plan_linear");
  const TensorView view = to_view(src, "tensor to quantize grouped");
  QuantizeOptions options;
  options.rng_offset = rng_offset;
  options.stream = current_stream(src);
  std::vector<QuantizedTensor> out;
  {
    py::gil_scoped_release no_gil;
    out = q.engine->quantize_grouped(*q.quantizer, view, group_rows, usage, options,
                                     torch_allocator());
  }
  std::vector<PyQuantized> result;
  result.reserve(out.size());
  for (auto& t : out) result.push_back(PyQuantized{std::make_shared<QuantizedTensor>(std::move(t)), q});
  return result;
}

}  // namespace

void bind_quantize(py::module_& m) {
  // The usage bits a quantize call takes (one definition for the Python package).
  m.attr("USAGE_ROWWISE") = static_cast<int>(QR_USAGE_ROWWISE);
  m.attr("USAGE_COLUMNWISE") = static_cast<int>(QR_USAGE_COLUMNWISE);

  py::class_<PyQuantizer>(m, "Quantizer")
      .def_property_readonly("format", [](const PyQuantizer& q) { return q.quantizer->format(); })
      .def_property_readonly("role", [](const PyQuantizer& q) { return q.quantizer->role().str(); })
      .def_property_readonly("role_fields", [](const PyQuantizer& q) {
        const QuantizerRole& r = q.quantizer->role();
        return py::make_tuple(r.module_type, r.tensor_type, r.name);
      }, "(module_type, tensor_type, name) of the role: Engine.resolve's arguments.")
      .def_property_readonly("spec", [](const PyQuantizer& q) { return q.quantizer->spec().str(); })
      .def("describe", [](const PyQuantizer& q) { return q.quantizer->describe(); })
      .def("layout", [](const PyQuantizer& q, std::int64_t rows, std::int64_t cols,
                        const std::string& direction) {
        return layout_dict(q.quantizer->layout(rows, cols, parse_direction(direction)));
      })
      .def("quantize", &quantize, py::arg("tensor"), py::arg("usage"),
           py::arg("rng_offset") = std::nullopt, py::arg("amax") = std::nullopt)
      .def("quantize_decoded", &quantize_decoded, py::arg("tensor"), py::arg("usage"),
           py::arg("decoded_usage"),
           "quantize() for operands of emulated GEMMs: the result keeps decoded copies "
           "(QuantizedTensor.keep_decoded), and for the directions in decoded_usage of a CUDA "
           "tensor the plugin's quantize kernel writes them in the same pass where it has the "
           "quantize-and-decode extra (has_quantize_decoded); same bytes as quantize().")
      .def_property_readonly("has_quantize_decoded", [](const PyQuantizer& q) {
        return q.quantizer->has_quantize_decoded();
      }, "Whether the plugin quantizes and decodes in one pass (QR_EXTRA_QUANTIZE_DECODED).")
      .def("compute_amax", [](const PyQuantizer& q, const at::Tensor& src) {
        const TensorView view = to_view(src, "tensor to compute the amax of");
        void* stream = current_stream(src);
        py::gil_scoped_release no_gil;
        return q.quantizer->compute_amax(view, stream);
      }, py::arg("tensor"),
           "[rowwise, columnwise] amax of `tensor` as the format scales it (they differ under "
           "a Hadamard transform), on the host: what quantize(amax=...) takes once reduced.")
      .def("compute_amax_device", [](const PyQuantizer& q, const at::Tensor& src,
                                     std::optional<at::Tensor> out) {
        const TensorView view = to_view(src, "tensor to compute the amax of");
        at::Tensor result = out ? *out : at::empty({2}, src.options().dtype(at::kFloat));
        check_amax_tensor(result, src, "Quantizer.compute_amax_device (out)");
        float* ptr = result.data_ptr<float>();
        void* stream = current_stream(src);
        {
          py::gil_scoped_release no_gil;
          q.quantizer->compute_amax_into(view, ptr, stream);
        }
        return result;
      }, py::arg("tensor"), py::arg("out") = std::nullopt,
           "compute_amax's [rowwise, columnwise] pair as a float32 tensor of shape (2,) on "
           "`tensor`'s device (written into `out` when given: float32, 2 contiguous elements "
           "there), on torch's current stream: no host synchronization where the plugin has "
           "the device-amax extras (has_device_amax); otherwise the host values, copied.")
      .def_property_readonly("has_device_amax", [](const PyQuantizer& q) {
        return q.quantizer->has_device_amax();
      }, "Whether compute_amax_device and quantize(amax=<tensor>) stay on the device (the "
         "plugin's device-amax extras); False: they copy through the host (same results).")
      .def("spec_dict", [](const PyQuantizer& q) { return spec_dict(q.quantizer->spec()); },
           "The quantizer's spec as a recipe-rule dictionary (format plus options).")
      .def("from_buffers", &from_buffers, py::arg("rows"), py::arg("cols"), py::arg("usage"),
           py::arg("buffers"), py::arg("device"),
           "A quantized tensor of this quantizer's layout holding copies of `buffers`.")
      .def("from_tensors", &from_tensors, py::arg("rows"), py::arg("cols"), py::arg("usage"),
           py::arg("buffers"), py::arg("device"),
           "A quantized tensor of this quantizer's layout over the memory of `buffers` "
           "({direction: {'data', 'scale_inv', 'amax': tensor}}), without a copy.")
      .def("storage_bytes", [](const PyQuantizer& q, std::int64_t rows, std::int64_t cols,
                               const std::string& direction) {
        return storage_parts(q.quantizer->layout(rows, cols, parse_direction(direction))).total;
      }, py::arg("rows"), py::arg("cols"), py::arg("direction"),
           "Bytes of one direction as QuantizedTensor.storage gives it.")
      .def("from_storage", &from_storage, py::arg("rows"), py::arg("cols"), py::arg("usage"),
           py::arg("storages"), py::arg("device"),
           "A quantized tensor over the uint8 tensors QuantizedTensor.storage gave "
           "({direction: tensor}), without a copy.");

  py::class_<PyQuantized>(m, "QuantizedTensor")
      .def_property_readonly("format", [](const PyQuantized& q) { return q.tensor->format(); })
      .def_property_readonly("rows", [](const PyQuantized& q) { return q.tensor->rows(); })
      .def_property_readonly("cols", [](const PyQuantized& q) { return q.tensor->cols(); })
      .def_property_readonly("usage",
                             [](const PyQuantized& q) { return usage_str(q.tensor->usage()); })
      .def_property_readonly("quantizer", [](const PyQuantized& q) { return q.quantizer; })
      .def("has", [](const PyQuantized& q, const std::string& d) {
        return q.tensor->has(parse_direction(d));
      })
      .def("layout", [](const PyQuantized& q, const std::string& d) {
        return layout_dict(q.direction(d).layout);
      })
      .def("data", [](const PyQuantized& q, const std::string& d) {
        return q.buffer(q.direction(d).data);
      })
      .def("scale_inv", [](const PyQuantized& q, const std::string& d) {
        return q.buffer(q.direction(d).scale_inv);
      })
      .def("amax", [](const PyQuantized& q, const std::string& d) {
        return q.buffer(q.direction(d).amax);
      })
      .def("storage", &direction_storage, py::arg("direction"),
           "One direction as ONE uint8 tensor ([scale | amax | data]): an alias of its memory "
           "when it was quantized on its own, else a packed copy.")
      .def("drop", [](PyQuantized& q, const std::string& d) { q.tensor->drop(parse_direction(d)); })
      .def_property("keep_decoded", [](const PyQuantized& q) { return q.tensor->keeps_decoded(); },
                    [](PyQuantized& q, bool on) { q.tensor->set_keep_decoded(on); },
                    "Whether GEMMs keep each direction they decode with this tensor and reuse it "
                    "(docs/gemm.md, 'Decoded operands kept across GEMMs'); off by default. Only "
                    "for bytes nothing writes behind the engine's back: requantize drops the "
                    "copies, a write through an alias of data() needs invalidate_decoded().")
      .def("decoded_directions", [](const PyQuantized& q) {
        std::vector<std::string> out;
        for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE})
          if (q.tensor->decoded(d).values) out.emplace_back(direction_name(d));
        return out;
      }, "The directions whose decoded copy is kept now (see keep_decoded).")
      .def("decoded_bytes", [](const PyQuantized& q) {
        std::size_t total = 0;
        for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
          const DecodedCopy copy = q.tensor->decoded(d);
          if (copy.values) total += copy.values->bytes();
        }
        return total;
      }, "Bytes the kept decoded copies hold (see keep_decoded).")
      .def("invalidate_decoded", [](PyQuantized& q) { q.tensor->invalidate_decoded(); },
           "Drops the kept decoded copies (after writing the bytes through an alias).")
      .def("requantize", [](PyQuantized& q, const at::Tensor& src, const AmaxArg& amax) {
        // In place, into the buffers it holds: every alias of the bytes sees the new values.
        const TensorView view = to_view(src, "tensor to requantize");
        QuantizeOptions options;
        options.stream = current_stream(src);
        set_amax(options, amax, src, "QuantizedTensor.requantize");
        py::gil_scoped_release no_gil;
        q.quantizer.quantizer->quantize_into(view, *q.tensor, options);
      }, py::arg("tensor"), py::arg("amax") = std::nullopt,
      "Quantizes `tensor` (same shape) into the directions held now; `amax` as in "
      "Quantizer.quantize.")
      .def("dequantize", &dequantize, py::arg("direction"), py::arg("dtype"));

  m.def("quantize_grouped", &quantize_grouped, py::arg("quantizer"), py::arg("tensor"),
        py::arg("group_rows"), py::arg("usage"), py::arg("rng_offset") = std::nullopt,
        "One QuantizedTensor per row group of `tensor` ([sum(group_rows), cols], leading dims "
        "flattened), each byte-identical to quantizer.quantize(rows of that group); group g "
        "uses rng_offset + g when an offset is given. One plugin call when the format has the "
        "grouped extra (has_grouped_quantize), else one quantize per group.");
  m.def("has_grouped_quantize", [](const PyQuantizer& q) { return Engine::has_grouped_quantize(*q.quantizer); },
        py::arg("quantizer"),
        "Whether the quantizer's plugin quantizes all groups in one call (the optional "
        "quantize_grouped extra) rather than through the engine's per-group loop.");
  m.def("live_allocations", [] { return torch_allocator()->live_allocations(); },
        "Buffers the adapter's torch-backed allocator holds now (for leak tests).");
}

}  // namespace qrecipe::python
