"""Device functions for kernels on a sm_90 thread-block cluster: the block's rank, cluster
barriers, loads from another block's shared memory through distributed shared memory, and
(count, mean, M2) moments merged over a warp and a block (Chan et al.). The source expects
THREADS, the threads a block, to be defined before it."""

CLUSTER_HELPERS = r"""
__device__ __forceinline__ unsigned int cluster_rank() {
    unsigned int rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return rank;
}

// Every thread of every block of the cluster arrives; shared-memory writes before it are
// visible to the whole cluster after it.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The float at the same shared-memory address in block `rank` of the cluster.
__device__ __forceinline__ float cluster_load(const float* local, unsigned int rank) {
    const unsigned int address = (unsigned int)__cvta_generic_to_shared(local);
    unsigned int remote;
    float value;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(address), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(value) : "r"(remote) : "memory");
    return value;
}

// A count, mean and sum of squared deviations from the mean of some values.
struct Moments {
    float n, mean, m2;
};

// The moments of the union of two disjoint sets of values (Chan et al.).
__device__ __forceinline__ Moments merge(Moments a, Moments b) {
    const float n = a.n + b.n;
    if (n == 0.0f) {
        return a;
    }
    const float delta = b.mean - a.mean;
    const float part = __fdividef(b.n, n);
    return {n, a.mean + delta * part, a.m2 + b.m2 + delta * delta * a.n * part};
}

// The moments over the warp, in every lane.
__device__ __forceinline__ Moments warp_moments(Moments value) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const Moments other = {__shfl_xor_sync(0xffffffff, value.n, offset),
                               __shfl_xor_sync(0xffffffff, value.mean, offset),
                               __shfl_xor_sync(0xffffffff, value.m2, offset)};
        value = merge(value, other);
    }
    return value;
}

// The moments over the block, in every thread. `scratch` holds one Moments per warp.
__device__ __forceinline__ Moments block_moments(Moments value, Moments* scratch) {
    value = warp_moments(value);
    if (threadIdx.x % 32 == 0) {
        scratch[threadIdx.x / 32] = value;
    }
    __syncthreads();
    const Moments none = {0.0f, 0.0f, 0.0f};
    return warp_moments(threadIdx.x % 32 < THREADS / 32 ? scratch[threadIdx.x % 32] : none);
}
"""
