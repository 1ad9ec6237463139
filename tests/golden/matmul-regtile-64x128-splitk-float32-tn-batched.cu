// autotile matmul, float32: C = A B, layout tn: A stored transposed, K x M row-major (A[k*M + m]), B K x N row-major, C row-major.
// batched: C[b] = A[b] B[b] for b < gridDim.z / 2, A[b] at A + b * stride_a, B[b] at B + b * stride_b, C[b] at C + b * M * N.
// config: smem=dynamic,BM=64,BN=128,TM=8,TN=8,BK=16,VEC=4,A_TRANSPOSED=False,PAD=0,STAGES=2,SPLIT_K=2,SWIZZLE=1,UNROLL=full
// block 16 x 8 threads computes a 64 x 128 tile of C; each thread 8 x 8 outputs.
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
autotile_bmm(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                 int M, int N, int K, long long stride_a, long long stride_b)
{
    constexpr int BM = 64, BN = 128, TM = 8, TN = 8;
    constexpr int TX = 16, TY = 8;
    const int tx = threadIdx.x, ty = threadIdx.y;
    // Batched: blockIdx.z = batch * 2 + split; matrix `batch` of A and B starts batch * stride_a and
    // batch * stride_b elements in (a stride of 0 shares the operand), C's batch * M * N.
    const int split = blockIdx.z % 2, batch = blockIdx.z / 2;
    A += batch * stride_a;
    B += batch * stride_b;
    C += (size_t)batch * M * N;
    const int row0 = blockIdx.y * BM;
    const int col0 = blockIdx.x * BN;

    // This thread's outputs: rows row0 + local_row(i), columns col0 + local_col(j).
    auto local_row = [&](int i) { return (i / 1) * (TY * 1) + ty * 1 + i % 1; };
    auto local_col = [&](int j) { return (j / 4) * (TX * 4) + tx * 4 + j % 4; };

    T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

    // Shared-memory tiles, 2 stage(s). A is staged as [BM][BK + PAD]
    // and B as [BK][BN + PAD].
    constexpr int BK = 16, VEC = 4, STAGES = 2;
    constexpr int A_STRIDE = 16, A_TILE = 64 * A_STRIDE;
    constexpr int B_STRIDE = 128, B_TILE = BK * B_STRIDE;
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    T* As = reinterpret_cast<T*>(shared_bytes);
    T* Bs = As + STAGES * A_TILE;

    const int tid = ty * TX + tx;
    // Wide loads only where every row starts aligned; otherwise the scalar path of load_guarded.
    const bool a_vector_ok = (M % VEC == 0) && aligned_to(A, VEC * sizeof(T));
    const bool b_vector_ok = (N % VEC == 0) && aligned_to(B, VEC * sizeof(T));

    // Split-K: block z takes a contiguous run of K tiles and adds its partial tile into C.
    const int tiles_k = (K + BK - 1) / BK;
    const int tiles_per_split = (tiles_k + 2 - 1) / 2;
    const int k_begin = split * tiles_per_split * BK;
    const int k_end = min(K, k_begin + tiles_per_split * BK);
    const int n_tiles = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;

    // Global -> registers: 2 vector(s) of A and 4 of B per thread, zero outside the matrix.
    T a_stage[8], b_stage[16];
    auto load_tiles = [&](int k0) {
#pragma unroll
        for (int l = 0; l < 2; ++l) {
            const int idx = tid + l * 128;
            const int r = idx / (BM / VEC), c = (idx % (BM / VEC)) * VEC;
            const int gr = k0 + r, gc = row0 + c;
            const int valid = gr < k_end ? min(VEC, M - gc) : 0;
            load_guarded<VEC>(A, (size_t)gr * M + gc, valid, a_vector_ok, a_stage + l * VEC);
        }
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const int idx = tid + l * 128;
            const int r = idx / (BN / VEC), c = (idx % (BN / VEC)) * VEC;
            const int gr = k0 + r, gc = col0 + c;
            const int valid = gr < k_end ? min(VEC, N - gc) : 0;
            load_guarded<VEC>(B, (size_t)gr * N + gc, valid, b_vector_ok, b_stage + l * VEC);
        }
    };
    // Registers -> shared memory, stage s.
    auto store_tiles = [&](int s) {
#pragma unroll
        for (int l = 0; l < 2; ++l) {
            const int idx = tid + l * 128;
            const int r = idx / (BM / VEC), c = (idx % (BM / VEC)) * VEC;
#pragma unroll
            for (int v = 0; v < VEC; ++v)
                As[s * A_TILE + (c + v) * A_STRIDE + r] = a_stage[l * VEC + v];
        }
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const int idx = tid + l * 128;
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
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = row0 + local_row(i);
        if (row >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int col = col0 + local_col(j);
            if (col < N) atomicAdd(&C[(size_t)row * N + col], acc[i][j]);  // partial sums of the K splits
        }
    }
}
