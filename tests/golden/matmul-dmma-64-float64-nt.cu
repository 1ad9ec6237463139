// autotile matmul, float64 on the FP64 tensor cores: C = A B, layout nt: A M x K row-major, B stored transposed, N x K row-major (B[n*K + k]), C row-major.
// config: MATH=dmma,smem=dynamic,BM=64,BN=64,TM=1,TN=1,BK=16,VEC=2,A_TRANSPOSED=False,PAD=0,STAGES=4,SPLIT_K=1,SWIZZLE=8,UNROLL=full
// block of 2 x 2 warps computes a 64 x 64 tile of C; each warp 32 x 32 (2 x 4 mma tiles of 16 x 8, 8 deep).
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

__device__ __forceinline__ unsigned shared_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Copies BYTES from global to shared memory without passing through registers; of them, the first
// `src_bytes` are read and the rest are written as zeros (the edge of the matrix).
template <int BYTES>
__device__ __forceinline__ void copy_async(void* dst, const void* src, int src_bytes) {
    if (BYTES == 16)  // .cg: through L2 only; the tile is reused from shared memory, not from L1
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(shared_address(dst)), "l"(src), "r"(src_bytes));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" :: "r"(shared_address(dst)), "l"(src), "n"(BYTES), "r"(src_bytes));
}

__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int PENDING>
__device__ __forceinline__ void copy_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(PENDING)); }


// d += a b for one 16 x 8 x KM tile in float64 (KM = 4, 8 or 16). The fragments are those of
// mma.m16n8kKM: a[2 s + h] is A's row group + 8 h at k = 4 s + quad, b[s] is B's row 4 s + quad at column
// group, d[2 h + c] is C's row group + 8 h at column 2 quad + c. KM/4 blocks s of 4 deep: that is also KM/4
// m16n8k4 tiles, each two m8n8k4 (rows group and group + 8), which is how sm_80 computes it.
template <int KM>
__device__ __forceinline__ void mma_f64(double (&d)[4], const double* a, const double* b) {
#if __CUDA_ARCH__ >= 900
    if (KM == 16)
        asm("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5, %6, %7, %8, %9, %10, %11}, {%12, %13, %14, %15}, {%0, %1, %2, %3};\n"
            : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
            : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]), "d"(a[7]),
              "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
    else if (KM == 8)
        asm("mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
            : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
    else
        asm("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
            : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
            : "d"(a[0]), "d"(a[1]), "d"(b[0]));
#else
#pragma unroll
    for (int s = 0; s < KM / 4; ++s) {
        asm("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
            : "+d"(d[0]), "+d"(d[1]) : "d"(a[2 * s]), "d"(b[s]));
        asm("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
            : "+d"(d[2]), "+d"(d[3]) : "d"(a[2 * s + 1]), "d"(b[s]));
    }
#endif
}

extern "C" __global__ void __launch_bounds__(128)
autotile_matmul(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                 int M, int N, int K)
{
    constexpr int BM = 64, BN = 64, BK = 16, VEC = 2, STAGES = 4;
    constexpr int WM = 32, WN = 32, MI = 2, NI = 4;
    // Row strides chosen so that the fragment reads below hit 32 different banks.
    // Tiles as in global memory: A [BM][BK + pad], B [BN][BK + pad].
    constexpr int A_STRIDE = 20, A_TILE = 64 * A_STRIDE;
    constexpr int B_STRIDE = 20, B_TILE = BN * B_STRIDE;
    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int group = lane / 4, quad = lane % 4;  // the mma fragment coordinates of this lane
    const int warp_row = (warp / 2) * WM, warp_col = (warp % 2) * WN;
    // Blocks are launched in groups of 8 block rows, column by column: blocks that run at the
    // same time share B's column tiles (and A's row tiles) in L2.
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int launch_group = blockIdx.x / (8 * tiles_n);
    const int first_m = launch_group * 8;
    const int rows_in_group = min(tiles_m - first_m, 8);
    const int in_group = blockIdx.x - launch_group * 8 * tiles_n;
    const int row0 = (first_m + in_group % rows_in_group) * BM;
    const int col0 = (in_group / rows_in_group) * BN;

    extern __shared__ __align__(16) unsigned char shared_bytes[];
    T* As = reinterpret_cast<T*>(shared_bytes);
    T* Bs = As + STAGES * A_TILE;

    const int k_begin = 0, k_end = K;
    const int n_tiles = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;
    // One copy of VEC elements where every row starts aligned; VEC copies of one element otherwise.
    const bool a_vector_ok = (K % VEC == 0) && aligned_to(A, VEC * 8);
    const bool b_vector_ok = (K % VEC == 0) && aligned_to(B, VEC * 8);

    // Copy l of a tile covers the tile's element (tid + l * THREADS) * VEC, row-major; with the tile's
    // width in vectors a power of two, that is row (this thread's row + a constant) and column (this
    // thread's column + a constant), so the per-copy addresses below are constant offsets.
    constexpr int A_COLS = BK / VEC, B_COLS = BK / VEC;
    const int a_row = tid / A_COLS, a_col = (tid % A_COLS) * VEC;
    const int b_row = tid / B_COLS, b_col = (tid % B_COLS) * VEC;
    const T* a_first = A + (size_t)(row0 + a_row) * K + k_begin + a_col;  // tile 0, copy 0
    const T* b_first = B + (size_t)(col0 + b_row) * K + k_begin + b_col;
    const bool a_rows_inside = row0 + BM <= M, b_cols_inside = col0 + BN <= N;

    // Starts the copies of tile t (K from k_begin + t * BK) into stage s: 4 vector(s) of A and
    // 4 of B per thread. A tile wholly inside the matrix takes the fast path, full copies at
    // constant offsets. Elsewhere each copy is checked: outside the matrix nothing is read (the
    // address is clamped to the matrix's start) and zeros are written.
    auto load_tiles = [&](int t, int s) {
        const int k0 = k_begin + t * BK;
        const bool k_inside = k0 + BK <= k_end;
        T* as = As + s * A_TILE;
        T* bs = Bs + s * B_TILE;
        if (a_vector_ok && a_rows_inside && k_inside) {
            const T* src = a_first + t * BK;
            T* dst = as + a_row * A_STRIDE + a_col;
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                const int dr = (l * 128) / A_COLS, dc = ((l * 128) % A_COLS) * VEC;
                copy_async<VEC * 8>(dst + dr * A_STRIDE + dc, src + (size_t)dr * K + dc, VEC * 8);
            }
        } else if (a_rows_inside && k_inside) {
            // Rows that do not start VEC-aligned (K % VEC != 0): 8 copies of one element,
            // neighbouring threads on neighbouring elements so that a warp's copies are contiguous.
            const T* src = A + (size_t)(row0 + tid / BK) * K + k0 + tid % BK;
            T* dst = as + (tid / BK) * A_STRIDE + tid % BK;
#pragma unroll
            for (int l = 0; l < 8; ++l) {
                const int dr = (l * 128) / BK, dc = (l * 128) % BK;
                copy_async<8>(dst + dr * A_STRIDE + dc, src + (size_t)dr * K + dc, 8);
            }
        } else {
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                const int idx = tid + l * 128;
                const int r = idx / A_COLS, c = (idx % A_COLS) * VEC;
                const int gr = row0 + r, gc = k0 + c;
                const int valid = gr < M ? max(0, min(VEC, k_end - gc)) : 0;
                if (a_vector_ok) {
                    copy_async<VEC * 8>(as + r * A_STRIDE + c, valid > 0 ? A + (size_t)gr * K + gc : A, valid * 8);
                    continue;
                }
#pragma unroll
                for (int v = 0; v < VEC; ++v)
                    copy_async<8>(as + r * A_STRIDE + c + v, v < valid ? A + (size_t)gr * K + gc + v : A, v < valid ? 8 : 0);
            }
        }
        if (b_vector_ok && b_cols_inside && k_inside) {
            const T* src = b_first + t * BK;
            T* dst = bs + b_row * B_STRIDE + b_col;
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                const int dr = (l * 128) / B_COLS, dc = ((l * 128) % B_COLS) * VEC;
                copy_async<VEC * 8>(dst + dr * B_STRIDE + dc, src + (size_t)dr * K + dc, VEC * 8);
            }
        } else if (b_cols_inside && k_inside) {
            const T* src = B + (size_t)(col0 + tid / BK) * K + k0 + tid % BK;
            T* dst = bs + (tid / BK) * B_STRIDE + tid % BK;
#pragma unroll
            for (int l = 0; l < 8; ++l) {
                const int dr = (l * 128) / BK, dc = (l * 128) % BK;
                copy_async<8>(dst + dr * B_STRIDE + dc, src + (size_t)dr * K + dc, 8);
            }
        } else {
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                const int idx = tid + l * 128;
                const int r = idx / B_COLS, c = (idx % B_COLS) * VEC;
                const int gr = col0 + r, gc = k0 + c;
                const int valid = gr < N ? max(0, min(VEC, k_end - gc)) : 0;
                if (b_vector_ok) {
                    copy_async<VEC * 8>(bs + r * B_STRIDE + c, valid > 0 ? B + (size_t)gr * K + gc : B, valid * 8);
                    continue;
                }
#pragma unroll
                for (int v = 0; v < VEC; ++v)
                    copy_async<8>(bs + r * B_STRIDE + c + v, v < valid ? B + (size_t)gr * K + gc + v : B, v < valid ? 8 : 0);
            }
        }
    };

    T acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.0;

    // Fragment reads are 8 bytes each, straight into the registers the mma takes (a 16-byte read of two
    // k's would need register moves: the mma wants rows group and group + 8 side by side). Rows A_STRIDE =
    // 4 mod 16 and B_STRIDE = 4 mod 16 apart keep each half-warp's reads on 32 different banks.
    constexpr int KM = 8, STEPS = BK / KM;  // k per mma; mma steps per tile
    // This lane's fragments of step kk: a[i] for row tile i (rows group and group + 8), b[j] for column
    // tile j, as mma_f64 takes them.
    auto load_a = [&](const T* as, int i, int kk, T (&a)[KM / 2]) {
#pragma unroll
        for (int q = 0; q < KM / 4; ++q) {
            a[2 * q] = as[(i * 16) * A_STRIDE + kk + 4 * q];          // row group
            a[2 * q + 1] = as[(i * 16 + 8) * A_STRIDE + kk + 4 * q];  // row group + 8
        }
    };
    auto load_b = [&](const T* bs, int j, int kk, T (&b)[KM / 4]) {
#pragma unroll
        for (int q = 0; q < KM / 4; ++q) b[q] = bs[j * 8 * B_STRIDE + kk + 4 * q];
    };
    auto multiply_tile = [&](int s) {
        const T* as = As + s * A_TILE + (warp_row + group) * A_STRIDE + quad;
        const T* bs = Bs + s * B_TILE + (warp_col + group) * B_STRIDE + quad;
        // Every step unrolled, the fragments double-buffered: step t + 1's reads are issued before step t's
        // mmas, so their latency hides behind them.
        T a[2][MI][KM / 2], b[2][NI][KM / 4];
#pragma unroll
        for (int i = 0; i < MI; ++i) load_a(as, i, 0, a[0][i]);
#pragma unroll
        for (int j = 0; j < NI; ++j) load_b(bs, j, 0, b[0][j]);
#pragma unroll
        for (int t = 0; t < STEPS; ++t) {
            if (t + 1 < STEPS) {
#pragma unroll
                for (int i = 0; i < MI; ++i) load_a(as, i, (t + 1) * KM, a[(t + 1) % 2][i]);
#pragma unroll
                for (int j = 0; j < NI; ++j) load_b(bs, j, (t + 1) * KM, b[(t + 1) % 2][j]);
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j) mma_f64<KM>(acc[i][j], a[t % 2][i], b[t % 2][j]);
        }
    };

    // The K loop: copies and multiplies every tile of this block's run of K with `multiply` (the fast
    // path or the exact one).
    auto run_k_loop = [&](auto multiply) {
        // The pipeline: tiles t+1 .. t+3 are in flight while tile t is multiplied. One commit group
        // per tile (empty past the end) keeps the count of groups in flight fixed.
#pragma unroll
        for (int t = 0; t < STAGES - 1; ++t) {
            if (t < n_tiles) load_tiles(t, t);
            copy_async_commit();
        }
        for (int t = 0; t < n_tiles; ++t) {
            copy_async_wait<STAGES - 2>();  // this thread's copies of tile t have landed
            // Everyone's copies of tile t have landed, and everyone is done with tile t-1, whose stage
            // the next copies overwrite.
            __syncthreads();
            const int next = t + STAGES - 1;
            if (next < n_tiles) load_tiles(next, next % STAGES);
            copy_async_commit();
            multiply(t % STAGES);
        }
    };
    run_k_loop(multiply_tile);

    // Store: a lane holds rows group and group + 8 of each mma tile, two neighbouring columns each.
    const bool c_vector_ok = (N % 2 == 0) && aligned_to(C, 16);
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + warp_row + i * 16 + h * 8 + group;
                const int col = col0 + warp_col + j * 8 + 2 * quad;
                if (row >= M) continue;
                T* out = C + (size_t)row * N + col;
                if (c_vector_ok && col + 2 <= N) {
                    *reinterpret_cast<double2*>(out) = make_double2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                } else {
                    if (col < N) out[0] = acc[i][j][2 * h];
                    if (col + 1 < N) out[1] = acc[i][j][2 * h + 1];
                }
            }
}
