/* qrecipe plugin ABI: the only contract between the engine and a format plugin.
 *
 * Map of this header
 *   1. versions and basic enums (status, dtype, device, usage, scale modes, option types)
 *   2. value structs: tensor view, role, options, quantizer spec, layout, quantized tensor
 *   3. the host table (what the engine gives a plugin: errors, logging, scaling state,
 *      sub-quantizers for a format built from other formats, scratch memory)
 *   4. the plugin descriptor (what a plugin gives the engine) and the two exported symbols
 *
 * Rules (docs/architecture.md, "The C plugin boundary"; docs/plugins.md):
 *   - C only. No C++ type, exception or allocation crosses this boundary.
 *   - Every struct starts with `uint32_t struct_size`; readers check it before touching a
 *     field, so newer code can read older structs.
 *   - Tables and structs are append-only once released: a field is never removed,
 *     reordered or retyped. The static_asserts at the end of this file pin the offset of the
 *     last slot of every released version; a change that moves one fails to compile.
 *   - Errors are values: functions return a `qr_status` (NULL on success) made by the host's
 *     `error_new`. The engine takes ownership of a returned status and frees it.
 *   - Memory of quantized tensors is allocated by the host (the engine asks `layout` for the
 *     sizes, allocates, then calls `quantize` into the buffers). Plugins never own tensors.
 *     Scale and amax buffers, and data buffers with padding (more values than rows x cols,
 *     or a padding nibble of 4-bit codes), start zero-filled; a data buffer holding exactly
 *     rows x cols values in whole bytes does not: `quantize` writes every one of its bytes.
 *
 * How to add a slot: append it at the end of the struct, bump nothing else, add a
 * static_assert pinning the new slot's offset (end of this file), and check `struct_size`
 * before reading or calling it from the engine: a struct from an older plugin ends before it,
 * and its absence must mean "not provided". The engine then accepts a plugin's struct from
 * the size of the version that introduced it on, not from sizeof (the descriptor:
 * QR_PLUGIN_DESCRIPTOR_SIZE_V1), so older plugins keep loading. Bump
 * QR_PLUGIN_ABI_VERSION only for a change that old plugins cannot survive (there should
 * never be one).
 *
 * Structs embedded by value in another struct (qr_device, qr_tensor_view,
 * qr_direction_layout, qr_direction_data) can never grow: a new field would move every field
 * after them in the enclosing struct. Their sizes are pinned too; new per-direction data goes
 * into a struct passed by pointer (the plugin descriptor, for data of a whole format).
 */
#ifndef QRECIPE_PLUGIN_ABI_H
#define QRECIPE_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- 1. versions, enums */

#define QR_PLUGIN_ABI_VERSION 1u
#define QR_MAX_DIMS 8

#if defined(_WIN32)
#define QR_PLUGIN_EXPORT __declspec(dllexport)
#else
#define QR_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

typedef enum qr_status_code {
  QR_STATUS_OK = 0,
  QR_STATUS_INVALID_ARGUMENT = 1, /* bad shape, dtype, option value, ... */
  QR_STATUS_UNSUPPORTED = 2,      /* valid request this plugin cannot serve (device, dtype) */
  QR_STATUS_OUT_OF_MEMORY = 3,
  QR_STATUS_DEVICE_ERROR = 4,     /* CUDA / driver failure */
  QR_STATUS_INTERNAL = 5          /* a bug: an exception caught at the boundary, ... */
} qr_status_code;

/* Opaque error object owned by the host. NULL means success. */
typedef struct qr_error qr_error;
typedef qr_error* qr_status;

typedef enum qr_dtype {
  QR_DTYPE_F32 = 0,
  QR_DTYPE_BF16 = 1,
  QR_DTYPE_F16 = 2,
  QR_DTYPE_E4M3 = 3,
  QR_DTYPE_E5M2 = 4,
  QR_DTYPE_E2M1 = 5, /* packed two per byte along the last dimension, even index in low nibble */
  QR_DTYPE_E8M0 = 6,
  QR_DTYPE_U8 = 7,
  QR_DTYPE_F64 = 8
} qr_dtype;

typedef enum qr_device_type { QR_DEVICE_CPU = 0, QR_DEVICE_CUDA = 1 } qr_device_type;

typedef struct qr_device {
  int32_t type;  /* qr_device_type */
  int32_t index; /* CUDA ordinal; 0 for the CPU */
} qr_device;

/* Bit flags: which directions a quantized tensor holds / a caller asks for. */
typedef enum qr_usage {
  QR_USAGE_ROWWISE = 1u,    /* blocks along the last dimension (K) */
  QR_USAGE_COLUMNWISE = 2u  /* blocks along the first dimension (M) */
} qr_usage;

typedef enum qr_direction { QR_DIRECTION_ROWWISE = 0, QR_DIRECTION_COLUMNWISE = 1 } qr_direction;

/* How the scale_inv of one direction applies to its data. The GEMM pairing table is keyed by
 * this (plus data dtype and block shape), so the engine never needs to know format names. */
typedef enum qr_scale_mode {
  QR_SCALE_NONE = 0,        /* data is high precision, no scale */
  QR_SCALE_TENSOR = 1,      /* one FP32 scale_inv for the whole tensor */
  QR_SCALE_BLOCK = 2,       /* one scale per block_rows x block_cols block of the logical
                               [M, K] tensor; scale dtype from the layout */
  QR_SCALE_BLOCK_TENSOR = 3 /* block scales times a per-tensor decode factor derived from
                               the direction's `amax`; the owning format's descriptor says
                               how (tensor_scale_numerator) */
} qr_scale_mode;

typedef enum qr_option_type {
  QR_OPTION_BOOL = 0,
  QR_OPTION_INT = 1,
  QR_OPTION_FLOAT = 2,
  QR_OPTION_ENUM = 3,     /* a string from a fixed list of choices */
  QR_OPTION_STRING = 4,
  QR_OPTION_QUANTIZER = 5 /* a nested quantizer spec (a format built from other formats) */
} qr_option_type;

typedef enum qr_log_level {
  QR_LOG_DEBUG = 0,
  QR_LOG_INFO = 1,
  QR_LOG_WARNING = 2,
  QR_LOG_ERROR = 3
} qr_log_level;

/* ---------------------------------------------------------------- 2. value structs */

/* Non-owning view of a strided tensor. Strides are in elements; for E2M1 the last dimension
 * is counted in elements (nibbles) and must be contiguous. */
typedef struct qr_tensor_view {
  uint32_t struct_size;
  int32_t dtype; /* qr_dtype */
  qr_device device;
  void* data;
  int32_t ndim;
  int64_t shape[QR_MAX_DIMS];
  int64_t strides[QR_MAX_DIMS];
} qr_tensor_view;

/* Who consumes a tensor. Strings are owned by the caller and live for the call. */
typedef struct qr_role {
  uint32_t struct_size;
  const char* module_type; /* linear, grouped_linear, layernorm_linear, layernorm_mlp, ... */
  const char* tensor_type; /* input, weight, grad_output */
  const char* name;        /* dotted module path, e.g. layers.3.mlp.fc1 */
} qr_role;

typedef struct qr_quantizer_spec qr_quantizer_spec;

/* One validated option as the plugin receives it: the engine has already checked the key,
 * the type and (for enums) the value against the plugin's schema. */
typedef struct qr_option {
  uint32_t struct_size;
  const char* key;
  int32_t type; /* qr_option_type */
  int32_t bool_value;
  int64_t int_value;
  double float_value;
  const char* string_value;         /* ENUM and STRING */
  const qr_quantizer_spec* spec_value; /* QUANTIZER */
} qr_option;

/* A format name plus the options the recipe set explicitly (defaults are the plugin's). */
struct qr_quantizer_spec {
  uint32_t struct_size;
  const char* format;
  const qr_option* options;
  uint32_t num_options;
};

/* One entry of a plugin's option schema (static data owned by the plugin). */
typedef struct qr_option_schema {
  uint32_t struct_size;
  const char* key;
  int32_t type;                 /* qr_option_type */
  const char* default_value;    /* human-readable default, e.g. "e4m3 (e5m2 for grad_output)" */
  const char* const* choices;   /* ENUM: allowed values */
  uint32_t num_choices;
  double min_value;             /* INT/FLOAT: inclusive bounds, checked by the engine */
  double max_value;
  const char* help;
  int32_t required;             /* 1: a spec of this format must set it (checked by the engine) */
} qr_option_schema;

/* Sizes and meaning of the buffers of one direction, for a logical [rows, cols] tensor. */
typedef struct qr_direction_layout {
  uint32_t struct_size;
  const char* format;     /* format that owns this direction (a format built from other
                             formats reports the one that made each direction) */
  int32_t data_dtype;     /* qr_dtype */
  int32_t data_ndim;
  int64_t data_shape[2];  /* element shape; transposed directions report [cols, rows] */
  int32_t data_transposed;/* 1 if data is stored as the transpose of the logical tensor */
  int32_t scale_mode;     /* qr_scale_mode */
  int32_t scale_dtype;    /* qr_dtype of scale_inv (F32, E8M0, E4M3) */
  int32_t scale_ndim;     /* 0 when there is no scale buffer */
  int64_t scale_shape[2]; /* padded shape of the stored scale_inv array */
  int32_t scale_transposed; /* 1 if scale_inv[j][i] holds block (i, j) (e.g. 1x128 blocks
                               stored outer-dimension-major, as cuBLASLt reads them) */
  int32_t block_rows;     /* block geometry in the logical [rows, cols] tensor */
  int32_t block_cols;
  int32_t has_amax;       /* 1 if this direction stores an FP32 amax scalar */
} qr_direction_layout;

/* Buffers of one direction (views into host-allocated memory). */
typedef struct qr_direction_data {
  uint32_t struct_size;
  qr_direction_layout layout;
  qr_tensor_view data;
  qr_tensor_view scale_inv; /* ndim 0 / data NULL when the layout has no scale */
  qr_tensor_view amax;      /* one F32 element, or data NULL */
} qr_direction_data;

/* A quantized tensor: logical 2-D shape plus up to two directions. */
typedef struct qr_quantized_tensor {
  uint32_t struct_size;
  const char* format; /* format of the quantizer that produced it */
  int64_t rows;       /* prod(leading dims) */
  int64_t cols;       /* last dim */
  uint32_t usage;     /* qr_usage bits: which of the two directions below are valid */
  qr_direction_data rowwise;
  qr_direction_data columnwise;
} qr_quantized_tensor;

/* Arguments of one quantize call. */
typedef struct qr_quantize_args {
  uint32_t struct_size;
  uint32_t usage;           /* directions to produce; each must be allocated in dst */
  const float* amax;        /* NULL, or host pointer to [rowwise amax, columnwise amax] already
                               reduced by the caller (TP/SP/FSDP); the plugin then skips its
                               own amax pass */
  int32_t has_rng_offset;   /* 1: use rng_offset (recompute, checkpoint resume) */
  uint64_t rng_offset;      /* stochastic-rounding call offset */
  void* stream;             /* cudaStream_t for CUDA tensors, NULL for the default stream */
} qr_quantize_args;

/* ---------------------------------------------------------------- 3. host table */

typedef struct qr_host_context qr_host_context; /* opaque engine handle */
typedef struct qr_host_quantizer qr_host_quantizer; /* a quantizer the host made for a plugin */
typedef struct qr_quantizer qr_quantizer; /* opaque, made by a plugin */

/* Shared delayed-scaling state handed to a stateful quantizer. The engine owns it and
 * updates scale / history in Engine::update_scaling(); the quantizer reads `scale` and
 * max-accumulates its amax into `amax_history[0]` during the step. Memory lives on the
 * device the state was requested for and stays valid while the engine lives. */
typedef struct qr_scaling_state {
  uint32_t struct_size;
  float* amax_history;  /* [history_len]; row 0 is the current step */
  float* scale;         /* [1] */
  float* scale_inv;     /* [1] = 1/scale, refreshed by the update */
  int32_t history_len;
  qr_device device;
} qr_scaling_state;

typedef struct qr_scaling_request {
  uint32_t struct_size;
  int32_t history_len;      /* >= 1 */
  int32_t algo_most_recent; /* 0: max over history, 1: most recent */
  int32_t margin;
  float fp8_max;            /* 448 or 57344 */
  qr_device device;
} qr_scaling_request;

typedef struct qr_host_api {
  uint32_t struct_size;
  uint32_t abi_version;
  /* errors: make a status the engine will own. `where` is "file:line (function)". */
  qr_status (*error_new)(int32_t code, const char* where, const char* message);
  /* logging through the engine's sink */
  void (*log)(int32_t level, const char* plugin, const char* message);
  /* delayed scaling: a state owned by `ctx` (the engine that is creating the quantizer) */
  qr_status (*scaling_state_acquire)(qr_host_context* ctx, const qr_scaling_request* request,
                                     qr_scaling_state* out);
  /* sub-quantizers (a format built from other formats): build a quantizer of any loaded
   * format for the same role */
  qr_status (*quantizer_create)(qr_host_context* ctx, const qr_quantizer_spec* spec,
                                const qr_role* role, qr_host_quantizer** out);
  void (*quantizer_destroy)(qr_host_quantizer* q);
  qr_status (*quantizer_layout)(qr_host_quantizer* q, int64_t rows, int64_t cols,
                                int32_t direction, qr_direction_layout* out);
  qr_status (*quantizer_compute_amax)(qr_host_quantizer* q, const qr_tensor_view* src,
                                      void* stream, float* amax_out /* [2] */);
  qr_status (*quantizer_quantize)(qr_host_quantizer* q, const qr_tensor_view* src,
                                  const qr_quantize_args* args, qr_quantized_tensor* dst);
  qr_status (*quantizer_dequantize)(qr_host_quantizer* q, const qr_quantized_tensor* src,
                                    int32_t direction, const qr_tensor_view* dst, void* stream);
  /* reading a status that a host call returned (e.g. a sub-quantizer's error), so a plugin can
   * forward it with its own context: the qr_status_code, "file:line (function)" of the original
   * failure, and the message. The strings live until error_free. A status the plugin does not
   * return to the engine must be released with error_free (sdk::check_host does both). */
  int32_t (*error_code)(qr_status status);
  const char* (*error_where)(qr_status status);
  const char* (*error_message)(qr_status status);
  void (*error_free)(qr_status status);
  /* the resolved options of a sub-quantizer, as the plugin descriptor's `describe` */
  qr_status (*quantizer_describe)(qr_host_quantizer* q, char* buffer, size_t capacity);
  /* appended after v1 (check struct_size): moves a state this ctx handed out to `device`,
   * keeping its history and scale, and rewrites *state with the new pointers (the old ones
   * are freed). A quantizer whose tensors live on another device than its state calls it
   * once, so amaxes accumulate where the kernels run. Synchronizes the devices involved
   * (pending work on non-blocking streams must be synchronized by the caller, as for
   * Engine::update_scaling). Not concurrent with quantize calls using the state. */
  qr_status (*scaling_state_move)(qr_host_context* ctx, qr_scaling_state* state,
                                  qr_device device);
  /* appended after v1 (check struct_size): scratch memory for a plugin's intermediates (e.g.
   * a direction decoded to feed another direction's quantizer), zero-filled, at least
   * 256-byte aligned, never NULL on success (bytes 0 included). CPU: from the engine's
   * allocator (`stream` unused). CUDA: stream-ordered on `stream` of `device`
   * (cudaMallocAsync, zeroed by cudaMemsetAsync; NULL = the legacy default stream): usable by
   * work queued on `stream` after the call.
   * scratch_free with the same device and stream gives it back in stream order
   * (cudaFreeAsync): work queued on `stream` before the free still sees the memory, and
   * the caller need not synchronize. Free on every path, errors included. */
  qr_status (*scratch_alloc)(qr_host_context* ctx, qr_device device, size_t bytes, void* stream,
                             void** out);
  void (*scratch_free)(qr_host_context* ctx, void* ptr, size_t bytes, qr_device device,
                       void* stream);
  /* appended after v1 (check struct_size): the extra `name` of the plugin that made q (its
   * descriptor's get_proc_address) in *fn, NULL when that plugin has none, and q's own
   * qr_quantizer* in *inner to call it with. Both stay valid while q lives. A plugin that
   * drives another plugin's quantizer (a format built from others) uses it to reach that plugin's
   * extras, such as the tensor-cast fusion below. */
  qr_status (*quantizer_extra)(qr_host_quantizer* q, const char* name, void** fn,
                               qr_quantizer** inner);
} qr_host_api;

/* ---------------------------------------------------------------- 4. plugin descriptor */


typedef struct qr_create_args {
  uint32_t struct_size;
  qr_host_context* ctx;       /* pass back to host calls that take one */
  const qr_role* role;
  const qr_quantizer_spec* spec; /* spec->format is this plugin's name */
} qr_create_args;

typedef struct qr_plugin_descriptor {
  uint32_t abi_version; /* QR_PLUGIN_ABI_VERSION the plugin was built with */
  uint32_t struct_size;
  const char* name;            /* format name used in recipes, e.g. "myformat" */
  const char* version;         /* format/plugin version, e.g. "1.0.0" */
  const char* description;
  uint32_t devices;            /* bit (1 << qr_device_type) per supported device */
  int32_t cuda_version;        /* CUDA runtime it was built with (e.g. 13000), 0 without CUDA */
  const char* cuda_archs;      /* compiled SM archs, e.g. "90a", "" without CUDA */
  const qr_option_schema* options;
  uint32_t num_options;

  qr_status (*create_quantizer)(const qr_create_args* args, qr_quantizer** out);
  void (*destroy_quantizer)(qr_quantizer* q);
  /* layout of one direction for a logical [rows, cols] tensor */
  qr_status (*layout)(qr_quantizer* q, int64_t rows, int64_t cols, int32_t direction,
                      qr_direction_layout* out);
  /* amax of src as the format needs it: [0] rowwise, [1] columnwise (differ under Hadamard) */
  qr_status (*compute_amax)(qr_quantizer* q, const qr_tensor_view* src, void* stream,
                            float* amax_out);
  /* quantize src into the buffers of dst (allocated by the host from `layout`); also used for
   * in-place requantization into an existing tensor */
  qr_status (*quantize)(qr_quantizer* q, const qr_tensor_view* src, const qr_quantize_args* args,
                        qr_quantized_tensor* dst);
  /* decode one direction into dst (F32 or BF16, logical [rows, cols]) */
  qr_status (*dequantize)(qr_quantizer* q, const qr_quantized_tensor* src, int32_t direction,
                          const qr_tensor_view* dst, void* stream);
  /* optional extras by name (fused optimizer step, grouped quantize, ...); NULL if absent */
  void* (*get_proc_address)(const char* name);
  /* human-readable description of a quantizer's resolved options (for `recipe explain`);
   * writes at most `capacity` bytes including the terminating NUL */
  qr_status (*describe)(qr_quantizer* q, char* buffer, size_t capacity);
  /* ---- end of v1 (QR_PLUGIN_DESCRIPTOR_SIZE_V1 bytes); appended after v1, read only when
   * struct_size reaches them: */

  /* How the per-tensor decode factor of this format's QR_SCALE_BLOCK_TENSOR directions
   * follows from their stored FP32 amax, so the engine can decode such a direction itself
   * (the GPU GEMM's BF16 decoders) instead of calling `dequantize`:
   *   factor = 1 / S,  S = tensor_scale_numerator / amax (FP32), FLT_MAX if that overflows,
   *                    1 when amax is 0, inf or NaN
   * i.e. qrecipe::tensor_decode_factor(amax, tensor_scale_numerator) of qrecipe/scaling.hpp,
   * and an element decodes as (code * block scale) * factor, which must be exactly what the
   * plugin's dequantize computes. A finite positive number, or 0: the format has no such
   * factor (formats without QR_SCALE_BLOCK_TENSOR directions, and every plugin built before
   * this field existed); the engine then decodes those directions only through `dequantize`.
   * Anything else (negative, inf, NaN) makes the plugin fail to load. */
  float tensor_scale_numerator;
} qr_plugin_descriptor;

/* Size of the v1 descriptor (up to and including `describe`): the least struct_size the
 * engine accepts, so plugins built before the fields appended after v1 keep loading. */
#define QR_PLUGIN_DESCRIPTOR_SIZE_V1 128u

/* ---- Extras by name: `get_proc_address(name)` returns one of these (cast to void*) or NULL.
 * Each name comes with the function type its pointer has. */

/* Grouped quantization (MoE experts stored as one tensor): an optional extra. `src` is a 2-D
 * [rows, cols] view (any strides) made of `num_groups` (>= 1) consecutive row groups: group g
 * has group_rows[g] (>= 0) rows and starts after the rows of groups 0..g-1; the group rows
 * sum to `rows`. dst[g] (num_groups pointers) is a quantized tensor of group_rows[g] x cols
 * allocated by the host from `layout` exactly as for `quantize`, holding at least
 * args->usage. The contract: every dst[g] ends up byte-identical (data, scale_inv, amax) to
 * what `quantize` of group g's rows alone writes with the same args, the groups quantized
 * one after the other in order g = 0, 1, ...; in particular
 *   - per-tensor quantities (amax, scale) are per group, never over the whole tensor;
 *   - stateful scaling (delayed) uses the quantizer's state as those sequential calls do
 *     (each group reads the stored scale and max-accumulates its amax into the history);
 *   - stochastic rounding: group g uses call offset args->rng_offset + g when
 *     args->has_rng_offset, else the next num_groups offsets of the quantizer's counter;
 *   - args->amax is NULL: the host never passes caller-reduced amaxes here (they are per
 *     group; a host with reduced amaxes quantizes group by group instead).
 * What it buys is launches: a CUDA implementation computes all group amaxes in one pass and
 * casts every group in one launch instead of two launches per group. A plugin without it
 * (get_proc_address returns NULL for the name) is quantized by the host one group at a time
 * through `quantize`, with the same bytes. On error the contents of every dst[g] are unspecified. */
#define QR_EXTRA_QUANTIZE_GROUPED "qr_quantize_grouped"
typedef qr_status (*qr_quantize_grouped_fn)(qr_quantizer* q, const qr_tensor_view* src,
                                            uint32_t num_groups, const int64_t* group_rows,
                                            const qr_quantize_args* args,
                                            qr_quantized_tensor* const* dst);

/* Grouped quantization with the group boundaries on the device (MoE routing decided on the
 * GPU, so the host never learns the group sizes and never waits for them): two optional extras
 * of a CUDA plugin, QR_EXTRA_GROUPED_DEVICE_SIZES and QR_EXTRA_QUANTIZE_GROUPED_DEVICE, always
 * provided together.
 *
 * The groups are those of QR_EXTRA_QUANTIZE_GROUPED, with offsets[g] (device memory, int64,
 * offsets[0] = 0, offsets[num_groups] = rows) the first row of group g. Every group is
 * quantized as a tensor of its own with exactly the bytes, scales and amax that `quantize` of
 * its rows alone would write (the same contract as QR_EXTRA_QUANTIZE_GROUPED: per-group
 * amax/scale, delayed scaling and stochastic-rounding offsets as sequential calls in group
 * order), but all groups of a direction share ONE data buffer and ONE scale buffer whose
 * sizes the host takes from QR_EXTRA_GROUPED_DEVICE_SIZES (bounds that hold for any split),
 * and where each group lies is written by the plugin, on the device, into a table of
 * qr_group_entry (one per group) the host allocated in device memory. What a consumer (the
 * engine's grouped GEMM) reads of group g is its entry: its data, laid out as the group's own
 * tensor but with stored rows `data_ld` elements apart, and its scale_inv, laid out as the
 * group's own with rows of the 2-D scale array `scale_ld` elements apart (`layout` of the
 * direction says which scale element is which block, as for a single tensor).
 *
 * Alignment promised to consumers: a direction whose data is stored transposed ([cols, rows]
 * per group) has data_ld = rows rounded up to a multiple of 16 and every group's data starts
 * on a 16-byte boundary when cols * (data bits) / 8 is a multiple of 16; the padding elements
 * are never read. An untransposed direction has data_ld = cols and group g's data starts
 * offsets[g] * cols elements after the buffer. Scale and amax buffers start zero-filled (the
 * host fills them); data buffers are not filled. An empty group (0 rows) gets an entry with
 * rows 0 (its pointers may point anywhere). Asynchronous on args->stream; on error the
 * contents are unspecified. */
typedef struct qr_group_entry {
  void* data;       /* the group's codes (see above) */
  void* scale_inv;  /* the group's scale_inv (one FP32 for tensor scaling, or its 2-D block
                       scales), NULL when the layout has none */
  float* amax;      /* the group's amax, NULL when the layout has none */
  int64_t rows;     /* rows of the group */
  int64_t data_ld;  /* elements between consecutive stored rows of data */
  int64_t scale_ld; /* elements between consecutive rows of the 2-D scale array (0: none) */
} qr_group_entry;

/* One direction of a device-split grouped tensor (a host struct of device pointers). */
typedef struct qr_grouped_direction {
  uint32_t struct_size;
  qr_direction_layout layout;  /* layout(rows, cols, direction) of the whole tensor: what the
                                  groups share (dtypes, scale mode and dtype, block shape,
                                  transposition); its shapes are not any group's */
  void* data;                  /* data_bytes bytes */
  size_t data_bytes;
  void* scale_inv;             /* scale_bytes bytes, NULL when scale_bytes is 0 */
  size_t scale_bytes;
  float* amax;                 /* [num_groups] when layout.has_amax, else NULL */
  qr_group_entry* groups;      /* device [num_groups], written by the plugin */
} qr_grouped_direction;

/* A tensor of `rows` x `cols` split into row groups on the device, every group quantized as
 * a tensor of its own. Host struct; every pointer but `format` is device memory. */
typedef struct qr_grouped_quantized {
  uint32_t struct_size;
  const char* format;
  int64_t rows;             /* sum of the group rows */
  int64_t cols;
  uint32_t num_groups;      /* >= 1 */
  const int64_t* offsets;   /* device [num_groups + 1] */
  uint32_t usage;           /* directions held */
  qr_grouped_direction rowwise;
  qr_grouped_direction columnwise;
} qr_grouped_quantized;

/* Bytes of the data and scale buffers of one direction for ANY split of `rows` rows into
 * `num_groups` groups (each group's own layout summed over the worst case, plus alignment). */
#define QR_EXTRA_GROUPED_DEVICE_SIZES "qr_grouped_device_sizes"
typedef qr_status (*qr_grouped_device_sizes_fn)(qr_quantizer* q, int64_t rows, int64_t cols,
                                                uint32_t num_groups, int32_t direction,
                                                size_t* data_bytes, size_t* scale_bytes);

/* Quantizes `src` (a contiguous 2-D [dst->rows, dst->cols] CUDA tensor) into dst, whose
 * buffers, offsets and tables the host filled in (sizes from QR_EXTRA_GROUPED_DEVICE_SIZES, the
 * directions in args->usage held by dst). args->amax is NULL. */
#define QR_EXTRA_QUANTIZE_GROUPED_DEVICE "qr_quantize_grouped_device"
typedef qr_status (*qr_quantize_grouped_device_fn)(qr_quantizer* q, const qr_tensor_view* src,
                                                   const qr_quantize_args* args,
                                                   qr_grouped_quantized* dst);
/* Fused Adam step + requantization (qrecipe.optim.FusedAdam: FP32 master weights for quantized
 * parameters): an optional extra, two names.
 *
 * QR_EXTRA_ADAM_REQUANTIZE takes `count` (>= 1) tensors, all on one device, each made by a
 * quantizer of this plugin (tensors[i].quantizer, which made tensors[i].dst). The contract: the
 * result is byte-identical (master, moments, and every buffer of dst: data, scale_inv, amax)
 * to doing, for i = 0, 1, ... in order:
 *   1. for every element, qrecipe::adam::update (qrecipe/adam.hpp) of master, exp_avg and
 *      exp_avg_sq from grad, with qrecipe::adam::scalars of tensors[i].hyper (a moment stored
 *      in BF16 is widened before and rounded to nearest even after the update);
 *   2. `quantize` of the new master (an F32 [rows, cols] source) into dst with usage =
 *      dst->usage, no caller-reduced amax and no rng offset.
 * So stateful scaling behaves as those quantize calls do (delayed: every tensor reads the
 * state's scale and max-accumulates its amax into history row 0). What it buys is passes and
 * launches: a CUDA implementation updates and requantizes in one pass over the tensors (two
 * when the format needs a tensor-wide amax first), every tensor of the call in one launch per
 * pass. Asynchronous on `stream` (CUDA) with no host synchronization; a capturable hyper
 * (lr_device / step_device) is read on the device. On error the contents of every master,
 * moment and dst are unspecified.
 *
 * QR_EXTRA_ADAM_REQUANTIZE_SUPPORTS says whether the first serves quantizer `q` for tensors on
 * `device`, and with `capturable` (1) whether it then runs without host synchronization,
 * allocation or host-side state changes (CUDA-graph capture and replay give the eager result).
 * Returns 1, or 0 with the reason in `reason` (NUL-terminated, at most `capacity` bytes). The
 * host calls the extra only with quantizers it supports, and serves the others itself: the
 * update (the same arithmetic), then `quantize` into dst -- the same bytes in more passes. */
typedef struct qr_adam_hyper {
  uint32_t struct_size;
  int32_t adam_w_mode;      /* 1: decoupled weight decay (AdamW); 0: L2, g += weight_decay * p */
  double lr;                /* used when lr_device is NULL */
  const float* lr_device;   /* or the FP32 learning rate on the tensors' device, read by the step */
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  int64_t step;             /* step count after this step's increment (>= 1); used when
                               step_device is NULL */
  const float* step_device; /* or the FP32 step count on the tensors' device (torch's capturable
                               step tensor), already incremented, read by the step */
} qr_adam_hyper;

typedef struct qr_adam_tensor {
  uint32_t struct_size;
  qr_quantizer* quantizer;   /* a quantizer of this plugin; the one that made dst */
  const qr_adam_hyper* hyper;
  qr_tensor_view master;     /* F32, contiguous, 2-D [rows, cols]; updated in place */
  qr_tensor_view grad;       /* F32, BF16 or F16, contiguous, [rows, cols]; read only */
  qr_tensor_view exp_avg;    /* F32 or BF16, contiguous, [rows, cols]; updated in place */
  qr_tensor_view exp_avg_sq; /* F32 or BF16, contiguous, [rows, cols]; updated in place */
  qr_quantized_tensor* dst;  /* rows x cols; every direction it holds is rewritten */
} qr_adam_tensor;

#define QR_EXTRA_ADAM_REQUANTIZE "qr_adam_requantize"
typedef qr_status (*qr_adam_requantize_fn)(const qr_adam_tensor* tensors, uint32_t count,
                                           void* stream);
#define QR_EXTRA_ADAM_REQUANTIZE_SUPPORTS "qr_adam_requantize_supports"
typedef int32_t (*qr_adam_requantize_supports_fn)(qr_quantizer* q, qr_device device,
                                                  int32_t capturable, char* reason,
                                                  size_t capacity);

/* Fusing the two directions of a format built from two others into one read of the source: optional extras.
 *
 * A per-tensor cast is what a direction with one FP32 scale for the whole tensor (scale mode
 * TENSOR with E4M3 / E5M2 data) needs written, described without naming its format, so that
 * another plugin's quantize kernel can write it from the same read of the source:
 *   data[r][c] (data [rows, cols]), or data[c][r] when transposed (data [cols, rows]),
 *     = sat_rne(fp32(x[r][c]) * s) in `dtype`: round to nearest even, saturating to +-max,
 *       NaN -> 0x7F, sign of zero kept (qrecipe/conversions.hpp), with
 *   s = *scale when scale is set, else scale_from_amax(*amax, fmax, pow2_scales,
 *       amax_epsilon) (qrecipe/scaling.hpp), computed on the device.
 * Pointers are device pointers whose contents are ready in stream order (args->stream). */
typedef struct qr_tensor_cast {
  uint32_t struct_size;
  int32_t dtype;          /* QR_DTYPE_E4M3 or QR_DTYPE_E5M2 */
  int32_t transposed;     /* 0: data [rows, cols]; 1: data [cols, rows] */
  uint8_t* data;
  const float* scale;     /* the scale itself, or NULL: from amax by the rule above */
  const float* amax;      /* the rule's amax (used when scale is NULL) */
  float fmax;             /* 448 (E4M3) or 57344 (E5M2) */
  int32_t pow2_scales;
  float amax_epsilon;
  /* NULL, or max |x| over this very source (NaN ignored), already on the device: a fusing
   * plugin whose own direction needs exactly that amax may read it instead of a pass of its
   * own. NULL when the amax came from the caller (a reduced amax is not the source's). */
  const float* source_amax;
} qr_tensor_cast;

/* Extra of a plugin whose direction can be written as a per-tensor cast. args->usage names
 * exactly one direction d of dst. It runs everything quantize does for d except writing the
 * data (the amax pass, scale_inv and amax stores), stream-ordered on args->stream, and fills
 * *cast (data = d's data buffer). A QR_EXTRA_QUANTIZE_WITH_TENSOR_CAST call that writes *cast
 * then completes d byte for byte as quantize would have. It returns QR_STATUS_UNSUPPORTED
 * having written and advanced nothing when this quantizer cannot be described that way
 * (options such as delayed scaling, device, source dtype): quantize the directions apart. */
#define QR_EXTRA_PREPARE_TENSOR_CAST "qr_prepare_tensor_cast"
typedef qr_status (*qr_prepare_tensor_cast_fn)(qr_quantizer* q, const qr_tensor_view* src,
                                               const qr_quantize_args* args,
                                               qr_quantized_tensor* dst, qr_tensor_cast* cast);

/* Extra: exactly `quantize(q, src, args, dst)` plus writing `cast` from the same read of the
 * source. With dst == NULL it is a probe: it returns success when it would accept this call
 * (src, args->usage, cast->dtype, cast->transposed; the pointers of cast unused), else
 * QR_STATUS_UNSUPPORTED, and writes nothing. A real call that returns QR_STATUS_UNSUPPORTED has
 * written and advanced nothing (stochastic-rounding counter included). */
#define QR_EXTRA_QUANTIZE_WITH_TENSOR_CAST "qr_quantize_with_tensor_cast"
typedef qr_status (*qr_quantize_with_tensor_cast_fn)(qr_quantizer* q, const qr_tensor_view* src,
                                                     const qr_quantize_args* args,
                                                     qr_quantized_tensor* dst,
                                                     const qr_tensor_cast* cast);

/* Amax on the device (tensor/sequence parallelism, FSDP2 shards: the amax of a shard is
 * reduced across ranks on the device, with no host round trip): optional extras, two names.
 * A format with a per-tensor scale or amax (QR_SCALE_TENSOR / QR_SCALE_BLOCK_TENSOR, or a
 * stored amax) provides them; the host serves a plugin without them through `compute_amax`
 * / `quantize` and a copy of the two values through host memory (a device synchronization,
 * documented as the fallback; never a different result).
 *
 * QR_EXTRA_COMPUTE_AMAX_DEVICE writes exactly what `compute_amax` returns, [0] rowwise and
 * [1] columnwise, into amax_out: two consecutive F32 in the memory of src's device (host
 * memory for a CPU source), stream-ordered on `stream` (CUDA), with no host synchronization.
 *
 * QR_EXTRA_QUANTIZE_DEVICE_AMAX is exactly `quantize(q, src, args', dst)` where args' is args
 * with args'.amax pointing at the two F32 values at `amax` (same memory rules as above; on
 * CUDA read by the kernels in stream order, never copied to the host). args->amax must be
 * NULL. The values are used as they are, as a host amax would be (the scaling rules of
 * qrecipe/scaling.hpp decide what 0, inf and NaN give). Bytes, scales and amaxes written are
 * identical to the host-amax call. It returns QR_STATUS_UNSUPPORTED having written and
 * advanced nothing when this quantizer cannot take a device amax (e.g. delayed scaling): the
 * host then takes the fallback above. */
#define QR_EXTRA_COMPUTE_AMAX_DEVICE "qr_compute_amax_device"
typedef qr_status (*qr_compute_amax_device_fn)(qr_quantizer* q, const qr_tensor_view* src,
                                               void* stream, float* amax_out);
#define QR_EXTRA_QUANTIZE_DEVICE_AMAX "qr_quantize_device_amax"
typedef qr_status (*qr_quantize_device_amax_fn)(qr_quantizer* q, const qr_tensor_view* src,
                                                const qr_quantize_args* args, const float* amax,
                                                qr_quantized_tensor* dst);

/* Quantize and decode in one pass (emulated GEMMs, docs/gemm.md "Decoded operands"): an
 * optional extra. Where a GEMM has no tensor-core path for an operand pair (E8M0- or
 * E4M3-block-scaled codes on sm_90), the engine decodes each operand to BF16 before one BF16
 * GEMM. With this extra the
 * quantize kernel writes that BF16 operand itself, from the values it has in registers, instead
 * of the engine reading the bytes again in a second kernel.
 *
 * It covers block-scaled directions (QR_SCALE_BLOCK, QR_SCALE_BLOCK_TENSOR). The decoded
 * value of stored element (p, q) of direction d (data [data_shape[0], data_shape[1]], in the
 * stored order, transposed or not) is, in FP32,
 *   v = code_value(p, q) * block_scale(p, q)      (one FP32 multiply; a per-tensor factor is
 *                                                  NOT applied: the engine puts it in alpha)
 * written as the BF16 whose bits are the high 16 bits of v (truncation), except that every
 * NaN is written as 0x7FFF. miss[d] (one uint32 in the memory of dst's
 * device) is set to a nonzero value when some finite v of direction d has nonzero low 16 bits
 * (BF16 could not hold it; a GEMM reading d then recomputes its output from the stored bytes),
 * and left as it is otherwise. These are the values of the engine's own decoder, bit for bit.
 *
 * Call: exactly `quantize(q, src, args, dst)` (the same bytes, scales, amaxes, counters), plus
 * decoded->values[d] for each direction d with values[d] != NULL (d must be in args->usage),
 * stream-ordered on args->stream. decoded->values[d] holds data_shape[0] * data_shape[1] BF16
 * values (row-major, 16-byte aligned). It returns QR_STATUS_UNSUPPORTED having written and
 * advanced nothing when this quantizer cannot (options, source dtype, device): the host then
 * quantizes and decodes in two kernels, with the same results. A plugin without the extra is
 * served that way too. */
typedef struct qr_decoded_output {
  uint32_t struct_size;
  uint16_t* values[2]; /* [QR_DIRECTION_ROWWISE], [QR_DIRECTION_COLUMNWISE]; NULL: not wanted */
  uint32_t* miss[2];   /* per direction; never NULL where values[d] is set */
} qr_decoded_output;
#define QR_EXTRA_QUANTIZE_DECODED "qr_quantize_decoded"
typedef qr_status (*qr_quantize_decoded_fn)(qr_quantizer* q, const qr_tensor_view* src,
                                            const qr_quantize_args* args,
                                            qr_quantized_tensor* dst,
                                            const qr_decoded_output* decoded);

/* Exported symbols of every plugin:
 *   const uint32_t qrecipe_plugin_abi = QR_PLUGIN_ABI_VERSION;   (read without running code)
 *   const qr_plugin_descriptor* qrecipe_plugin_entry(const qr_host_api* host);
 */
#define QR_PLUGIN_ABI_SYMBOL "qrecipe_plugin_abi"
#define QR_PLUGIN_ENTRY_SYMBOL "qrecipe_plugin_entry"
typedef const qr_plugin_descriptor* (*qr_plugin_entry_fn)(const qr_host_api* host);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* Released-layout guards: the last slot of each released version keeps its offset forever. */
#if defined(__cplusplus)
#define QR_ABI_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define QR_ABI_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif
#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
QR_ABI_STATIC_ASSERT(offsetof(qr_plugin_descriptor, describe) == 120,
                     "qr_plugin_descriptor v1 layout changed: append new slots at the end");
QR_ABI_STATIC_ASSERT(offsetof(qr_plugin_descriptor, describe) + sizeof(void*) ==
                         QR_PLUGIN_DESCRIPTOR_SIZE_V1,
                     "QR_PLUGIN_DESCRIPTOR_SIZE_V1 must stay the released v1 descriptor size");
QR_ABI_STATIC_ASSERT(offsetof(qr_plugin_descriptor, tensor_scale_numerator) == 128,
                     "qr_plugin_descriptor: tensor_scale_numerator (appended after v1) moved");
QR_ABI_STATIC_ASSERT(offsetof(qr_host_api, quantizer_describe) == 112,
                     "qr_host_api v1 layout changed: append new slots at the end");
QR_ABI_STATIC_ASSERT(offsetof(qr_quantize_args, stream) == 32,
                     "qr_quantize_args v1 layout changed: append new fields at the end");
QR_ABI_STATIC_ASSERT(offsetof(qr_quantized_tensor, columnwise) == 40 + sizeof(qr_direction_data),
                     "qr_quantized_tensor v1 layout changed: append new fields at the end");
QR_ABI_STATIC_ASSERT(offsetof(qr_option_schema, required) == 72,
                     "qr_option_schema v1 layout changed: append new fields at the end");
QR_ABI_STATIC_ASSERT(offsetof(qr_tensor_view, strides) == 96,
                     "qr_tensor_view v1 layout changed: append new fields at the end");
/* Embedded by value in other structs: these sizes can never change (see the rules above). */
QR_ABI_STATIC_ASSERT(sizeof(qr_device) == 8, "qr_device is embedded by value: it cannot grow");
QR_ABI_STATIC_ASSERT(sizeof(qr_tensor_view) == 160,
                     "qr_tensor_view is embedded by value in qr_direction_data: it cannot grow");
QR_ABI_STATIC_ASSERT(sizeof(qr_direction_layout) == 88,
                     "qr_direction_layout is embedded by value in qr_direction_data: it cannot grow");
QR_ABI_STATIC_ASSERT(sizeof(qr_direction_data) == 8 + 88 + 3 * 160,
                     "qr_direction_data is embedded by value in qr_quantized_tensor: it cannot grow");
#endif

#endif /* QRECIPE_PLUGIN_ABI_H */
