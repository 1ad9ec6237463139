// autotile matmul, float32: C = A B, row-major.
// config: smem=static,BM=16,BN=16,TM=1,TN=1,BK=16,VEC=1,A_TRANSPOSED=False,PAD=0,STAGES=1,SPLIT_K=1,SWIZZLE=1,UNROLL=full
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

    // Shared-memory tiles, 1 stage(s). A is staged as [BM][BK + PAD]
    // and B as [BK][BN + PAD].
    constexpr int BK = 16, VEC = 1, STAGES = 1;
    constexpr int A_STRIDE = 16, A_TILE = 16 * A_STRIDE;
    constexpr int B_STRIDE = 16, B_TILE = BK * B_STRIDE;
    __shared__ __align__(16) T As[STAGES * A_TILE];
    __shared__ __align__(16) T Bs[STAGES * B_TILE];

    const int tid = ty * TX + tx;
    // Wide loads only where every row starts aligned; otherwise the scalar path of load_guarded.
    const bool a_vector_ok = (K % VEC == 0) && aligned_to(A, VEC * sizeof(T));
    const bool b_vector_ok = (N % VEC == 0) && aligned_to(B, VEC * sizeof(T));

    const int k_begin = 0, k_end = K;
    const int n_tiles = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;

    // Global -> registers: 1 vector(s) of A and 1 of B per thread, zero outside the matrix.
    T a_stage[1], b_stage[1];
    auto load_tiles = [&](int k0) {
#pragma unroll
        for (int l = 0; l < 1; ++l) {
            const int idx = tid + l * 256;
            const int r = idx / (BK / VEC), c = (idx % (BK / VEC)) * VEC;
            const int gr = row0 + r, gc = k0 + c;
            const int valid = gr < M ? min(VEC, k_end - gc) : 0;
            load_guarded<VEC>(A, (size_t)gr * K + gc, valid, a_vector_ok, a_stage + l * VEC);
        }
#pragma unroll
        for (int l = 0; l < 1; ++l) {
            const int idx = tid + l * 256;
            const int r = idx / (BN / VEC), c = (idx % (BN / VEC)) * VEC;
            const int gr = k0 + r, gc = col0 + c;
            const int valid = gr < k_end ? min(VEC, N - gc) : 0;
            load_guarded<VEC>(B, (size_t)gr * N + gc, valid, b_vector_ok, b_stage + l * VEC);
        }
    };
    // Registers -> shared memory, stage s.
    auto store_tiles = [&](int s) {
#pragma unroll
        for (int l = 0; l < 1; ++l) {
            const int idx = tid + l * 256;
            const int r = idx / (BK / VEC), c = (idx % (BK / VEC)) * VEC;
#pragma unroll
            for (int v = 0; v < VEC; ++v)
                As[s * A_TILE + r * A_STRIDE + c + v] = a_stage[l * VEC + v];
        }
#pragma unroll
        for (int l = 0; l < 1; ++l) {
            const int idx = tid + l * 256;
            const int r = idx / (BN / VEC), c = (idx % (BN / VEC)) * VEC;
#pragma unroll
            for (int v = 0; v < VEC; ++v) Bs[s * B_TILE + r * B_STRIDE + c + v] = b_stage[l * VEC + v];
        }
    };
    // The tiled loop of the seeds: TM x TN products per thread for each k of the staged tile.
    auto multiply_tile = [&](int s) {
        const T* as = As + s * A_TILE;
        const T* bs = Bs + s * B_TILE;
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            T a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i)
                a[i] = as[local_row(i) * A_STRIDE + k];
#pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = bs[k * B_STRIDE + local_col(j)];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
        }
    };


    for (int t = 0; t < n_tiles; ++t) {
        load_tiles(k_begin + t * BK);
        store_tiles(0);
        __syncthreads();  // the tile is complete before anyone reads it
        multiply_tile(0);
        __syncthreads();  // everyone is done with it before it is overwritten
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
