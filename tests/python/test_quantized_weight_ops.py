"""QuantizedWeight under the torch ops FSDP2, DTensor, ``to_empty`` and checkpoints apply to a
parameter (quantized_param.py, quantized_rows.py, quantized_storage.py), single process:
row views and their bytes per format, joins, zeros, the columnwise copy built from the
rowwise one, copies into row ranges, the refusals (each message), meta-device weights and
``torch.load(weights_only=True)``. The multi-process FSDP2 suite is test_fsdp.py."""
import io

import pytest
import torch

import qrecipe
from qrecipe.quantized_param import QuantizedWeight
from qrecipe.quantized_rows import (columnwise_from_rowwise, columnwise_is_transpose,
                                    empty_parts, parts_of, row_multiple)

# Every format, with the row multiple a cut must respect (quantized_rows.row_multiple).
FORMATS = {
    "float8": ({"format": "float8"}, 1),
    "float8_delayed": ({"format": "float8", "scaling": "delayed"}, 1),
    "mxfp8": ({"format": "mxfp8"}, 32),
    "blockwise_1x128": ({"format": "blockwise", "block": "1x128"}, 128),
    "blockwise_128x128": ({"format": "blockwise", "block": "128x128"}, 128),
    "nvfp4": ({"format": "nvfp4"}, 16),
    "nvfp4_2d": ({"format": "nvfp4", "2d": True}, 16),
    "hybrid": ({"format": "hybrid", "rowwise": {"format": "float8"},
                "columnwise": {"format": "mxfp8"}}, 32),
}
BOTH = qrecipe.quantization.ROWWISE | qrecipe.quantization.COLUMNWISE


def quantizer_of(spec):
    recipe = qrecipe.Recipe.from_dict({"version": 1, "name": "t", "defaults": spec})
    return recipe.engine.resolve("linear", "weight", "w")


def weight_of(spec, rows=256, cols=256, groups=1, seed=0):
    torch.manual_seed(seed)
    values = torch.randn(rows, cols) * 3
    return values, QuantizedWeight.from_tensor(values, quantizer_of(spec), groups=groups)


def buffers(t):
    """{direction: {kind: tensor}} of a QuantizedWeight of one group or an engine tensor."""
    cpp = t.engine_tensor if isinstance(t, QuantizedWeight) else t
    return parts_of(cpp)


def assert_same_bytes(a, b):
    pa, pb = buffers(a), buffers(b)
    assert pa.keys() == pb.keys()
    for d in pa:
        for k in pa[d]:
            if pa[d][k] is None:
                assert pb[d][k] is None, (d, k)
            else:
                assert torch.equal(pa[d][k], pb[d][k]), (d, k)


def reference_rows(quantizer, full_values, start, stop):
    """Rows [start, stop) quantized alone with the whole tensor's amax (what a row range of
    the whole tensor's bytes must equal)."""
    amax = quantizer.compute_amax(full_values.contiguous())
    return quantizer.quantize(full_values[start:stop].contiguous(), BOTH, amax=amax)


@pytest.mark.parametrize("name", FORMATS)
def test_row_views_hold_the_bytes_of_their_rows_and_join_back(name):
    spec, multiple = FORMATS[name]
    rows = max(256, 4 * multiple)  # four views, each a whole number of scale blocks
    q_rows = rows // 4
    values, w = weight_of(spec, rows=rows)
    q = w._qstorage.quantizer
    assert w.row_multiple == multiple == row_multiple(q, 256)
    parts = torch.chunk(w, 4)  # FSDP2's _chunk_with_empty: aten.split
    assert all(type(p) is QuantizedWeight and p.format == w.format for p in parts)
    for i, p in enumerate(parts):
        assert p.shape == (q_rows, 256) and p._qstorage is w._qstorage  # views, same storage
        assert_same_bytes(p, reference_rows(q, values, q_rows * i, q_rows * (i + 1)))
        assert torch.equal(p.dequantize(), w.dequantize()[q_rows * i:q_rows * (i + 1)])
    n = w.narrow(0, rows // 2, rows // 2)
    assert_same_bytes(n, reference_rows(q, values, rows // 2, rows))
    # The view of everything is the weight itself (an alias, no copy).
    whole = w.narrow(0, 0, rows)
    assert whole._qstorage is w._qstorage and whole.engine_tensor is w.engine_tensor
    # Rows copied into a fresh weight of the same rows and joined back: the same bytes.
    fresh = w.new_zeros(w.shape)
    for i, p in enumerate(parts):
        fresh.narrow(0, q_rows * i, q_rows).copy_(p)
    assert fresh._qstorage.canonical and len(fresh._qstorage.pieces) == 1
    assert_same_bytes(fresh, w)


@pytest.mark.parametrize("name", [n for n in FORMATS if FORMATS[n][1] > 1])
def test_a_cut_inside_a_scale_block_is_refused_with_the_multiple(name):
    spec, multiple = FORMATS[name]
    _, w = weight_of(spec)
    with pytest.raises(ValueError, match=rf"aten.split.*row {multiple // 2}.*{w.format}.*"
                                         rf"multiples of {multiple} rows.*world size x "
                                         rf"{multiple}"):
        w.split(multiple // 2)
    with pytest.raises(ValueError, match=rf"aten.slice.*multiples of {multiple} rows"):
        w[multiple // 2:]


def test_grouped_weight_views_cut_within_groups():
    spec, multiple = FORMATS["mxfp8"]
    values, w = weight_of(spec, rows=192, groups=3)  # groups of 64 rows, own scales each
    q = w._qstorage.quantizer
    halves = w.chunk(2)  # rows [0, 96) and [96, 192): group 1 is cut at its row 32
    assert [h.num_groups for h in halves] == [2, 2]
    assert_same_bytes(halves[0].group(1), q.quantize(values[64:96].contiguous(), BOTH))
    with pytest.raises(ValueError, match="multiples of 32 rows"):
        w.split([80, 112])  # row 16 of group 1
    # A cut at a group boundary is fine whatever the multiple.
    ok = w.split([64, 128])
    assert ok[1].num_groups == 2


@pytest.mark.parametrize("name", ["float8", "mxfp8", "nvfp4"])
def test_zeros_empty_and_plain_buffers_like_a_weight(name):
    spec, _ = FORMATS[name]
    _, w = weight_of(spec)
    for made in (w.new_zeros(w.shape), torch.empty_like(w), torch.zeros_like(w),
                 w.new_empty((128, 256)), w.new_empty_strided((128, 256), (256, 1))):
        assert type(made) is QuantizedWeight and made.options == w.options
        assert torch.equal(made.dequantize(), torch.zeros(made.shape))
    # A dtype given: a plain buffer shaped like the weight (main_grad).
    main_grad = torch.zeros_like(w, dtype=torch.float32)
    assert type(main_grad) is torch.Tensor and main_grad.shape == w.shape


@pytest.mark.parametrize("name", ["float8", "float8_delayed", "blockwise_128x128", "nvfp4_2d"])
def test_columnwise_copy_built_from_the_rowwise_one_is_exact(name):
    spec, _ = FORMATS[name]
    for rows, cols in ((256, 384), (160, 96)):
        torch.manual_seed(1)
        values = torch.randn(rows, cols) * 5
        q = quantizer_of(spec)
        assert columnwise_is_transpose(q)
        full = parts_of(q.quantize(values, BOTH))
        built = empty_parts(q, rows, cols, qrecipe.quantization.COLUMNWISE, "cpu")["columnwise"]
        for t in built.values():
            if t is not None:
                t.fill_(77)  # every byte is written (padding zeroed)
        columnwise_from_rowwise(q, rows, cols, full["rowwise"], built)
        for kind, t in built.items():
            if t is not None:
                assert torch.equal(t, full["columnwise"][kind]), (name, rows, kind)


@pytest.mark.parametrize("name", ["mxfp8", "blockwise_1x128", "nvfp4", "hybrid"])
def test_formats_quantizing_columnwise_on_their_own_are_not_derived(name):
    assert not columnwise_is_transpose(quantizer_of(FORMATS[name][0]))


def test_copy_of_values_into_row_ranges():
    # Block formats: rows quantized alone are the whole tensor's rows.
    values, w = weight_of(FORMATS["mxfp8"][0])
    target = torch.zeros_like(w)
    target[64:128].copy_(values[64:128])
    assert torch.equal(target.dequantize()[64:128], w.dequantize()[64:128])
    assert torch.equal(target.dequantize()[:64], torch.zeros(64, 256))
    # Per-tensor scaled formats: part of the rows cannot be quantized alone.
    values, w = weight_of(FORMATS["float8"][0])
    with pytest.raises(ValueError, match="rows \\[64, 128\\) of a float8 tensor.*share one "
                                         "per-tensor scale.*Copy the whole weight"):
        w[64:128].copy_(values[64:128])
    # ...but bytes of the same tensor can be copied into rows: they carry its scale.
    fresh = torch.zeros_like(w)
    fresh[:128].copy_(w[:128])
    assert len(fresh._qstorage.pieces) == 2  # zero rows keep their own scale until written
    fresh[128:].copy_(w[128:])
    assert len(fresh._qstorage.pieces) == 1
    assert_same_bytes(fresh, w)
    # Bytes quantized with another scale cannot join the weight's.
    _, other = weight_of(FORMATS["float8"][0], seed=5)
    fresh[:128].copy_(other[:128])
    with pytest.raises(ValueError, match="different per-tensor scales"):
        fresh._qstorage.canonical_parts("test")


def test_refused_ops_name_the_op_the_format_and_what_to_do():
    _, w = weight_of(FORMATS["mxfp8"][0])
    with pytest.raises(RuntimeError, match="aten.split_with_sizes.*mxfp8.*along dim 1.*dim 0"):
        w.split([128, 128], dim=1)
    with pytest.raises(RuntimeError, match="aten.slice.*mxfp8.*along dim 1.*w.dequantize"):
        w[:, :128]
    with pytest.raises(RuntimeError, match="aten.ones_like.*mxfp8.*never dequantizes a "
                                           "parameter silently.*copy_ it into"):
        torch.ones_like(w)
    with pytest.raises(RuntimeError, match="aten.as_strided.*mxfp8.*contiguous views of whole "
                                           "rows"):
        torch.as_strided(w, (256, 128), (1, 256))  # not contiguous
    with pytest.raises(RuntimeError, match="add_.*in place"):
        w.detach().add_(1)
    with pytest.raises(RuntimeError, match="aten.split.*mxfp8.*do not hold whole rows"):
        w.view(-1).split(100)


def test_value_ops_still_read_the_decoded_tensor():
    values, w = weight_of(FORMATS["float8"][0])
    d = w.dequantize()
    assert type(w * 2) is torch.Tensor and torch.equal(w * 2, d * 2)
    assert torch.equal(w.t(), d.t()) and torch.equal(w[3], d[3])
    assert torch.equal(w.float(), d)
    flat = w.view(-1)  # metadata only: the same bytes
    assert type(flat) is QuantizedWeight and flat._qstorage is w._qstorage
    assert torch.equal(flat.dequantize(), d.reshape(-1))
    back = torch.as_strided(flat, (256, 256), (256, 1), 0)
    assert back._qstorage is w._qstorage and not w.is_pinned()


def test_meta_weights_materialize_quantized():
    recipe = qrecipe.Recipe.builtin("mxfp8")
    with torch.device("meta"), qrecipe.quantized_model_init(recipe):
        layer = qrecipe.nn.Linear(64, 96, name="fc")
        experts = qrecipe.nn.GroupedLinear(3, 64, 32, name="experts")
    for w in (layer.weight, experts.weight):
        assert isinstance(w, QuantizedWeight) and w.is_meta and w.format == "mxfp8"
    assert experts.weight.num_groups == 3
    with pytest.raises(RuntimeError, match="meta device and holds no bytes.*to_empty"):
        layer.weight.dequantize()
    layer.to_empty(device="cpu")
    experts.to_empty(device="cpu")
    assert isinstance(layer.weight, QuantizedWeight) and not layer.weight.is_meta
    torch.manual_seed(4)
    layer.reset_parameters()
    experts.reset_parameters()
    torch.manual_seed(4)
    plain = qrecipe.nn.Linear(64, 96, name="fc")
    q = recipe.engine.resolve("linear", "weight", "fc")
    assert_same_bytes(layer.weight, q.quantize(plain.weight.detach(), BOTH))
    assert torch.equal(layer.bias, plain.bias)
    assert experts.weight.num_groups == 3 and not experts.weight.is_meta


def test_state_dict_loads_with_weights_only_and_no_allow_list():
    _, w = weight_of(FORMATS["nvfp4"][0], groups=2)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(w)
    buffer = io.BytesIO()
    torch.save(layer.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["weight"]
    assert type(loaded) is QuantizedWeight and loaded.num_groups == 2
    for i in range(2):
        assert_same_bytes(loaded.group(i), w.group(i))
