"""Device functions for kernels on a sm_90 thread-block cluster: the block's rank, cluster
barriers, an inbox each block's moments are sent to, and (count, mean, M2) moments merged over
a warp and a block (Chan et al.). The source expects THREADS, the threads a block, and
CLUSTER, the blocks a cluster, to be defined before it."""

CLUSTER_HELPERS = r"""
__device__ __forceinline__ unsigned int cluster_rank() {
    unsigned int rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return rank;
}

__device__ __forceinline__ unsigned int shared_address(const void* local) {
    return (unsigned int)__cvta_generic_to_shared(local);
}

// The same shared-memory address in block `rank` of the cluster.
__device__ __forceinline__ unsigned int in_block(const void* local, unsigned int rank) {
    unsigned int remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote) : "r"(shared_address(local)), "r"(rank));
    return remote;
}

// Each block's moments, as (n, mean, m2, unused), at its rank in every block's inbox; the
// barrier counts the bytes in. Sends are st.async writes that complete on the receiver's
// barrier: a cluster barrier with release semantics costs a MEMBAR.ALL.GPU on sm_90 (SASS),
// and ncu counted membar stalls as a quarter of all stalls in the cluster norm kernels.
struct Inbox {
    float4 moments[CLUSTER];
    unsigned long long arrived;
};

// Before any block may send: thread 0 sets up the barrier, every thread arrives on the
// cluster barrier; `inbox_ready` waits for every block's.
__device__ __forceinline__ void inbox_open(Inbox* inbox) {
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;"
                     :: "r"(shared_address(&inbox->arrived)) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

__device__ __forceinline__ void inbox_ready() {
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

// Thread r < CLUSTER sends the block's moments to block r; thread 0 expects CLUSTER of them.
__device__ __forceinline__ void inbox_send(Inbox* inbox, float n, float mean, float m2) {
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"(shared_address(&inbox->arrived)), "r"(CLUSTER * 16) : "memory");
    }
    if (threadIdx.x < CLUSTER) {
        const unsigned int to = threadIdx.x;
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 "
                     "[%0], {%1, %2, %3, %4}, [%5];"
                     :: "r"(in_block(&inbox->moments[cluster_rank()], to)), "f"(n), "f"(mean),
                        "f"(m2), "f"(0.0f), "r"(in_block(&inbox->arrived, to)) : "memory");
    }
}

// Until every block's moments are in. Nothing is sent to a block after that, so it may exit.
__device__ __forceinline__ void inbox_wait(Inbox* inbox) {
    asm volatile("{\n.reg .pred done;\nwaiting:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
                 "@!done bra waiting;\n}"
                 :: "r"(shared_address(&inbox->arrived)) : "memory");
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
