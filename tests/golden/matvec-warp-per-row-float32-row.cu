// autotile matvec, float32: y = A x, A row-major.
// config: smem=none,ROWS=4,THREADS_K=32,VEC=4,X_SHARED=False,STAGE_A=False,TILE_K=16,SPLIT_K=4,UNROLL=4
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

extern "C" __global__ void __launch_bounds__(128)
autotile_matvec(const T* __restrict__ A, const T* __restrict__ x, T* __restrict__ y, int M, int K)
{
    constexpr int ROWS = 4, THREADS_K = 32, VEC = 4, THREADS = 128;
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    // Split-K: block column blockIdx.y takes one run of K (a multiple of VEC long, so wide loads stay
    // aligned) and adds its partial sums into y.
    const int k_len = ((K + 4 - 1) / 4 + VEC - 1) / VEC * VEC;
    const int k_begin = min(K, (int)blockIdx.y * k_len);
    const int k_end = min(K, k_begin + k_len);

    // Row-major: THREADS_K lanes walk one row of A in steps of VEC, coalesced along K.
    const int lane = threadIdx.x;
    const int row = blockIdx.x * ROWS + threadIdx.y;
    const bool row_ok = row < M;
    const T* a_row = A + (size_t)(row_ok ? row : 0) * K;
    const bool vector_ok = (K % VEC == 0) && aligned_to(A, VEC * sizeof(T)) && aligned_to(x, VEC * sizeof(T));
    T acc = 0;
    if (row_ok) {
#pragma unroll 4
        for (int k = k_begin + lane * VEC; k < k_end; k += THREADS_K * VEC) {
            T a[VEC], xv[VEC];
            const int valid = min(VEC, k_end - k);
            load_guarded<VEC>(a_row, k, valid, vector_ok, a);
            load_guarded<VEC>(x, k, valid, vector_ok, xv);
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc += a[v] * xv[v];
        }
    }

    // Sum the lanes of a row with butterfly shuffles inside groups of 32 lanes.
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, offset, 32);
    if (lane == 0 && row_ok) {
        atomicAdd(&y[row], acc);
    }
}
