// Kernels with known shapes of machine code, for the kernel-report tests.

// A local array indexed by a runtime value cannot live in registers: a 256-byte stack frame.
__global__ void local_array(const float* __restrict__ x, float* __restrict__ out, int n, int k)
{
    float local[64];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
#pragma unroll 1
    for (int j = 0; j < 64; ++j) local[j] = x[(i + j) % n];
    float acc = 0.0f;
#pragma unroll 1
    for (int j = 0; j < 64; ++j) acc += local[(j * k + i) & 63];
    out[i] = acc;
}

// One 4-byte load per thread through 1 KB of shared memory.
__global__ void narrow(const float* __restrict__ x, float* __restrict__ out, int n)
{
    __shared__ float tile[256];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) out[i] = tile[255 - threadIdx.x] * 2.0f;
}

// One 16-byte load per thread.
__global__ void wide(const float4* __restrict__ x, float4* __restrict__ out, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float4 v = x[i];
        out[i] = make_float4(v.x * 2.0f, v.y * 2.0f, v.z * 2.0f, v.w * 2.0f);
    }
}

// One warp-level tensor-core product (fp16 in, fp32 accumulate) on fragments loaded as words.
__global__ void tensor_core(const unsigned* __restrict__ a, const unsigned* __restrict__ b,
                            float* __restrict__ c)
{
    const int lane = threadIdx.x & 31;
    const unsigned a0 = a[lane * 4], a1 = a[lane * 4 + 1], a2 = a[lane * 4 + 2];
    const unsigned a3 = a[lane * 4 + 3], b0 = b[lane * 2], b1 = b[lane * 2 + 1];
    float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    c[lane * 4] = d0;
    c[lane * 4 + 1] = d1;
    c[lane * 4 + 2] = d2;
    c[lane * 4 + 3] = d3;
}
