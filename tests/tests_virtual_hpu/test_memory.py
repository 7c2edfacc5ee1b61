"""Per-device memory accounting, its Gaudi-style statistics, the pool of freed blocks, and the out-of-memory limit."""

import json

import habana_frameworks.torch.hpu as hthpu
import torch

KEYS = {
    "Limit",
    "InUse",
    "MaxInUse",
    "NumAllocs",
    "NumFrees",
    "ActiveAllocs",
    "MaxAllocSize",
    "TotalSystemAllocs",
    "TotalSystemFrees",
    "TotalActiveAllocs",
}


def test_stats_follow_allocations_and_frees():
    device = "hpu:6"  # a device no other test uses
    before = hthpu.memory_stats(device)
    assert set(before) == KEYS
    assert before["Limit"] == 98304 * 2**20
    x = torch.empty(1024, 256, device=device)  # 1 MiB
    during = hthpu.memory_stats(device)
    assert during["InUse"] - before["InUse"] == 2**20
    assert during["NumAllocs"] == before["NumAllocs"] + 1
    assert during["ActiveAllocs"] == before["ActiveAllocs"] + 1
    assert during["MaxInUse"] >= during["InUse"]
    assert during["MaxAllocSize"] >= 2**20
    assert hthpu.memory_allocated(6) == during["InUse"]
    y = x * 2  # result of the fallback, adopted as device memory
    assert hthpu.memory_allocated(device) - during["InUse"] == 2**20
    del x, y
    after = hthpu.memory_stats(device)
    assert after["InUse"] == before["InUse"]
    assert after["NumFrees"] == before["NumFrees"] + 2
    assert after["MaxInUse"] >= before["InUse"] + 2 * 2**20
    hthpu.reset_peak_memory_stats(device)
    assert hthpu.max_memory_allocated(device) == after["InUse"]
    free, total = hthpu.mem_get_info(device)
    assert total == after["Limit"] and free == total - after["InUse"]


def test_freed_blocks_are_pooled_for_reuse(python):
    result = python(
        """
        import json, torch, virtual_hpu
        virtual_hpu.activate()
        import habana_frameworks.torch.hpu as hthpu
        def state():
            stats = hthpu.memory_stats(2)
            return [hthpu.memory_allocated(2), hthpu.memory_reserved(2), stats["NumAllocs"],
                    stats["TotalSystemAllocs"], stats["TotalSystemFrees"]]
        seen = [state()]
        x = torch.empty(2**20, dtype=torch.uint8, device="hpu:2")
        address = x.data_ptr()
        del x
        seen.append(state())
        y = torch.empty(2**20 - 2**15, dtype=torch.uint8, device="hpu:2")  # the same size class
        seen.append([*state(), y.data_ptr() == address])
        del y
        z = torch.empty(2**19, dtype=torch.uint8, device="hpu:2")  # another class: pool and z exceed the peak
        del z
        seen.append(state())
        z = torch.empty(2**19, dtype=torch.uint8, device="hpu:2")
        del z
        seen.append(state())
        small = torch.empty(2**10, dtype=torch.uint8, device="hpu:2")
        del small
        seen.append(state())
        hthpu.reset_peak_memory_stats(2)
        seen.append([hthpu.max_memory_reserved(2), hthpu.memory_cached(2), hthpu.max_memory_cached(2)])
        print(json.dumps(seen))
        """
    )
    assert result.returncode == 0, result.stderr
    MiB = 2**20
    fresh, freed, reused, bounded, again, small, peaks = json.loads(result.stdout.strip().splitlines()[-1])
    assert fresh == [0, 0, 0, 0, 0]
    assert freed == [0, MiB, 1, 1, 0]  # freed to the pool: still reserved, not handed back
    assert reused == [MiB - 2**15, MiB, 2, 1, 0, True]  # served from the pool: no new system allocation
    # z came from the host; with x's block, the pool would hold 1.5 MiB, more than the device ever had in use: the
    # block freed longest ago (x's) goes back to the host, and z's is kept
    assert bounded == [0, MiB // 2, 3, 2, 1]
    assert again == [0, MiB // 2, 4, 2, 1]  # the newest size is served from the pool
    assert small == [0, MiB // 2, 5, 3, 2]  # blocks under 64 KiB go back to the host at once
    assert peaks == [MiB // 2] * 3


def test_devices_are_accounted_separately():
    other = hthpu.memory_allocated("hpu:7")
    x = torch.ones(1000, device="hpu:5")
    assert hthpu.memory_allocated("hpu:7") == other
    assert hthpu.memory_allocated(5) >= x.numel() * 4


def test_out_of_memory_names_device_and_sizes(python):
    result = python(
        """
        import torch, virtual_hpu
        virtual_hpu.activate()
        import habana_frameworks.torch.hpu as hthpu
        keep = torch.empty(3 * 2**20 // 4, device="hpu:1")  # 3 MiB of 4
        try:
            torch.empty(2 * 2**20 // 4, device="hpu:1")
        except torch.OutOfMemoryError as err:
            print(err)
        # the refused block is neither booked nor kept
        print(hthpu.memory_reserved(1) == hthpu.memory_allocated(1) == 3 * 2**20)
        big = torch.empty(2**20 // 4, device="hpu:0") * 1  # other devices are unaffected
        print(big.shape[0])
        """,
        VIRTUAL_HPU_MEMORY_MB="4",
    )
    assert result.returncode == 0, result.stderr
    message, nothing_kept, count = result.stdout.strip().splitlines()
    assert message.startswith("HPU out of memory on hpu:1: tried to allocate 2.00 MiB; 3.00 MiB in use of 4.00 MiB")
    assert "VIRTUAL_HPU_MEMORY_MB" in message
    assert nothing_kept == "True"
    assert count == str(2**20 // 4)
