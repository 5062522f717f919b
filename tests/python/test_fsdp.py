"""FSDP2 (torch.distributed.fsdp.fully_shard) with quantized parameters, multi-process: world
sizes 1, 2 and 4 on the CPU with gloo on 127.0.0.1 (the GPU script runs world size 1 with
NCCL: QRECIPE_FSDP_BACKEND=nccl QRECIPE_FSDP_WORLDS=1). Each world size is ONE launch of
fsdp_cases.py in as many processes, bounded in time; the cases check themselves (see there)
and this file reports each case as a test:

- gather: per format (float8 current and delayed, mxfp8, blockwise 1x128 and 128x128, nvfp4
  1-D and 2-D, hybrid) the gathered weight and DTensor.full_tensor() equal the weight
  quantized whole, bit for bit; a step's output and gradients too;
- gather_grouped: GroupedLinear's single grouped parameter, shards cutting experts;
- bytes: the all-gather moves the format's bytes (counted at torch.distributed);
- training: ten steps of a two-block transformer equal single-process training bit for bit;
- delayed_state: the delayed-scaling states after three steps equal single-process ones;
- meta_init: meta device + quantized_model_init + fully_shard + to_empty + reset_parameters;
- dcp: torch.distributed.checkpoint round trip, and the world-size-2 checkpoint loaded at
  world size 4 (resharding);
- refusals: the shard-boundary and uneven-shard errors;
- adam_training: ten steps under FSDP2 + qrecipe.optim.FusedAdam equal single-process
  FusedAdam (losses, gathered weights, masters, moments) bit for bit, for float8 current and
  delayed, mxfp8 (fused path on the shards), nvfp4 and hybrid (shared-amax two-pass path);
- adam_grouped: the same for GroupedLinear's grouped parameter, shards cutting experts;
- adam_dcp: model + FusedAdam state through torch.distributed.checkpoint (torch's
  get/set_optimizer_state_dict), the step after loading equal to the saving run's; at world
  size 4 also world size 2's checkpoint (adam_dcp_reshard);
- adam_refusals: what FusedAdam refuses for quantized shards, and its messages.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
BACKEND = os.environ.get("QRECIPE_FSDP_BACKEND", "gloo")
WORLDS = [int(w) for w in os.environ.get("QRECIPE_FSDP_WORLDS", "1,2,4").split(",")]
# One launch (all its cases); generous for 4 processes on 2 loaded cores. A GPU script can
# lower it (QRECIPE_FSDP_TIMEOUT_S) so a hung launch reports its ranks' stacks in its time.
TIMEOUT_S = int(os.environ.get("QRECIPE_FSDP_TIMEOUT_S", "900"))
ADAM = ["adam_training", "adam_grouped", "adam_dcp", "adam_refusals"]
CASES = {
    1: ["gather", "gather_grouped", "bytes", "training", "delayed_state", "meta_init", "dcp"] +
    ADAM,
    2: ["gather", "gather_grouped", "bytes", "training", "delayed_state", "meta_init", "dcp",
        "refusals"] + ADAM,
    4: ["gather", "gather_grouped", "training", "meta_init", "dcp", "refusals"] + ADAM,
}

pytestmark = pytest.mark.skipif(
    not __import__("torch").distributed.is_available(), reason="torch without distributed")


def rank_logs(out: pathlib.Path, world: int) -> str:
    """The end of each rank's log (the ranks write them; nothing is buffered here)."""
    return "\n".join(f"--- rank {r}:\n" + (out / f"rank{r}.log").read_text()[-4000:]
                     for r in range(world))


def launch(world: int, out: pathlib.Path, cases, checkpoint=None) -> dict:
    """Runs fsdp_cases.py in `world` processes (torchrun's environment); {case: result}.

    The rendezvous store is this process's, bound to a port the kernel picks and held for
    the whole launch (as torchrun's agent does: TORCHELASTIC_USE_AGENT_STORE): a port that
    was only probed free could be taken by a concurrent launch before rank 0 binds it, and
    the ranks would then wait on someone else's store."""
    import torch.distributed as dist
    out.mkdir(parents=True, exist_ok=True)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
                   TORCHELASTIC_USE_AGENT_STORE="True", OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(sys.path))
        if BACKEND == "gloo":
            # CPU ranks. On a GPU host, FSDP2's default mesh would be a CUDA one (device
            # rank % GPUs), and a rank without its GPU fails while the others wait for it.
            env["CUDA_VISIBLE_DEVICES"] = ""
        command = [sys.executable, str(HERE / "fsdp_cases.py"), "--out", str(out),
                   "--backend", BACKEND, "--cases", ",".join(cases)]
        if checkpoint is not None:
            command += ["--checkpoint", str(checkpoint)]
        log = open(out / f"rank{rank}.log", "w")
        procs.append((subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT),
                      log))
    try:
        deadline = time.monotonic() + TIMEOUT_S
        for proc, _ in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for proc, _ in procs:  # each rank writes its stacks into its log (fsdp_cases.py)
            if proc.poll() is None:
                proc.send_signal(signal.SIGUSR1)
        time.sleep(3)
        for proc, _ in procs:
            proc.kill()
            proc.wait()
        pytest.fail(f"world size {world}: the launch ran past {TIMEOUT_S} s; logs in {out}:\n"
                    f"{rank_logs(out, world)}")
    finally:
        for _, log in procs:
            log.close()
        del store
    results = out / "results.json"
    if not results.exists():
        pytest.fail(f"world size {world}: no results (exit codes "
                    f"{[p.returncode for p, _ in procs]}):\n{rank_logs(out, world)}")
    return json.loads(results.read_text())


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """Every world size's launch, in order (world 4 loads world 2's checkpoint)."""
    root = tmp_path_factory.mktemp("fsdp")
    done = {}
    for world in WORLDS:
        done[world] = launch(world, root / f"world{world}", CASES.get(world, CASES[2]))
        if world == 4 and 2 in done:
            resharded = launch(4, root / "world4-reshard", ["dcp", "adam_dcp"],
                               root / "world2" / "checkpoint-2")
            done[4]["dcp_reshard"] = resharded["dcp"]
            done[4]["adam_dcp_reshard"] = resharded["adam_dcp"]
    return done


ALL = [(w, c) for w in WORLDS for c in CASES.get(w, CASES[2])] + \
    ([(4, "dcp_reshard"), (4, "adam_dcp_reshard")] if 2 in WORLDS and 4 in WORLDS else [])


@pytest.mark.parametrize("world,case", ALL, ids=[f"world{w}-{c}" for w, c in ALL])
def test_fsdp(launches, world, case):
    result = launches[world].get(case, "not run")
    assert result == "ok", f"world size {world}, case {case}:\n{result}"
