// autotile matvec, float64: y = A x, A column-major.
// config: smem=static,ROWS=32,THREADS_K=16,VEC=2,X_SHARED=False,STAGE_A=False,TILE_K=16,SPLIT_K=8,UNROLL=4
using T = double;

// Loads V consecutive elements starting at p[offset] into out[0..V). `valid` is how many of them lie
// inside the matrix; the rest read as zero, so partial tiles need no special case in the main loop.
// One wide load when the whole vector is inside and aligned, scalar loads otherwise.
template <int V>
__device__ __forceinline__ void load_guarded(const T* __restrict__ p, size_t offset, int valid,
                                             bool vector_ok, T* out) {
    if (V == 2 && vector_ok && valid >= 2) {
        const double2 v = *reinterpret_cast<const double2*>(p + offset);
        out[0] = v.x;
        out[1] = v.y;
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
    constexpr int ROWS = 32, THREADS_K = 16, VEC = 2, THREADS = 256;
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    // Split-K: block column blockIdx.y takes one run of K (a multiple of VEC long, so wide loads stay
    // aligned) and adds its partial sums into y.
    const int k_len = ((K + 8 - 1) / 8 + VEC - 1) / VEC * VEC;
    const int k_begin = min(K, (int)blockIdx.y * k_len);
    const int k_end = min(K, k_begin + k_len);

    // Shared memory (static): reduction [512]
    __shared__ __align__(16) T partial[512];

    // Column-major: a thread owns VEC consecutive rows (one wide load per column, coalesced along M);
    // the THREADS_K threads of a row group take every THREADS_K-th column.
    const int tr = threadIdx.x, tk = threadIdx.y;
    const int row0 = blockIdx.x * ROWS + tr * VEC;
    const int valid_rows = min(VEC, M - row0);
    const bool vector_ok = (M % VEC == 0) && aligned_to(A, VEC * sizeof(T));
    T acc[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] = 0;
#pragma unroll 4
    for (int k = k_begin + tk; k < k_end; k += THREADS_K) {
        T a[VEC];
        load_guarded<VEC>(A, (size_t)k * M + row0, valid_rows, vector_ok, a);
        const T xk = x[k];
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[v] += a[v] * xk;
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
                atomicAdd(&y[row0 + v], acc[v]);
            }
        }
    }
}
