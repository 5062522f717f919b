"""qrecipe.optim.FusedAdam on CUDA (run by tools/gpu_check.sh on a GPU machine; skipped
without one): the same model trained on the CPU and on CUDA holds the same masters, moments
and quantized bytes after every step, bit for bit (two NaNs compare equal whatever their
payloads), under every shipped recipe: the fused kernels of float8 (current and delayed),
mxfp8, blockwise and nvfp4, and the two-pass path of the hybrid recipes; the fused path writes
what the two-pass path writes; and a capturable step captured in a CUDA graph and replayed
equals the eager steps."""
import copy

import pytest
import torch

import qrecipe
from qrecipe.optim import FusedAdam
from test_optim import DTYPE, HYPER, RECIPES, quantized_bytes, quantized_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

FUSED = {"default", "float8_delayed", "float8_e4m3", "float8_bf16_ends", "mxfp8", "blockwise",
         "nvfp4"}


def cuda_twin(model):
    """`model` copied to CUDA parameter by parameter (a QuantizedWeight's bytes move as they
    are: QuantizedWeight.to(device))."""
    twin = copy.deepcopy(model)
    for module in twin.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            setattr(module, name, torch.nn.Parameter(p.detach().to("cuda"),
                                                     requires_grad=p.requires_grad))
    return twin


def grads_for(model, step, device):
    g = torch.Generator().manual_seed(100 + step)
    out = []
    for p in model.parameters():
        x = torch.randn(p.shape, generator=g) * 0.01
        if p.numel() > 8:
            x.view(-1)[5] = float("nan") if step == 2 else x.view(-1)[5]
        out.append(x.to(p.dtype).to(device))
    return out


def same(a, b, what):
    a, b = a.cpu(), b.cpu()
    assert a.dtype == b.dtype and a.shape == b.shape, what
    if a.is_floating_point():
        both_nan = torch.isnan(a) & torch.isnan(b)
        assert torch.equal(torch.where(both_nan, 0, a.view(torch.int16 if a.element_size() == 2
                                                                else torch.int32)),
                           torch.where(both_nan, 0, b.view(torch.int16 if b.element_size() == 2
                                                           else torch.int32))), what
    else:
        assert torch.equal(a, b), what


def compare_models(cpu, gpu, opt_cpu, opt_gpu, what):
    for i, (p, q) in enumerate(zip(cpu.parameters(), gpu.parameters())):
        for key, value in opt_cpu.state[p].items():
            if key != "step":
                same(value, opt_gpu.state[q][key], f"{what}: param {i} {key}")
        if isinstance(p, qrecipe.QuantizedWeight):
            for k, (a, b) in enumerate(zip(quantized_bytes(p), quantized_bytes(q))):
                if a is None or b is None:
                    assert a is None and b is None
                else:
                    same(a, b, f"{what}: param {i} buffer {k}")
        else:
            same(p.detach(), q.detach(), f"{what}: param {i}")


@pytest.mark.parametrize("name", RECIPES)
@pytest.mark.parametrize("fused", [True, False])
def test_cuda_step_equals_cpu_step(name, fused):
    _, cpu = quantized_model(name, keep=False)
    _, gpu_source = quantized_model(name, keep=False)  # its own recipe objects: own states
    gpu = cuda_twin(gpu_source)
    opt_cpu = FusedAdam(cpu.parameters(), **HYPER)
    opt_gpu = FusedAdam(gpu.parameters(), **HYPER)
    opt_gpu._fused = fused
    for step in range(1, 4):
        for p, g in zip(cpu.parameters(), grads_for(cpu, step, "cpu")):
            p.grad = g
        for p, g in zip(gpu.parameters(), grads_for(gpu, step, "cuda")):
            p.grad = g
        opt_cpu.step()
        opt_gpu.step()
        torch.cuda.synchronize()
        compare_models(cpu, gpu, opt_cpu, opt_gpu, f"{name} step {step}")
    for label, path in opt_gpu.last_paths.items():
        if "QuantizedWeight" not in label:
            assert path == "plain", label
        elif fused and name in FUSED:
            assert path == "fused", label
        else:
            assert path == "two_pass", label


def unaligned(g):
    """g's values in a tensor whose data starts one element into its storage: its address is
    not 8- or 16-byte aligned, so the kernels take their element-by-element path."""
    out = torch.empty(g.numel() + 1, dtype=g.dtype, device=g.device)[1:].view(g.shape)
    out.copy_(g)
    assert out.data_ptr() % 8 != 0
    return out


@pytest.mark.parametrize("name", RECIPES)
def test_cuda_step_with_unaligned_gradients_equals_cpu(name):
    _, cpu = quantized_model(name, keep=False)
    _, gpu_source = quantized_model(name, keep=False)
    gpu = cuda_twin(gpu_source)
    opt_cpu = FusedAdam(cpu.parameters(), **HYPER)
    opt_gpu = FusedAdam(gpu.parameters(), **HYPER)
    for step in range(1, 3):
        for p, g in zip(cpu.parameters(), grads_for(cpu, step, "cpu")):
            p.grad = g
        for p, g in zip(gpu.parameters(), grads_for(gpu, step, "cuda")):
            p.grad = unaligned(g)
        opt_cpu.step()
        opt_gpu.step()
        torch.cuda.synchronize()
        compare_models(cpu, gpu, opt_cpu, opt_gpu, f"{name} unaligned grads step {step}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("master_weights", [True, False])
def test_cuda_plain_parameters_equal_cpu(dtype, master_weights):
    torch.manual_seed(0)
    cpu = [torch.nn.Parameter(torch.randn(s).to(dtype)) for s in [(7,), (33, 65), (256, 40)]]
    gpu = [torch.nn.Parameter(p.detach().cuda()) for p in cpu]
    opt_cpu = FusedAdam(cpu, master_weights=master_weights, exp_avg_dtype=torch.bfloat16, **HYPER)
    opt_gpu = FusedAdam(gpu, master_weights=master_weights, exp_avg_dtype=torch.bfloat16, **HYPER)
    for step in range(3):
        for p, q in zip(cpu, gpu):
            g = torch.randn(p.shape).to(torch.bfloat16)
            # torch refuses a .grad of another dtype than the parameter's: main_grad
            p.main_grad, q.main_grad = g, g.cuda()
        opt_cpu.step()
        opt_gpu.step()
    for p, q in zip(cpu, gpu):
        same(p.detach(), q.detach(), str(dtype))
        for key in opt_cpu.state[p]:
            if key != "step":
                same(opt_cpu.state[p][key], opt_gpu.state[q][key], f"{dtype} {key}")


@pytest.mark.parametrize("name", sorted(FUSED))
def test_capturable_step_replays_in_a_cuda_graph(name):
    _, source = quantized_model(name, keep=False)
    graphed, eager = cuda_twin(source), cuda_twin(source)
    lr = 2.0 ** -10  # exact in float32: the device lr equals the eager one
    opt_graph = FusedAdam(graphed.parameters(), capturable=True,
                          lr=torch.tensor(lr, device="cuda"), betas=HYPER["betas"],
                          eps=HYPER["eps"], weight_decay=HYPER["weight_decay"])
    opt_eager = FusedAdam(eager.parameters(), lr=lr, betas=HYPER["betas"], eps=HYPER["eps"],
                          weight_decay=HYPER["weight_decay"])
    static = [torch.zeros(p.shape, dtype=p.dtype, device="cuda") for p in graphed.parameters()]
    for p, g in zip(graphed.parameters(), static):
        p.grad = g

    def feed(step):
        grads = grads_for(graphed, step, "cuda")
        for s, g in zip(static, grads):
            s.copy_(g)
        for p, g in zip(eager.parameters(), grads):
            p.grad = g.clone()

    # Step 1 eager on a side stream (creates the state, moves delayed-scaling states), then
    # capture step 2 and replay it for steps 2..4.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        feed(1)
        opt_graph.step()
        opt_eager.step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    feed(2)
    with torch.cuda.graph(graph):
        opt_graph.step()
    for step in range(2, 5):
        if step > 2:
            feed(step)
        graph.replay()
        opt_eager.step()
        torch.cuda.synchronize()
        compare_models(eager, graphed, opt_eager, opt_graph, f"{name} replay step {step}")
    assert all(float(opt_graph.state[p]["step"]) == 4.0 for p in graphed.parameters())
