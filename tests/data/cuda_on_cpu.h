#line 1 "cuda_on_cpu.h"
#include <bit>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>
#include <sys/mman.h>
#include <ucontext.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// One block runs at a time, so a block's shared memory can be a static.
#define __shared__ static
#define __align__(n) alignas(n)

struct uint3 { unsigned int x, y, z; };
struct dim3 { unsigned int x, y, z; };
struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
static constexpr int warpSize = 32;
static uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;

inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __uint_as_float(unsigned int x) { return std::bit_cast<float>(x); }
inline unsigned int __float_as_uint(float x) { return std::bit_cast<unsigned int>(x); }
// A load through L2 past the SM's cache: one memory here.
template <class T> inline T __ldcg(const T* address) { return *address; }

// x times the reciprocal, and for 2^126 < |y| < 2^128 a zero (NaN for an infinite x), as the
// GPU's div.approx.f32.
inline float __fdividef(float x, float y) {
    const float magnitude = std::fabs(y);
    if (magnitude > 0x1p126f && magnitude < INFINITY) { return x * std::copysign(0.0f, y); }
    return x * (1.0f / y);
}

namespace kiln {

// __expf: the GPU's ex2.approx of x * log2(e), the product rounded to float.
inline float fast_exp(float x) { return std::exp2(x * 1.44269504088896341f); }

inline float reciprocal_sqrt(float x) { return 1.0f / std::sqrt(x); }

enum class State : unsigned char { runnable, at_syncthreads, at_shuffle, returned };
enum class Mode : unsigned char { idx, up, down, bfly };

struct Thread {
    ucontext_t context;
    uint3 index;
    State state;
    int line;  // where it waits
    const char* what;
    Mode mode;  // the shuffle it waits at
    unsigned int mask;
    int lane;
    int width;
    unsigned long long value;  // its value, then the one it receives
};

struct Launch {
    std::vector<Thread> threads;
    unsigned int current;
    ucontext_t scheduler;
    void (*body)(void*);
    void* arguments;
    char* error;
    std::size_t error_size;
};

static Launch* launch;
static constexpr std::size_t STACK = 256 * 1024, GUARD = 64 * 1024;
static char* stacks;

// Adds to the launch's error message, which starts with the block it happened in.
inline void fail(const char* format, ...) {
    std::size_t used = std::strlen(launch->error);
    if (used == 0) {
        std::snprintf(launch->error, launch->error_size, "block (%u, %u, %u): ", blockIdx.x,
                      blockIdx.y, blockIdx.z);
        used = std::strlen(launch->error);
    }
    va_list values;
    va_start(values, format);
    std::vsnprintf(launch->error + used, launch->error_size - used, format, values);
    va_end(values);
}

// The fiber stacks, each above an inaccessible guard so that an overflow faults. Mapped for one
// launch only: each guard splits the mapping, and the process's count of mappings is bounded
// (vm.max_map_count), so stacks kept by every loaded source would run out of them.
struct Stacks {
    std::size_t count = 0;
    char* memory = nullptr;

    bool map(std::size_t threads) {
        void* mapped = mmap(nullptr, threads * (STACK + GUARD), PROT_NONE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (mapped == MAP_FAILED) { return false; }
        memory = static_cast<char*>(mapped), count = threads;
        for (std::size_t t = 0; t < threads; ++t) {
            if (mprotect(memory + t * (STACK + GUARD) + GUARD, STACK, PROT_READ | PROT_WRITE)) {
                return false;
            }
        }
        return true;
    }

    ~Stacks() {
        if (memory) { munmap(memory, count * (STACK + GUARD)); }
    }
};

inline void wait(State state, const char* what, int line) {
    Thread& self = launch->threads[launch->current];
    self.state = state, self.what = what, self.line = line;
    // Other threads write memory meanwhile: none of it may stay in registers across the switch.
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    swapcontext(&self.context, &launch->scheduler);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

inline void syncthreads(int line) { wait(State::at_syncthreads, "__syncthreads", line); }

template <class T>
T shuffle(Mode mode, const char* what, int line, unsigned int mask, T value, int lane,
          int width = warpSize) {
    static_assert(std::is_arithmetic_v<T> && (sizeof(T) == 4 || sizeof(T) == 8),
                  "a shuffle moves a 32- or 64-bit number");
    Thread& self = launch->threads[launch->current];
    self.mode = mode, self.mask = mask, self.lane = lane, self.width = width, self.value = 0;
    std::memcpy(&self.value, &value, sizeof(T));
    wait(State::at_shuffle, what, line);
    std::memcpy(&value, &self.value, sizeof(T));
    return value;
}

static void fiber() {
    launch->body(launch->arguments);
    Thread& self = launch->threads[launch->current];
    self.state = State::returned, self.line = 0;
}  // and on to the scheduler, the fiber's uc_link

// __trap(): the thread ends there, and the launch fails naming the line.
[[noreturn]] inline void trap(int line) {
    fail("a thread trapped on line %d (__trap: a misaligned vector access, say)", line);
    launch->threads[launch->current].state = State::returned;
    setcontext(&launch->scheduler);
    std::abort();  // setcontext returns only if it failed
}

inline bool same_wait(const Thread& a, const Thread& b) {
    return a.state == b.state && a.line == b.line
        && (a.state != State::at_shuffle || (a.mode == b.mode && a.width == b.width));
}

// The warp's exchange, with shfl.sync's lane rules (PTX ISA): a source lane outside the
// width-lane segment, or past it for idx, down and bfly, gives the thread its own value.
inline bool exchange(Thread* lanes, unsigned int count, unsigned int warp) {
    const Thread& first = lanes[0];
    const unsigned int present = count == 32 ? 0xffffffffu : (1u << count) - 1;
    if (first.width < 1 || first.width > 32 || (first.width & (first.width - 1))) {
        fail("%s on line %d: width %d is not a power of two up to 32", first.what, first.line,
             first.width);
        return false;
    }
    const int segment = 32 - first.width;  // shfl.sync's segmask
    unsigned long long values[32];
    for (unsigned int l = 0; l < count; ++l) {
        if ((lanes[l].mask & present) != present) {
            fail("%s on line %d: mask 0x%x leaves out lanes of warp %u (not emulated)",
                 first.what, first.line, lanes[l].mask, warp);
            return false;
        }
        values[l] = lanes[l].value;
    }
    for (int l = 0; l < int(count); ++l) {
        const int b = lanes[l].lane & 31, start = l & segment;
        const int end = start | (31 & ~segment);
        int j = l;
        bool inside = true;
        switch (first.mode) {
            case Mode::up: j = l - b, inside = j >= start; break;
            case Mode::down: j = l + b, inside = j <= end; break;
            case Mode::bfly: j = l ^ b, inside = j <= end; break;
            case Mode::idx: j = start | (b & ~segment), inside = j <= end; break;
        }
        if (!inside) { j = l; }
        if (j >= int(count)) {
            fail("%s on line %d: lane %d of warp %u reads lane %d, past the block's threads",
                 first.what, first.line, l, warp, j);
            return false;
        }
        lanes[l].value = values[j];
    }
    return true;
}

inline void describe_stuck() {
    const std::vector<Thread>& threads = launch->threads;
    fail("its threads cannot all go on (a hang or undefined behaviour on the GPU):");
    std::size_t t = 0;
    for (int groups = 0; t < threads.size() && groups < 8; ++groups) {
        std::size_t end = t + 1;
        while (end < threads.size() && same_wait(threads[end], threads[t])) { ++end; }
        if (threads[t].state == State::returned) {
            fail(" threads %zu-%zu returned;", t, end - 1);
        } else {
            fail(" threads %zu-%zu wait at %s on line %d;", t, end - 1, threads[t].what,
                 threads[t].line);
        }
        t = end;
    }
    if (t < threads.size()) { fail(" ..."); }
}

// Whether every lane of the warp starting at `first` waits at one shuffle.
inline bool warp_met(unsigned int first, unsigned int lanes) {
    const std::vector<Thread>& threads = launch->threads;
    bool met = threads[first].state == State::at_shuffle;
    for (unsigned int l = 1; met && l < lanes; ++l) {
        met = same_wait(threads[first + l], threads[first]);
    }
    return met;
}

// Runs the block's warps one at a time, each as far as it goes (its lanes in turn, each up to
// its next shuffle, the shuffle, and on) before the next starts, in ascending order or, when
// `backwards`, descending: a legal schedule on the GPU, and one that lets a warp run ahead of
// the others as far as the barriers allow, so that a barrier missing between two warps' uses
// of shared memory changes what they read. Returns whether every thread returned.
inline bool run_block(bool backwards) {
    std::vector<Thread>& threads = launch->threads;
    const unsigned int count = threads.size(), warps = (count + 31) / 32;
    for (unsigned int t = 0; t < count; ++t) {
        Thread& thread = threads[t];
        getcontext(&thread.context);
        thread.context.uc_stack.ss_sp = stacks + t * (STACK + GUARD) + GUARD;
        thread.context.uc_stack.ss_size = STACK;
        thread.context.uc_link = &launch->scheduler;
        makecontext(&thread.context, fiber, 0);
        thread.state = State::runnable;
    }
    for (;;) {
        if (launch->error[0] != '\0') { return false; }  // a thread trapped
        bool ran = false;
        for (unsigned int k = 0; k < warps; ++k) {
            const unsigned int first = 32 * (backwards ? warps - 1 - k : k);
            const unsigned int lanes = count - first < 32 ? count - first : 32;
            for (;;) {
                for (unsigned int l = 0; l < lanes; ++l) {
                    const unsigned int t = first + (backwards ? lanes - 1 - l : l);
                    if (threads[t].state != State::runnable) { continue; }
                    launch->current = t, threadIdx = threads[t].index, ran = true;
                    swapcontext(&launch->scheduler, &threads[t].context);
                }
                if (!warp_met(first, lanes)) { break; }
                if (!exchange(&threads[first], lanes, first / 32)) { return false; }
                for (unsigned int l = 0; l < lanes; ++l) {
                    threads[first + l].state = State::runnable;
                }
            }
        }
        bool returned = true, synced = true;
        for (const Thread& thread : threads) {
            returned = returned && thread.state == State::returned;
            synced = synced && thread.state == State::at_syncthreads
                && thread.line == threads[0].line;
        }
        if (returned) { return launch->error[0] == '\0'; }  // unless a thread trapped
        if (synced) {
            for (Thread& thread : threads) { thread.state = State::runnable; }
        } else if (!ran) {
            describe_stuck();
            return false;
        }
    }
}

// One launch: geometry holds the grid's and the block's x, y and z. 0 when it ran, else 1 with
// the reason in `error`.
inline int run(const unsigned int* geometry, void (*body)(void*), void* arguments, char* error,
               std::size_t error_size) {
    Launch state{};
    state.body = body, state.arguments = arguments, state.error = error;
    state.error_size = error_size, error[0] = '\0';
    launch = &state;
    gridDim = {geometry[0], geometry[1], geometry[2]};
    blockDim = {geometry[3], geometry[4], geometry[5]};
    const unsigned int count = blockDim.x * blockDim.y * blockDim.z;
    Stacks held;
    if (!held.map(count)) {
        fail("no memory for %u fiber stacks", count);
        return 1;
    }
    stacks = held.memory;
    state.threads.resize(count);
    for (unsigned int t = 0; t < count; ++t) {
        state.threads[t].index = {t % blockDim.x, t / blockDim.x % blockDim.y,
                                  t / (blockDim.x * blockDim.y)};
    }
    for (unsigned int z = 0; z < gridDim.z; ++z) {
        for (unsigned int y = 0; y < gridDim.y; ++y) {
            for (unsigned int x = 0; x < gridDim.x; ++x) {
                blockIdx = {x, y, z};
                if (!run_block((x + y + z) % 2 == 1)) { return 1; }
            }
        }
    }
    return 0;
}

template <class T>
constexpr char code() {
    if constexpr (std::is_pointer_v<T>) { return 'P'; }
    if constexpr (std::is_same_v<T, float>) { return 'f'; }
    if constexpr (std::is_same_v<T, double>) { return 'd'; }
    if constexpr (std::is_integral_v<T>) {
        return sizeof(T) == 1 ? 'b' : sizeof(T) == 2 ? 'h' : sizeof(T) == 4 ? 'i' : 'q';
    }
    return '?';
}

// A kernel's parameters as struct codes of their size: pointer, float, double, 1-, 2-, 4- or
// 8-byte integer.
template <class... Ts>
const char* codes(void (*)(Ts...)) {
    static constexpr char text[] = {code<Ts>()..., '\0'};
    return text;
}

template <class T>
T argument(void* slot) {
    T value;
    std::memcpy(&value, slot, sizeof(T));
    return value;
}

template <class... Ts, std::size_t... I>
void call(void (*kernel)(Ts...), void* const* slots, std::index_sequence<I...>) {
    kernel(argument<Ts>(slots[I])...);
}

template <class... Ts>
void call(void (*kernel)(Ts...), void* arguments) {
    call(kernel, static_cast<void* const*>(arguments), std::index_sequence_for<Ts...>{});
}

}  // namespace kiln

#define __syncthreads() kiln::syncthreads(__LINE__)
#define __trap() kiln::trap(__LINE__)
#define __shfl_sync(mask, ...) \
    kiln::shuffle(kiln::Mode::idx, "__shfl_sync", __LINE__, mask, __VA_ARGS__)
#define __shfl_up_sync(mask, ...) \
    kiln::shuffle(kiln::Mode::up, "__shfl_up_sync", __LINE__, mask, __VA_ARGS__)
#define __shfl_down_sync(mask, ...) \
    kiln::shuffle(kiln::Mode::down, "__shfl_down_sync", __LINE__, mask, __VA_ARGS__)
#define __shfl_xor_sync(mask, ...) \
    kiln::shuffle(kiln::Mode::bfly, "__shfl_xor_sync", __LINE__, mask, __VA_ARGS__)
// Names the C library declares too, so macros rather than definitions.
#define __expf(x) kiln::fast_exp(x)
#define rsqrtf(x) kiln::reciprocal_sqrt(x)
