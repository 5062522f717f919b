"""qrecipe.convert on a small transformer block."""
import pytest
import torch
import torch.nn.functional as F

import qrecipe


class Block(torch.nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.norm2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        split = lambda z: z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Block(), Block()])
        self.mha = torch.nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_convert_swaps_linears_keeping_parameters_and_naming_them():
    model = Model()
    params_before = {n: p for n, p in model.named_parameters()}
    x = torch.randn(2, 16, 32)
    y_before = model(x)
    assert qrecipe.convert(model) is model
    converted = {n: m for n, m in model.named_modules() if isinstance(m, qrecipe.nn.Linear)}
    assert sorted(converted) == sorted(
        [f"layers.{i}.{p}" for i in range(2) for p in ("qkv", "proj", "mlp.0", "mlp.2")]
        + ["head"])
    for name, module in converted.items():
        assert module.name == name
    # MultiheadAttention's out_proj (a Linear subclass it calls through F) is left alone.
    assert type(model.mha.out_proj) is not qrecipe.nn.Linear
    params_after = dict(model.named_parameters())
    assert params_after.keys() == params_before.keys()
    for n, p in params_after.items():
        assert p is params_before[n]
    assert torch.equal(model(x), y_before)  # outside autocast: unchanged, bit for bit
    with qrecipe.autocast():
        y = model(x)
    assert 0 < (y - y_before).norm() / y_before.norm() < 0.1


def test_filter_fn_and_optimizer_built_before_convert():
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    qrecipe.convert(model, filter_fn=lambda name, m: name != "head")
    assert type(model.head) is torch.nn.Linear
    assert isinstance(model.layers[0].qkv, qrecipe.nn.Linear)
    w = model.layers[0].qkv.weight.detach().clone()
    with qrecipe.autocast():
        loss = model(torch.randn(2, 16, 32)).square().mean()
    loss.backward()
    opt.step()
    assert not torch.equal(model.layers[0].qkv.weight, w)  # the optimizer's parameter moved


def test_convert_with_recipe_checks_roles_up_front():
    model = torch.nn.Sequential(torch.nn.Linear(8, 24))
    qrecipe.convert(model, recipe=qrecipe.Recipe.default())
    assert model[0].name == "0"
    single = qrecipe.convert(torch.nn.Linear(4, 4))
    assert isinstance(single, qrecipe.nn.Linear)
    with pytest.raises(TypeError):
        qrecipe.convert("not a model")


def test_converted_model_can_be_copied_and_saved(tmp_path):
    import copy
    model = qrecipe.convert(Model())
    x = torch.randn(2, 16, 32)
    with qrecipe.autocast():
        y = model(x)  # fills the role caches
    clone = copy.deepcopy(model)
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    with qrecipe.autocast():
        assert torch.equal(clone(x), y)
        assert torch.equal(loaded(x), y)
    assert loaded.layers[1].mlp[2].name == "layers.1.mlp.2"
