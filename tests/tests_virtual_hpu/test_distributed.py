"""c10d collectives on hpu tensors reach a gloo backend registered for hpu through the fallback."""


def test_gloo_collectives_and_ddp_on_hpu(python, tmp_path):
    result = python(
        f"""
        import os, torch, torch.distributed as dist, torch.multiprocessing as mp

        def run(rank):
            import virtual_hpu
            virtual_hpu.activate()
            dist.init_process_group("cpu:gloo,hpu:gloo", init_method="file://{tmp_path}/rendezvous", rank=rank,
                                    world_size=2)
            device = torch.device("hpu", rank)
            total = torch.full((3,), float(rank + 1), device=device)
            dist.all_reduce(total)
            gathered = [torch.empty(2, device=device) for _ in range(2)]
            dist.all_gather(gathered, torch.full((2,), float(rank), device=device))
            torch.manual_seed(0)
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2).to(device))
            torch.manual_seed(rank)
            model(torch.randn(3, 4, device=device)).sum().backward()
            grad = model.module.weight.grad
            # one file per rank: the ranks' prints would interleave on the shared pipe
            with open(os.path.join("{tmp_path}", f"rank{{rank}}.txt"), "w") as out:
                print(rank, total.device, total.tolist(), [g.tolist() for g in gathered], grad.sum().item(), file=out)
            # DDP before its group: a group released last by DDP's reducer is torn down with the GIL held, while a
            # gloo thread may need the GIL to free the context torch stashes during backward (a hang at exit)
            del model
            dist.destroy_process_group()

        if __name__ == "__main__":
            mp.spawn(run, nprocs=2)
        """,
        script_dir=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    lines = [(tmp_path / f"rank{rank}.txt").read_text().strip() for rank in (0, 1)]
    assert lines[0].startswith("0 hpu:0 [3.0, 3.0, 3.0] [[0.0, 0.0], [1.0, 1.0]]")
    assert lines[1].startswith("1 hpu:1 [3.0, 3.0, 3.0] [[0.0, 0.0], [1.0, 1.0]]")
    assert lines[0].split()[-1] == lines[1].split()[-1]  # gradients were averaged across ranks
