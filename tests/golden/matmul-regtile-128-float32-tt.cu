// autotile matmul, float32: C = A B, layout tt: A stored transposed, K x M row-major (A[k*M + m]), B stored transposed, N x K row-major (B[n*K + k]), C row-major.
// config: smem=dynamic,BM=128,BN=128,TM=8,TN=8,BK=8,VEC=4,A_TRANSPOSED=True,PAD=4,STAGES=2,SPLIT_K=1,SWIZZLE=8,UNROLL=full
// block 16 x 16 threads computes a 128 x 128 tile of C; each thread 8 x 8 outputs.
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
    constexpr int BM = 128, BN = 128, TM = 8, TN = 8;
    constexpr int TX = 16, TY = 16;
    const int tx = threadIdx.x, ty = threadIdx.y;
    // Blocks are launched in groups of 8 block rows, column by column: blocks that run at the
    // same time share B's column tiles (and A's row tiles) in L2.
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int launch_group = blockIdx.x / (8 * tiles_n);
    const int first_m = launch_group * 8;
    const int rows_in_group = min(tiles_m - first_m, 8);
    const int in_group = blockIdx.x - launch_group * 8 * tiles_n;
    const int row0 = (first_m + in_group % rows_in_group) * BM;
    const int col0 = (in_group / rows_in_group) * BN;

    // This thread's outputs: rows row0 + local_row(i), columns col0 + local_col(j).
    auto local_row = [&](int i) { return (i / 4) * (TY * 4) + ty * 4 + i % 4; };
    auto local_col = [&](int j) { return (j / 4) * (TX * 4) + tx * 4 + j % 4; };

    T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

    // Shared-memory tiles, 2 stage(s). A is staged transposed, as [BK][BM + PAD]
    // and B as [BK][BN + PAD]; the pad column moves each row to another bank (seed 001).
    constexpr int BK = 8, VEC = 4, STAGES = 2;
    constexpr int A_STRIDE = 132, A_TILE = 8 * A_STRIDE;
    constexpr int B_STRIDE = 132, B_TILE = BK * B_STRIDE;
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    T* As = reinterpret_cast<T*>(shared_bytes);
    T* Bs = As + STAGES * A_TILE;

    const int tid = ty * TX + tx;
    // Wide loads only where every row starts aligned; otherwise the scalar path of load_guarded.
    const bool a_vector_ok = (M % VEC == 0) && aligned_to(A, VEC * sizeof(T));
    const bool b_vector_ok = (K % VEC == 0) && aligned_to(B, VEC * sizeof(T));

    const int k_begin = 0, k_end = K;
    const int n_tiles = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;

    // Global -> registers: 1 vector(s) of A and 1 of B per thread, zero outside the matrix.
    T a_stage[4], b_stage[4];
    auto load_tiles = [&](int k0) {
#pragma unroll
        for (int l = 0; l < 1; ++l) {
            const int idx = tid + l * 256;
            const int r = idx / (BM / VEC), c = (idx % (BM / VEC)) * VEC;
            const int gr = k0 + r, gc = row0 + c;
            const int valid = gr < k_end ? min(VEC, M - gc) : 0;
            load_guarded<VEC>(A, (size_t)gr * M + gc, valid, a_vector_ok, a_stage + l * VEC);
        }
#pragma unroll
        for (int l = 0; l < 1; ++l) {
            const int idx = tid + l * 256;
            const int r = idx / (BK / VEC), c = (idx % (BK / VEC)) * VEC;
            const int gr = col0 + r, gc = k0 + c;
            const int valid = gr < N ? min(VEC, k_end - gc) : 0;
            load_guarded<VEC>(B, (size_t)gr * K + gc, valid, b_vector_ok, b_stage + l * VEC);
        }
    };
    // Registers -> shared memory, stage s.
    auto store_tiles = [&](int s) {
#pragma unroll
        for (int l = 0; l < 1; ++l) {
            const int idx = tid + l * 256;
            const int r = idx / (BM / VEC), c = (idx % (BM / VEC)) * VEC;
#pragma unroll
            for (int v = 0; v < VEC; ++v)
                As[s * A_TILE + r * A_STRIDE + c + v] = a_stage[l * VEC + v];
        }
#pragma unroll
        for (int l = 0; l < 1; ++l) {
            const int idx = tid + l * 256;
            const int r = idx / (BK / VEC), c = (idx % (BK / VEC)) * VEC;
#pragma unroll
            for (int v = 0; v < VEC; ++v) Bs[s * B_TILE + (c + v) * B_STRIDE + r] = b_stage[l * VEC + v];
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
            for (int i = 0; i < TM; i += 4) {
                const float4 v = *reinterpret_cast<const float4*>(as + k * A_STRIDE + local_row(i));
                a[i + 0] = v.x;
                a[i + 1] = v.y;
                a[i + 2] = v.z;
                a[i + 3] = v.w;
            }
#pragma unroll
            for (int j = 0; j < TN; j += 4) {
                const float4 v = *reinterpret_cast<const float4*>(bs + k * B_STRIDE + local_col(j));
                b[j + 0] = v.x;
                b[j + 1] = v.y;
                b[j + 2] = v.z;
                b[j + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
        }
    };


    // Double buffering: the next tile travels from global memory into registers while this one is
    // multiplied, then lands in the other buffer; one barrier per tile.
    if (n_tiles > 0) {
        load_tiles(k_begin);
        store_tiles(0);
        __syncthreads();
    }
    for (int t = 0; t < n_tiles; ++t) {
        const bool more = t + 1 < n_tiles;
        if (more) load_tiles(k_begin + (t + 1) * BK);
        multiply_tile(t & 1);
        if (more) store_tiles((t + 1) & 1);
        __syncthreads();
    }

    // Store the register tile; columns in groups of 4, one wide store where the group is inside C and aligned.
    const bool c_vector_ok = (N % 4 == 0) && aligned_to(C, 4 * sizeof(T));
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = row0 + local_row(i);
        if (row >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; j += 4) {
            const int col = col0 + local_col(j);
            if (c_vector_ok && col + 4 <= N) {
                float4 v;
                v.x = acc[i][j + 0];
                v.y = acc[i][j + 1];
                v.z = acc[i][j + 2];
                v.w = acc[i][j + 3];
                *reinterpret_cast<float4*>(C + (size_t)row * N + col) = v;
                continue;
            }
#pragma unroll
            for (int v = 0; v < 4; ++v)
                if (col + v < N) C[(size_t)row * N + col + v] = acc[i][j + v];
        }
    }
}
