"""Kernels whose clusters have more than 8 blocks load and launch through the CUDA driver
(`core.runtime.cuda.DriverKernel`): pycuda cannot allow their size. The GPU tests need an
NVIDIA GPU (sm_90)."""

from __future__ import annotations

import re

import pytest
import torch

from core.evaluate.guard import install_launch_counters
from core.runtime.cuda import DriverKernel, cluster_blocks, load_kernel
from generators.compiler.schedule import Schedule
from generators.cuda.program import write_cuda_compiled
from generators.site_graph import load_site_graph
from tests.kernel_checks import assert_matches, one_input_problem

# Each block of a 16-block cluster adds its rank into the first block's shared memory; the first
# block writes the sum, and every block its rank.
RANKS = r"""
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__global__ void __launch_bounds__(32) __cluster_dims__(1, 16, 1) ranks(int* out, int* total) {
    __shared__ int sum;
    unsigned int rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    if (threadIdx.x == 0 && rank == 0) sum = 0;
    cluster_sync();
    if (threadIdx.x == 0) {
        unsigned int local = (unsigned int)__cvta_generic_to_shared(&sum), remote;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(0));
        asm volatile("red.shared::cluster.add.u32 [%0], %1;" :: "r"(remote), "r"(rank) : "memory");
        out[blockIdx.x * 16 + blockIdx.y] = (int)rank;
    }
    cluster_sync();
    if (threadIdx.x == 0 && rank == 0) total[blockIdx.x] = sum;
}
"""


def kernel_source(candidate: str) -> str:
    return re.search(r'SOURCE = r"""(.*?)"""', candidate, re.S).group(1)


def test_a_kernels_cluster_is_read_from_its_declaration(tmp_path):
    assert cluster_blocks(RANKS, "ranks") == 16
    assert cluster_blocks("__global__ void k(float* out) {}", "k") == 1
    # Named sizes (a channel norm's CLUSTER) stay with pycuda, which takes up to 8.
    assert cluster_blocks("__global__ void __cluster_dims__(CLUSTER, 1, 1) k(float* o) {}",
                          "k") == 1
    problem = one_input_problem(tmp_path, "torch.softmax(x, dim=-1)", "torch.randn(4, 4096)")
    graph = load_site_graph(problem)
    for blocks in (8, 16):
        source = kernel_source(write_cuda_compiled(graph, Schedule(1, 256, 4,
                                                                   cluster_blocks=blocks)))
        assert cluster_blocks(source, "site_kernel_0_0") == blocks


def test_launches_through_the_driver_are_counted_as_pycudas_are():
    # Else a candidate whose kernels launch through the driver (16-block clusters, cooperative
    # launches) is rejected for launching no kernel.
    install_launch_counters()
    assert getattr(DriverKernel.launch, "kiln_counting", False)


def test_a_wide_clusters_argument_codes_are_checked_before_anything_loads():
    with pytest.raises(ValueError, match=r"argument codes \['x'\] are not among"):
        load_kernel(RANKS, "ranks", "Px")


@pytest.mark.gpu
@pytest.mark.parametrize("stream", ["default", "side"])
def test_sixteen_blocks_share_a_cluster_on_the_gpu(stream):
    out = torch.full((3 * 16,), -1, dtype=torch.int32, device="cuda")
    total = torch.zeros(3, dtype=torch.int32, device="cuda")
    kernel = load_kernel(RANKS, "ranks", "PP")
    side = torch.cuda.Stream() if stream == "side" else torch.cuda.current_stream()
    with torch.cuda.stream(side):
        kernel(grid=(3, 16, 1), block=(32, 1, 1), args=(out, total))
    torch.cuda.current_stream().wait_stream(side)
    assert out.view(3, 16).tolist() == [list(range(16))] * 3
    assert total.tolist() == [sum(range(16))] * 3


@pytest.mark.gpu
@pytest.mark.parametrize("held", ["shared", "registers"])
def test_rows_of_393216_shared_by_sixteen_blocks_match_pytorch(tmp_path, held):
    problem = one_input_problem(tmp_path, "torch.softmax(x, dim=-1)", "torch.randn(8, 393216)")
    candidate = write_cuda_compiled(load_site_graph(problem),
                                    Schedule(1, 4096, 16, cluster_blocks=16, keep_row=True,
                                             held=held))
    namespace: dict = {}
    exec(compile(candidate, "model_new.py", "exec"), namespace)
    x = torch.randn(8, 393216, device="cuda")
    assert_matches(namespace["ModelNew"]()(x), torch.softmax(x, dim=-1), candidate[:300])
