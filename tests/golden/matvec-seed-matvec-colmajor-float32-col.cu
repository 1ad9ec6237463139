// autotile matvec, float32: y = A x, A column-major.
// config: smem=dynamic,ROWS=16,THREADS_K=16,VEC=1,X_SHARED=True,STAGE_A=True,TILE_K=16,SPLIT_K=1,UNROLL=1
using T = float;

// Loads V consecutive elements starting at p[offset] into out[0..V). `valid` is how many of them lie
// inside the matrix; the rest read as zero, so partial tiles need no special case in the main loop.
// One wide load when the whole vector is inside and aligned, scalar loads otherwise.
template <int V>
__device__ __forceinline__ void load_guarded(const T* __restrict__ p, size_t offset, int valid,
                                             bool vector_ok, T* out) {
    if (V == 2 && vector_ok && valid >= 2) {
        const float2 v = *reinterpret_cast<const float2*>(p + offset);
        out[0] = v.x;
        out[1] = v.y;
        return;
    }
    if (V == 4 && vector_ok && valid >= 4) {
        const float4 v = *reinterpret_cast<const float4*>(p + offset);
        out[0] = v.x;
        out[1] = v.y;
        out[2] = v.z;
        out[3] = v.w;
        return;
    }
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = (i < valid) ? p[offset + i] : T(0);
}

__device__ __forceinline__ bool aligned_to(const void* p, int bytes) {
    return (reinterpret_cast<size_t>(p) % bytes) == 0;
}

extern "C" __global__ void __launch_bounds__(256)
autotile_matvec(const T* __restrict__ A, const T* __restrict__ x, T* __restrict__ y, int M, int K)
{
    constexpr int ROWS = 16, THREADS_K = 16, VEC = 1, THREADS = 256;
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    const int k_begin = 0, k_end = K;

    // Shared memory (dynamic): x tile [16] A tile [16][16] reduction [256]
    extern __shared__ __align__(16) unsigned char shared_bytes[];  // sized at launch (seed 004)
    T* x_shared = reinterpret_cast<T*>(shared_bytes);
    T* a_shared = x_shared + 16;
    T* partial = a_shared + 256;

    // Column-major: a thread owns VEC consecutive rows (one wide load per column, coalesced along M);
    // the THREADS_K threads of a row group take every THREADS_K-th column.
    const int tr = threadIdx.x, tk = threadIdx.y;
    const int row0 = blockIdx.x * ROWS + tr * VEC;
    const int valid_rows = min(VEC, M - row0);
    const bool vector_ok = (M % VEC == 0) && aligned_to(A, VEC * sizeof(T));
    T acc[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] = 0;
    for (int kt = k_begin; kt < k_end; kt += 16) {
        const int len = min(16, k_end - kt);
        for (int i = tid; i < len; i += THREADS) x_shared[i] = x[kt + i];
        // The A tile, column by column; zero outside the matrix (seed 004's guards).
        for (int i = tid; i < 256; i += THREADS) {
            const int r = i % ROWS, c = i / ROWS;
            const int gr = blockIdx.x * ROWS + r;
            a_shared[i] = (gr < M && c < len) ? A[(size_t)(kt + c) * M + gr] : T(0);
        }
        __syncthreads();
#pragma unroll 1
        for (int kk = tk; kk < len; kk += THREADS_K) {
            T a[VEC];
#pragma unroll
            for (int v = 0; v < VEC; ++v) a[v] = a_shared[kk * ROWS + tr * VEC + v];
            const T xk = x_shared[kk];
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[v] += a[v] * xk;
        }
        __syncthreads();
    }

    // Sum the THREADS_K partial results of each row through shared memory.
#pragma unroll
    for (int v = 0; v < VEC; ++v) partial[tk * ROWS + tr * VEC + v] = acc[v];
    __syncthreads();
    if (tk == 0) {
        // Partly unrolled: fully unrolled, ptxas keeps too many partial sums live and spills them.
#pragma unroll 4
        for (int s = 1; s < THREADS_K; ++s)
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[v] += partial[s * ROWS + tr * VEC + v];
    }
    if (tk == 0) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            if (v < valid_rows) {
                y[row0 + v] = acc[v];
            }
        }
    }
}
