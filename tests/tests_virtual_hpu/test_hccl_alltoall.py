"""all_to_all of tensor lists over the virtual HCCL with a size for each pair of ranks, as HCCL takes them (gloo has no
such call before torch 2.12 and one size for all pairs since): torch's differentiable all_gather (Lightning's
``all_gather(sync_grads=True)``) calls it in its backward."""

from tests_virtual_hpu.test_hccl import _run_ranks

_ALL_TO_ALL = """
import torch.distributed.nn.functional as differentiable

dist.init_process_group("hccl", device_id=torch_support.hpu_group_device(device), timeout=timedelta(seconds=60))
# rank r sends rank j (j + 1) values of 10 r + j, as a (j + 1, 1) tensor: sizes differ per pair
inputs = [torch.full((j + 1, 1), 10.0 * rank + j, device=device) for j in range(world_size)]
outputs = [torch.empty(rank + 1, 1, device=device) for _ in range(world_size)]
dist.all_to_all(outputs, inputs)
results["all_to_all"] = [[str(t.device), t.flatten().tolist()] for t in outputs]

x = torch.full((2,), float(rank + 1), device=device, requires_grad=True)
gathered = differentiable.all_gather(x)
(sum((i + 1) * t for i, t in enumerate(gathered)).sum()).backward()
results["all_gather_grad"] = [str(x.grad.device), x.grad.tolist()]
dist.destroy_process_group()
report()
"""


def test_all_to_all_with_a_size_per_pair_and_the_differentiable_all_gather(tmp_path):
    ranks = _run_ranks(_ALL_TO_ALL, tmp_path, str(tmp_path / "rendezvous"))
    for rank, results in enumerate(ranks):
        assert results["all_to_all"] == [[f"hpu:{rank}", [10.0 * r + rank] * (rank + 1)] for r in range(2)]
        # each rank's x appears in both ranks' loss with weight (its rank + 1): summed over the 2 ranks
        assert results["all_gather_grad"] == [f"hpu:{rank}", [2.0 * (rank + 1)] * 2]
