// 64 live accumulators under a 32-register budget (1024 threads, 2 blocks per SM): ptxas spills.
__global__ void __launch_bounds__(1024, 2) pressure(const float* __restrict__ x,
                                                    float* __restrict__ out, int n)
{
    float acc[64];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
#pragma unroll
    for (int j = 0; j < 64; ++j) acc[j] = x[(i * 64 + j) % n];
    for (int step = 0; step < n; ++step) {
#pragma unroll
        for (int j = 0; j < 64; ++j) acc[j] = acc[j] * acc[(j + 1) & 63] + x[(step + j) % n];
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 64; ++j) s += acc[j];
    out[i] = s;
}
