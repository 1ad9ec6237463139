// autotile matmul, float32 through 3xTF32 tensor cores: C = A B, layout tt: A stored transposed, K x M row-major (A[k*M + m]), B stored transposed, N x K row-major (B[n*K + k]), C row-major.
// config: MATH=tf32x3,smem=dynamic,BM=64,BN=64,TM=1,TN=1,BK=32,VEC=4,A_TRANSPOSED=False,PAD=0,STAGES=4,SPLIT_K=1,SWIZZLE=8,UNROLL=full
// block of 2 x 2 warps computes a 64 x 64 tile of C; each warp 32 x 32 (2 x 4 mma tiles of 16 x 8).
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


// The operands are split at 2^13 times their value (SCALE), and the products come out 2^26 times too large
// (the kernel scales C back at the end, exactly). At that scale every float32, denormals included, has its
// small part on the tensor cores' grid: a TF32 operand is a float32's top 19 bits, which for a denormal
// means multiples of 2^-136, and 2^13 x a float32 is a multiple of 2^-136. Unscaled, the small part of a
// value below about 2^-112 would lose bits there (FP32-level accuracy needs them: an operand of 2^-120
// times one of 2^110 is an ordinary product). The price is range at the top: a scaled value or product
// past FLT_MAX turns Inf, which the kernel sees and answers by taking the exact path (see the end of
// the K loop); that starts at products and partial sums of 2^102, and operands of 2^115.
constexpr float SCALE = 0x1p13f, UNSCALE = 0x1p-26f;

// x SCALE = big + small + O(2^-22 x SCALE), big and small rounded to TF32 to nearest. From sm_90 one
// instruction rounds (cvt.rn.tf32.f32, ties to even), which makes the split as cheap as it was without the
// scale: 4 instructions per element. Before sm_90 only cvt.rna exists (4 instructions by itself), so the
// rounding is done on the bits: adding half a TF32 unit (0x1000) carries into bit 13 exactly when rna
// rounds up, and masking the low 13 bits gives big; small needs only the add (the tensor cores read a
// TF32 operand's top 19 bits). That add is taken as a signed max with small itself, which changes
// nothing but a NaN: the GPU's NaN is 0x7fffffff, which the add would carry into the sign bit (-0).
// Either way a NaN operand reaches the tensor cores in small (x - big is NaN whatever big is).
__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small) {
    const float scaled = x * SCALE;  // exact: a power of two, and denormals are kept (-ftz=false)
#if __CUDA_ARCH__ >= 900
    asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(big) : "f"(scaled));
    asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(small) : "f"(scaled - __uint_as_float(big)));
#else
    big = (__float_as_uint(scaled) + 0x1000u) & 0xffffe000u;
    const unsigned rest = __float_as_uint(scaled - __uint_as_float(big));
    // unsigned add (it wraps: no undefined overflow for the compiler to assume away), compared as signed
    small = static_cast<unsigned>(max(static_cast<int>(rest + 0x1000u), static_cast<int>(rest)));
#endif
}

// d += a b for one 16 x 8 x 8 tile: a is 16 x 8 (row), b is 8 x 8 (col), d is 16 x 8, float32.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

extern "C" __global__ void __launch_bounds__(128)
autotile_matmul(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                 int M, int N, int K)
{
    constexpr int BM = 64, BN = 64, BK = 32, VEC = 4, STAGES = 4;
    constexpr int WM = 32, WN = 32, MI = 2, NI = 4;
    // Row strides chosen so that the fragment reads below hit 32 different banks.
    // Tiles as in global memory: A [BK][BM + pad], B [BN][BK + pad].
    constexpr int A_STRIDE = 68, A_TILE = 32 * A_STRIDE;
    constexpr int B_STRIDE = 40, B_TILE = BN * B_STRIDE;
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
    const bool a_vector_ok = (M % VEC == 0) && aligned_to(A, VEC * 4);
    const bool b_vector_ok = (K % VEC == 0) && aligned_to(B, VEC * 4);

    // Copy l of a tile covers the tile's element (tid + l * THREADS) * VEC, row-major; with the tile's
    // width in vectors a power of two, that is row (this thread's row + a constant) and column (this
    // thread's column + a constant), so the per-copy addresses below are constant offsets.
    constexpr int A_COLS = BM / VEC, B_COLS = BK / VEC;
    const int a_row = tid / A_COLS, a_col = (tid % A_COLS) * VEC;
    const int b_row = tid / B_COLS, b_col = (tid % B_COLS) * VEC;
    const T* a_first = A + (size_t)(k_begin + a_row) * M + row0 + a_col;  // tile 0, copy 0
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
            const T* src = a_first + (size_t)t * BK * M;
            T* dst = as + a_row * A_STRIDE + a_col;
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                const int dr = (l * 128) / A_COLS, dc = ((l * 128) % A_COLS) * VEC;
                copy_async<VEC * 4>(dst + dr * A_STRIDE + dc, src + (size_t)dr * M + dc, VEC * 4);
            }
        } else if (a_rows_inside && k_inside) {
            // Rows that do not start VEC-aligned (M % VEC != 0): 16 copies of one element,
            // neighbouring threads on neighbouring elements so that a warp's copies are contiguous.
            const T* src = A + (size_t)(k0 + tid / BM) * M + row0 + tid % BM;
            T* dst = as + (tid / BM) * A_STRIDE + tid % BM;
#pragma unroll
            for (int l = 0; l < 16; ++l) {
                const int dr = (l * 128) / BM, dc = (l * 128) % BM;
                copy_async<4>(dst + dr * A_STRIDE + dc, src + (size_t)dr * M + dc, 4);
            }
        } else {
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                const int idx = tid + l * 128;
                const int r = idx / A_COLS, c = (idx % A_COLS) * VEC;
                const int gr = k0 + r, gc = row0 + c;
                const int valid = gr < k_end ? max(0, min(VEC, M - gc)) : 0;
                if (a_vector_ok) {
                    copy_async<VEC * 4>(as + r * A_STRIDE + c, valid > 0 ? A + (size_t)gr * M + gc : A, valid * 4);
                    continue;
                }
#pragma unroll
                for (int v = 0; v < VEC; ++v)
                    copy_async<4>(as + r * A_STRIDE + c + v, v < valid ? A + (size_t)gr * M + gc + v : A, v < valid ? 4 : 0);
            }
        }
        if (b_vector_ok && b_cols_inside && k_inside) {
            const T* src = b_first + t * BK;
            T* dst = bs + b_row * B_STRIDE + b_col;
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                const int dr = (l * 128) / B_COLS, dc = ((l * 128) % B_COLS) * VEC;
                copy_async<VEC * 4>(dst + dr * B_STRIDE + dc, src + (size_t)dr * K + dc, VEC * 4);
            }
        } else if (b_cols_inside && k_inside) {
            const T* src = B + (size_t)(col0 + tid / BK) * K + k0 + tid % BK;
            T* dst = bs + (tid / BK) * B_STRIDE + tid % BK;
#pragma unroll
            for (int l = 0; l < 16; ++l) {
                const int dr = (l * 128) / BK, dc = (l * 128) % BK;
                copy_async<4>(dst + dr * B_STRIDE + dc, src + (size_t)dr * K + dc, 4);
            }
        } else {
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                const int idx = tid + l * 128;
                const int r = idx / B_COLS, c = (idx % B_COLS) * VEC;
                const int gr = col0 + r, gc = k0 + c;
                const int valid = gr < N ? max(0, min(VEC, k_end - gc)) : 0;
                if (b_vector_ok) {
                    copy_async<VEC * 4>(bs + r * B_STRIDE + c, valid > 0 ? B + (size_t)gr * K + gc : B, valid * 4);
                    continue;
                }
#pragma unroll
                for (int v = 0; v < VEC; ++v)
                    copy_async<4>(bs + r * B_STRIDE + c + v, v < valid ? B + (size_t)gr * K + gc + v : B, v < valid ? 4 : 0);
            }
        }
    };


    float acc[MI][NI][4];
    auto clear_acc = [&]() {
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j)
#pragma unroll
                for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.0f;
    };
    clear_acc();

    // The mma k index q of a fragment (A's column, B's row) maps to the tile's k = 2 * (q % 4) + q / 4:
    // any one-to-one map gives the same sum, and this one puts a lane's two A elements of a row side by
    // side (one 8-byte read) and spreads a warp's B reads over 32 banks.
    // Layout tt: A's tile is [k][m], so a lane reads its A elements one by one (rows k and k + 1, 4 mod 16 apart); B's tile is [n][k], so a lane's two B elements of a column lie side by side (one 8-byte read).
    //
    // The tensor cores add into their accumulator with truncation, not rounding: summed over all of K,
    // that bias grows like K (an error ten times FP32's at K = 4096). So each tile's products are summed
    // by the mma into `part`, from zero, and `part` is added into `acc` with round-to-nearest FADDs: the
    // truncated sums stay 4 mma steps long, and the error grows like an FP32 sum's.
    auto multiply_tile = [&](int s) {
        const float* as = As + s * A_TILE + 2 * quad * A_STRIDE + warp_row + group;
        const float* bs = Bs + s * B_TILE + (warp_col + group) * B_STRIDE + 2 * quad;
        float part[MI][NI][4];
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j)
#pragma unroll
                for (int v = 0; v < 4; ++v) part[i][j][v] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 8) {
            unsigned a_big[MI][4], a_small[MI][4], b_big[NI][2], b_small[NI][2];
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                split_tf32(as[kk * A_STRIDE + i * 16], a_big[i][0], a_small[i][0]);  // row group,     k = 2 quad
                split_tf32(as[kk * A_STRIDE + i * 16 + 8], a_big[i][1], a_small[i][1]);  // row group + 8, k = 2 quad
                split_tf32(as[(kk + 1) * A_STRIDE + i * 16], a_big[i][2], a_small[i][2]);  // row group,     k = 2 quad + 1
                split_tf32(as[(kk + 1) * A_STRIDE + i * 16 + 8], a_big[i][3], a_small[i][3]);  // row group + 8, k = 2 quad + 1
            }
#pragma unroll
            for (int j = 0; j < NI; ++j) {
                const float2 pair = *reinterpret_cast<const float2*>(bs + j * 8 * B_STRIDE + kk);
                split_tf32(pair.x, b_big[j][0], b_small[j][0]);  // k = 2 quad,     column group
                split_tf32(pair.y, b_big[j][1], b_small[j][1]);  // k = 2 quad + 1, column group
            }
            // The small terms first, so that they are not rounded away against a large partial sum.
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j) {
                    mma_tf32(part[i][j], a_small[i], b_big[j]);
                    mma_tf32(part[i][j], a_big[i], b_small[j]);
                    mma_tf32(part[i][j], a_big[i], b_big[j]);
                }
        }
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j)
#pragma unroll
                for (int v = 0; v < 4; ++v) acc[i][j][v] += part[i][j][v];
    };

    // The exact path, for the rare block the fast path cannot serve (see the end of the K loop): this warp's
    // elements of C as FP32 FMAs, each tile's products summed in K order and the tile's sum added to acc,
    // as the fast path does (and as blocked SGEMM kernels do: the rounding error of a sum grows with the
    // length of its chains). FP32 arithmetic throughout, so Inf and NaN come out as SGEMM's.
    auto multiply_tile_exact = [&](int s) {
        const float* as = As + s * A_TILE + warp_row + group;
        const float* bs = Bs + s * B_TILE + (warp_col + 2 * quad) * B_STRIDE;
        float part[MI][NI][4];
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j)
#pragma unroll
                for (int v = 0; v < 4; ++v) part[i][j][v] = 0.0f;
#pragma unroll 2
        for (int k = 0; k < BK; ++k) {
            float a[MI][2], b[NI][2];
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                a[i][0] = as[k * A_STRIDE + i * 16];
                a[i][1] = as[k * A_STRIDE + i * 16 + 8];
            }
#pragma unroll
            for (int j = 0; j < NI; ++j) {
                b[j][0] = bs[j * 8 * B_STRIDE + k];
                b[j][1] = bs[(j * 8 + 1) * B_STRIDE + k];
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j)
#pragma unroll
                    for (int v = 0; v < 4; ++v) part[i][j][v] = fmaf(a[i][v / 2], b[j][v % 2], part[i][j][v]);
        }
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j)
#pragma unroll
                for (int v = 0; v < 4; ++v) acc[i][j][v] += part[i][j][v];
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

    // Where the fast path cannot give SGEMM's result, its own result says so: Inf and NaN operands, scaled
    // operands that round to Inf, and scaled products or sums past FLT_MAX all leave an Inf or a NaN in
    // the tile. A block where any thread holds one computes its tile again exactly, so its results, Inf
    // and NaN included, are SGEMM's (cost: about three times the fast path, for those blocks only).
    bool suspect = false;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int v = 0; v < 4; ++v) suspect |= !(fabsf(acc[i][j][v]) <= 3.402823466e38f);  // Inf or NaN
    if (__syncthreads_or(suspect)) {  // also: every warp is done with the tiles the loop reloads
        clear_acc();
        run_k_loop(multiply_tile_exact);
    } else {
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j)
#pragma unroll
                for (int v = 0; v < 4; ++v) acc[i][j][v] *= UNSCALE;  // exact, denormal results included
    }

    // Store: a lane holds rows group and group + 8 of each mma tile, two neighbouring columns each.
    const bool c_vector_ok = (N % 2 == 0) && aligned_to(C, 8);
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
                    *reinterpret_cast<float2*>(out) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                } else {
                    if (col < N) out[0] = acc[i][j][2 * h];
                    if (col + 1 < N) out[1] = acc[i][j][2 * h + 1];
                }
            }
}
