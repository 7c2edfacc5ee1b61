"""Per-device memory accounting, its Gaudi-style statistics, and the out-of-memory limit."""

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
    assert after["TotalSystemAllocs"] == after["NumAllocs"]
    hthpu.reset_peak_memory_stats(device)
    assert hthpu.max_memory_allocated(device) == after["InUse"]
    free, total = hthpu.mem_get_info(device)
    assert total == after["Limit"] and free == total - after["InUse"]


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
        keep = torch.empty(3 * 2**20 // 4, device="hpu:1")  # 3 MiB of 4
        try:
            torch.empty(2 * 2**20 // 4, device="hpu:1")
        except torch.OutOfMemoryError as err:
            print(err)
        big = torch.empty(2**20 // 4, device="hpu:0") * 1  # other devices are unaffected
        print(big.shape[0])
        """,
        VIRTUAL_HPU_MEMORY_MB="4",
    )
    assert result.returncode == 0, result.stderr
    message, count = result.stdout.strip().splitlines()
    assert message.startswith("HPU out of memory on hpu:1: tried to allocate 2.00 MiB; 3.00 MiB in use of 4.00 MiB")
    assert "VIRTUAL_HPU_MEMORY_MB" in message
    assert count == str(2**20 // 4)
