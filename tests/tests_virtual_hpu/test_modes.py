"""What the virtual device keeps between ops (pooled alias objects, caches) carries nothing of the mode it was made in:
work in ``torch.inference_mode()``, ``torch.no_grad()`` or autocast changes nothing for the work after it."""

import textwrap

import pytest
import torch

from virtual_hpu import torch_support

# A CPU-only op, so that on hpu tensors it runs through the device's fallback on CPU aliases of their memory: it tells
# whether the alias it was given is an inference tensor.
PEEK = """
import torch

torch.library.define("modes_test::is_inference", "(Tensor t) -> bool")

@torch.library.impl("modes_test::is_inference", "cpu")
def _(t):
    return t.is_inference()

is_inference = torch.ops.modes_test.is_inference
"""


def test_aliases_made_in_inference_mode_are_not_reused_outside_it(python):
    result = python(
        PEEK
        + textwrap.dedent(
            """
        x = torch.ones(3, device="hpu")
        with torch.inference_mode():
            for _ in range(3):
                (x * 2).sum()  # each op hands its CPU aliases back to the thread's pool
            inside = is_inference(x)
        outside = [is_inference(x) for _ in range(3)]
        with torch.inference_mode():
            again = is_inference(x)
        print(inside, outside, again)
        """
        ),
        VIRTUAL_HPU="1",
    )
    assert result.returncode == 0, result.stderr
    # as on the CPU: a tensor made in inference mode is an inference tensor, one made outside it is not
    assert result.stdout.split("\n")[-2] == "True [False, False, False] True"


def test_all_gather_after_inference_mode_work(python, tmp_path):
    """DDP's constructor runs an all_gather; after a validation loop in inference mode it failed on the virtual device
    with "Inplace update to inference tensor outside InferenceMode" (gloo copies into the output's CPU alias)."""
    result = python(
        f"""
        import os, torch, torch.distributed as dist, torch.multiprocessing as mp

        def run(rank):
            import virtual_hpu
            virtual_hpu.activate()
            dist.init_process_group("cpu:gloo,hpu:gloo", init_method="file://{tmp_path}/rendezvous", rank=rank,
                                    world_size=2)
            device = torch.device("hpu", rank)
            model = torch.nn.Linear(4, 2).to(device)
            with torch.inference_mode():
                for _ in range(2):
                    model(torch.randn(3, 4, device=device)).softmax(-1).sum()
            gathered = [torch.empty(2, device=device) for _ in range(2)]
            dist.all_gather(gathered, torch.full((2,), float(rank), device=device))
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            ddp(torch.randn(3, 4, device=device)).sum().backward()
            with open(os.path.join("{tmp_path}", f"rank{{rank}}.txt"), "w") as out:
                print([g.tolist() for g in gathered], model.weight.grad.sum().item(), file=out)
            del ddp
            dist.destroy_process_group()

        if __name__ == "__main__":
            mp.spawn(run, nprocs=2)
        """,
        script_dir=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    lines = [(tmp_path / f"rank{rank}.txt").read_text().split("]]") for rank in (0, 1)]
    assert lines[0][0] == lines[1][0] == "[[0.0, 0.0], [1.0, 1.0"
    assert lines[0][1] == lines[1][1]  # the gradients were averaged across the ranks


@pytest.mark.skipif(
    torch_support.installed() < torch_support.AUTOCAST_CACHE_KEEPS_GRAD_HISTORY,
    reason="needs torch 2.11: before, autocast trains on the weights it cast under the other mode, on CPU too",
)
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_training_after_a_mode_inside_autocast_is_unchanged_by_it(mode):
    """Work in another mode inside the same autocast region leaves nothing behind for the training after it (aliases,
    pooled memory, autocast's cache of cast weights): the same gradients as without that work, as on the CPU."""

    def grads(device: str, other_mode_first: bool) -> list:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(device)
        data = torch.randn(5, 8).to(device)
        with torch.autocast(device, dtype=torch.bfloat16):
            if other_mode_first:
                with getattr(torch, mode)():
                    model(data).log_softmax(-1).sum()
            loss = model(data).float().log_softmax(-1).sum()
        loss.backward()
        return [p.grad.cpu() for p in model.parameters()]

    for device in ("cpu", "hpu"):
        for first, without in zip(grads(device, True), grads(device, False)):
            torch.testing.assert_close(first, without, rtol=0, atol=0)
