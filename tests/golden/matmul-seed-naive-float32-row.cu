// autotile matmul, float32: C = A B, row-major.
// config: smem=none,BM=16,BN=16,TM=1,TN=1,BK=16,VEC=1,A_TRANSPOSED=False,PAD=0,STAGES=1,SPLIT_K=1,SWIZZLE=1,UNROLL=full
// block 16 x 16 threads computes a 16 x 16 tile of C; each thread 1 x 1 outputs.
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
autotile_matmul(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                 int M, int N, int K)
{
    constexpr int BM = 16, BN = 16, TM = 1, TN = 1;
    constexpr int TX = 16, TY = 16;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row0 = blockIdx.y * BM;
    const int col0 = blockIdx.x * BN;

    // This thread's outputs: rows row0 + local_row(i), columns col0 + local_col(j).
    auto local_row = [&](int i) { return (i / 1) * (TY * 1) + ty * 1 + i % 1; };
    auto local_col = [&](int j) { return (j / 1) * (TX * 1) + tx * 1 + j % 1; };

    T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

    // No shared memory (seed 000's first kernel): every product reads A and B from global memory.
    const int k_begin = 0, k_end = K;
    for (int k = k_begin; k < k_end; ++k) {
        T a[TM], b[TN];
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int row = row0 + local_row(i);
            a[i] = row < M ? A[(size_t)row * K + k] : T(0);
        }
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int col = col0 + local_col(j);
            b[j] = col < N ? B[(size_t)k * N + col] : T(0);
        }
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }

    // Store the register tile; columns in groups of 1, one wide store where the group is inside C and aligned.
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = row0 + local_row(i);
        if (row >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; j += 1) {
            const int col = col0 + local_col(j);
            if (col < N) C[(size_t)row * N + col] = acc[i][j];
        }
    }
}
