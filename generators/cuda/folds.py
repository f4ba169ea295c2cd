"""Device code the compiler's CUDA kernels (`generators.cuda.compiled`) share: folds of a row's
lanes, the exchange of a row's partial results between the blocks of a cluster, or between
blocks anywhere on the GPU, and vectors of consecutive columns loaded and stored at once."""

# A vector of 2 or 4 fp32 columns: one 8- or 16-byte load or store, and its columns one at a
# time (`v` is a constant once the columns' loop is unrolled, so no lane is picked at run time).
# A vector access at an address not a multiple of its size faults on the GPU; the CPU build of
# the tests traps there too.
VECTORS = r"""
extern "C++" {
template <class V> __device__ __forceinline__ V load_vector(const float* at) {
#ifndef __CUDA_ARCH__
    if (reinterpret_cast<unsigned long long>(at) % sizeof(V) != 0) { __trap(); }
#endif
    return *reinterpret_cast<const V*>(at);
}
template <class V> __device__ __forceinline__ void store_vector(float* at, const V& vector) {
#ifndef __CUDA_ARCH__
    if (reinterpret_cast<unsigned long long>(at) % sizeof(V) != 0) { __trap(); }
#endif
    *reinterpret_cast<V*>(at) = vector;
}
__device__ __forceinline__ float lane_of(const float2& q, int v) { return v == 0 ? q.x : q.y; }
__device__ __forceinline__ float lane_of(const float4& q, int v) {
    return v == 0 ? q.x : v == 1 ? q.y : v == 2 ? q.z : q.w;
}
__device__ __forceinline__ void set_lane(float2& q, int v, float x) {
    if (v == 0) { q.x = x; } else { q.y = x; }
}
__device__ __forceinline__ void set_lane(float4& q, int v, float x) {
    if (v == 0) { q.x = x; } else if (v == 1) { q.y = x; } else if (v == 2) { q.z = x; }
    else { q.w = x; }
}
}
"""

# Device code every compiled CUDA kernel shares: the folds over a row's lanes (templates, so
# C++ linkage inside the source's `extern "C"`).
FOLDS = r"""
extern "C++" {
struct Add { template <class T> __device__ T operator()(T a, T b) const { return a + b; } };
struct Times { template <class T> __device__ T operator()(T a, T b) const { return a * b; } };
struct NanMax { __device__ float operator()(float a, float b) const { return nan_max(a, b); } };
struct NanMin { __device__ float operator()(float a, float b) const { return nan_min(a, b); } };

// `value` folded over the LANES lanes of a row (consecutive threads); every lane gets the
// result. Rows wider than a warp meet in `shared`, one slot a warp.
template <int LANES, class T, class F>
__device__ __forceinline__ T fold_row(T value, F combine, long long* shared) {
    constexpr int WIDTH = LANES < 32 ? LANES : 32;
    for (int hop = 1; hop < WIDTH; hop <<= 1) {
        value = combine(value, __shfl_xor_sync(0xffffffffu, value, hop, WIDTH));
    }
    if (LANES > 32) {
        T* slots = reinterpret_cast<T*>(shared);
        const int first = (threadIdx.x / LANES) * (LANES / 32);
        if (threadIdx.x % 32 == 0) { slots[threadIdx.x / 32] = value; }
        __syncthreads();
        value = slots[first];
        for (int w = 1; w < LANES / 32; ++w) { value = combine(value, slots[first + w]); }
        __syncthreads();
    }
    return value;
}

// Values of one type and fold (a norm's sum, shifted sum and squares) folded over the LANES
// lanes of a row at once, each as `fold_row` folds it: one trip through `shared` for them all,
// two barriers rather than two a value. `shared` holds 32 slots (a warp's each) a value.
template <int LANES, int N, class T, class F>
__device__ __forceinline__ void fold_row_all(T (&values)[N], F combine, long long* shared) {
    constexpr int WIDTH = LANES < 32 ? LANES : 32;
    for (int hop = 1; hop < WIDTH; hop <<= 1) {
#pragma unroll
        for (int k = 0; k < N; ++k) {
            values[k] = combine(values[k], __shfl_xor_sync(0xffffffffu, values[k], hop, WIDTH));
        }
    }
    if (LANES > 32) {
        T* slots = reinterpret_cast<T*>(shared);
        const int first = (threadIdx.x / LANES) * (LANES / 32);
        if (threadIdx.x % 32 == 0) {
#pragma unroll
            for (int k = 0; k < N; ++k) { slots[k * 32 + threadIdx.x / 32] = values[k]; }
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const T* warps = slots + k * 32 + first;
            T value = warps[0];
            for (int w = 1; w < LANES / 32; ++w) { value = combine(value, warps[w]); }
            values[k] = value;
        }
        __syncthreads();
    }
}

// An online max-and-sum (a softmax's max and its sum of exp(x - max), in one walk): the pair
// (max so far, sum so far) folded with another, both sums rescaled to the larger max. A sum at
// the max already is taken as it is, so that maxima of -inf (masked rows) never meet
// exp(-inf + inf); a NaN max makes the sum NaN, as the two-walk sum would be.
__device__ __forceinline__ float rescaled(float sum, float from, float to) {
    return from == to ? sum : sum * __expf(from - to);
}

__device__ __forceinline__ void online_pick(float& peak, float& total, float other_peak,
                                            float other_total) {
    const float top = nan_max(peak, other_peak);
    total = rescaled(total, peak, top) + rescaled(other_total, other_peak, top);
    peak = top;
}

// The online sum as PyTorch's two walks find it: NaN where the max is +inf (exp(inf - inf)),
// which counting a value at the max as one would hide.
__device__ __forceinline__ float online_total(float peak, float total) {
    return peak == INFINITY ? peak - peak : total;
}

// One value into an online max-and-sum: one exponential, of the smaller less the larger, where
// folding it in as the pair (value, 1) would take two. A value at the max counts one.
__device__ __forceinline__ void online_add(float& peak, float& total, float value) {
    const bool higher = value > peak;
    const float e = __expf(higher ? peak - value : (value == peak ? 0.0f : value - peak));
    total = higher ? total * e + 1.0f : total + e;
    peak = higher ? value : peak;
}

// The better of two (value, index) pairs: NaN first, then the larger (smaller), then the
// earlier index, as torch.argmax (argmin) picks.
__device__ __forceinline__ void arg_pick(float& best, long long& at, float value, long long index,
                                         bool largest) {
    const bool nan_best = best != best, nan_value = value != value;
    bool take;
    if (nan_best || nan_value) {
        take = nan_value && (!nan_best || index < at);
    } else {
        take = largest ? (value > best || (value == best && index < at))
                       : (value < best || (value == best && index < at));
    }
    if (take) { best = value; at = index; }
}

// A pair (an arg fold's value and index, an online sum's max and sum) folded over the LANES
// lanes of a row by `pick(first, second, other_first, other_second)`; every lane gets the
// result. Rows wider than a warp meet in `shared`: firsts in its first 32 slots, seconds in the
// next 32.
template <int LANES, class A, class B, class Pick>
__device__ __forceinline__ void fold_row_pair(A& first, B& second, Pick pick, long long* shared) {
    constexpr int WIDTH = LANES < 32 ? LANES : 32;
    for (int hop = 1; hop < WIDTH; hop <<= 1) {
        const A other_first = __shfl_xor_sync(0xffffffffu, first, hop, WIDTH);
        const B other_second = __shfl_xor_sync(0xffffffffu, second, hop, WIDTH);
        pick(first, second, other_first, other_second);
    }
    if (LANES > 32) {
        A* firsts = reinterpret_cast<A*>(shared);
        B* seconds = reinterpret_cast<B*>(shared + 32);
        const int lead = (threadIdx.x / LANES) * (LANES / 32);
        if (threadIdx.x % 32 == 0) {
            firsts[threadIdx.x / 32] = first;
            seconds[threadIdx.x / 32] = second;
        }
        __syncthreads();
        first = firsts[lead];
        second = seconds[lead];
        for (int w = 1; w < LANES / 32; ++w) {
            pick(first, second, firsts[lead + w], seconds[lead + w]);
        }
        __syncthreads();
    }
}

struct ArgPick {
    bool largest;
    __device__ void operator()(float& best, long long& at, float value, long long index) const {
        arg_pick(best, at, value, index, largest);
    }
};

struct OnlinePick {
    __device__ void operator()(float& peak, float& total, float other_peak,
                               float other_total) const {
        online_pick(peak, total, other_peak, other_total);
    }
};

template <int LANES>
__device__ __forceinline__ void arg_fold_row(float& best, long long& at, bool largest,
                                             long long* shared) {
    fold_row_pair<LANES>(best, at, ArgPick{largest}, shared);
}

// `value` folded over the LANES (> 1) lanes of a row when a block's ROWS rows take consecutive
// threads (a row's lanes ROWS threads apart); every lane gets the result. `shared` holds a slot
// a thread.
template <int LANES, int ROWS, class T, class F>
__device__ __forceinline__ T fold_rows_apart(T value, F combine, long long* shared) {
    T* slots = reinterpret_cast<T*>(shared);
    slots[threadIdx.x] = value;
    __syncthreads();
    const int row = threadIdx.x % ROWS;
    value = slots[row];
    for (int l = 1; l < LANES; ++l) { value = combine(value, slots[row + l * ROWS]); }
    __syncthreads();
    return value;
}

template <int LANES, int ROWS>
__device__ __forceinline__ void arg_fold_rows_apart(float& best, long long& at, bool largest,
                                                    long long* shared) {
    float* values = reinterpret_cast<float*>(shared);
    long long* indices = shared + LANES * ROWS;
    values[threadIdx.x] = best;
    indices[threadIdx.x] = at;
    __syncthreads();
    const int row = threadIdx.x % ROWS;
    best = values[row];
    at = indices[row];
    for (int l = 1; l < LANES; ++l) {
        arg_pick(best, at, values[row + l * ROWS], indices[row + l * ROWS], largest);
    }
    __syncthreads();
}
}  // extern "C++"
"""


# Device code of kernels whose rows a thread-block cluster shares (sm_90). Each exchange of a
# block's partial results has a transaction barrier in every block's shared memory: the sends are
# st.async writes into every block's inbox that count their bytes on the receiver's barrier, and a
# block reads its inbox once its barrier has seen them all. A cluster barrier with release and
# acquire semantics costs a MEMBAR.ALL.GPU on sm_90 (SASS) where this costs none; the cluster's
# only barrier is the one that sees every block's barriers set up before the first send, arrived
# at when the kernel starts and waited for before that send.
CLUSTER_EXCHANGE = r"""
extern "C++" {
__device__ __forceinline__ unsigned int in_cluster_block(const void* local, unsigned int rank) {
    unsigned int remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote) : "r"((unsigned int)__cvta_generic_to_shared(local)), "r"(rank));
    return remote;
}

__device__ __forceinline__ void send_async(unsigned int at, float value, unsigned int arrived) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];"
                 :: "r"(at), "f"(value), "r"(arrived) : "memory");
}
__device__ __forceinline__ void send_async(unsigned int at, long long value,
                                           unsigned int arrived) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];"
                 :: "r"(at), "l"(value), "r"(arrived) : "memory");
}

// The block's `count` exchange barriers set up, and the block's arrival on the cluster's
// barrier, which `exchanges_ready` waits for before any block sends.
template <int N>
__device__ __forceinline__ void exchanges_open(unsigned long long (&arrived)[N]) {
    if (threadIdx.x == 0) {
        for (int k = 0; k < N; ++k) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;"
                         :: "r"((unsigned int)__cvta_generic_to_shared(&arrived[k])) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

__device__ __forceinline__ void exchanges_ready() {
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

// The block expects `bytes` into its inboxes on barrier `arrived`.
__device__ __forceinline__ void expect_bytes(unsigned long long* arrived, unsigned int bytes) {
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"((unsigned int)__cvta_generic_to_shared(arrived)), "r"(bytes)
                     : "memory");
    }
}

// `value` into `slot` in the shared memory of block `to` of the cluster, counted on its barrier
// `arrived`: CLUSTER threads each holding `value` send to all the blocks at once, thread `to`
// to block `to`.
template <class T>
__device__ __forceinline__ void send_to_block(T* slot, T value, unsigned long long* arrived,
                                              unsigned int to) {
    send_async(in_cluster_block(slot, to), value, in_cluster_block(arrived, to));
}

// The same to each of the cluster's CLUSTER blocks in turn: one thread sending them all.
template <int CLUSTER, class T>
__device__ __forceinline__ void send_to_cluster(T* slot, T value, unsigned long long* arrived) {
    #pragma unroll 1  // unrolled, the sends' addresses take a register each
    for (unsigned int to = 0; to < CLUSTER; ++to) {
        send_to_block(slot, value, arrived, to);
    }
}

// Until every block's values have arrived in this block's inboxes of barrier `arrived`.
__device__ __forceinline__ void wait_for_bytes(unsigned long long* arrived) {
    const unsigned int at = (unsigned int)__cvta_generic_to_shared(arrived);
    unsigned int done = 0;
    while (!done) {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(at) : "memory");
    }
}
}  // extern "C++"
"""


# Device code of kernels whose rows blocks anywhere on the GPU share (a cooperative launch, so that
# they are all resident): a row's barrier in global memory. `arrived` counts the arrivals of the
# row's blocks over the launch, so that its k-th barrier waits for k times its blocks; the fences
# around it make each block's partial results, stored before, visible to all of them past it.
GRID_EXCHANGE = r"""
extern "C++" {
__device__ __forceinline__ void row_barrier(int* arrived, int target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(arrived, 1);
        int seen;
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(arrived) : "memory");
        while (seen < target) {
            __nanosleep(64);
            asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(arrived)
                         : "memory");
        }
        __threadfence();
    }
    __syncthreads();
}
}  // extern "C++"
"""
