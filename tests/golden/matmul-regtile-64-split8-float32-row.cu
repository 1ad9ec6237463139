// autotile matmul, float32: C = A B, row-major.
// config: smem=static,BM=64,BN=64,TM=4,TN=4,BK=16,VEC=4,A_TRANSPOSED=True,PAD=4,STAGES=2,SPLIT_K=8,SPLIT_REDUCE=last_block,SWIZZLE=1,UNROLL=full
// block 16 x 16 threads computes a 64 x 64 tile of C; each thread 4 x 4 outputs.
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

// Split-K without atomics on the output. Every split of an output tile stores its raw partial results to
// its slice of `partials` (plain stores), then calls split_arrived_last: true in every thread of the block
// that was the last of the tile's SPLITS splits to arrive. That block alone reads the other slices and
// stores the output, so the output needs no zeroing and sees no atomics; it resets the ticket, so the next
// launch needs no zeroing either.
//
// Memory ordering: each thread fences after its partial stores, the barrier gathers the block, and thread 0
// fences again (the release, cumulative over the block's stores it synchronized with) before its atomicAdd
// on the ticket. The last block's thread 0 fences after the atomic (the acquire), and the barrier that
// broadcasts the answer orders every thread's reads after it; the reads go through L2 (__ldcg), the point
// of coherence, never a stale L1 line.
template <int SPLITS>
__device__ __forceinline__ bool split_arrived_last(unsigned int* ticket, bool leader) {
    __threadfence();  // this thread's partial stores are visible device-wide ...
    __syncthreads();  // ... and so are every thread's, before the leader takes the ticket
    bool last = false;
    if (leader) {
        __threadfence();
        last = atomicAdd(ticket, 1u) == SPLITS - 1;
        if (last) {
            atomicExch(ticket, 0u);  // every split of the tile has its ticket: ready for the next launch
            __threadfence();
        }
    }
    return __syncthreads_or(last);  // the barrier broadcasts the leader's answer, no shared memory needed
}

// The sum of one output element over the SPLITS slices (`slice` elements apart), always in split order
// 0, 1, ..., SPLITS-1, so the bits do not depend on which split arrived last; the caller's own partial
// comes from its registers (the very value it stored) and the others from L2.
template <int SPLITS>
__device__ __forceinline__ T sum_splits(const T* p, size_t slice, int own, T mine) {
    T sum = own == 0 ? mine : __ldcg(p);
#pragma unroll
    for (int s = 1; s < SPLITS; ++s) sum += s == own ? mine : __ldcg(p + s * slice);
    return sum;
}

extern "C" __global__ void __launch_bounds__(256)
autotile_matmul(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                 int M, int N, int K, T* __restrict__ partials, unsigned int* __restrict__ tickets)
{
    constexpr int BM = 64, BN = 64, TM = 4, TN = 4;
    constexpr int TX = 16, TY = 16;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row0 = blockIdx.y * BM;
    const int col0 = blockIdx.x * BN;

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
    constexpr int BK = 16, VEC = 4, STAGES = 2;
    constexpr int A_STRIDE = 68, A_TILE = 16 * A_STRIDE;
    constexpr int B_STRIDE = 68, B_TILE = BK * B_STRIDE;
    __shared__ __align__(16) T As[STAGES * A_TILE];
    __shared__ __align__(16) T Bs[STAGES * B_TILE];

    const int tid = ty * TX + tx;
    // Wide loads only where every row starts aligned; otherwise the scalar path of load_guarded.
    const bool a_vector_ok = (K % VEC == 0) && aligned_to(A, VEC * sizeof(T));
    const bool b_vector_ok = (N % VEC == 0) && aligned_to(B, VEC * sizeof(T));

    // Split-K: block z takes a contiguous run of K tiles and adds its partial tile into C.
    const int tiles_k = (K + BK - 1) / BK;
    const int tiles_per_split = (tiles_k + 8 - 1) / 8;
    const int k_begin = blockIdx.z * tiles_per_split * BK;
    const int k_end = min(K, k_begin + tiles_per_split * BK);
    const int n_tiles = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;

    // Global -> registers: 1 vector(s) of A and 1 of B per thread, zero outside the matrix.
    T a_stage[4], b_stage[4];
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
                As[s * A_TILE + (c + v) * A_STRIDE + r] = a_stage[l * VEC + v];
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
    // Split-K, summed by the last block: this split's raw partial tile goes to its slice of the workspace
    // (SPLIT_K slices of M x N, indexed like C, so that stores and reads follow C's pattern and a short
    // M costs no padding to whole tiles), stored like C.
    T* const slice = partials + (size_t)blockIdx.z * M * N;
    const bool slice_vector_ok = (N % 4 == 0) && aligned_to(slice, 4 * sizeof(T));
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = row0 + local_row(i);
        if (row >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; j += 4) {
            const int col = col0 + local_col(j);
            if (slice_vector_ok && col + 4 <= N) {
                float4 v;
                v.x = acc[i][j + 0];
                v.y = acc[i][j + 1];
                v.z = acc[i][j + 2];
                v.w = acc[i][j + 3];
                *reinterpret_cast<float4*>(slice + (size_t)row * N + col) = v;
                continue;
            }
#pragma unroll
            for (int v = 0; v < 4; ++v)
                if (col + v < N) slice[(size_t)row * N + col + v] = acc[i][j + v];
        }
    }
    const int tile = (row0 / BM) * ((N + BN - 1) / BN) + col0 / BN;  // one ticket per output tile
    if (!split_arrived_last<8>(tickets + tile, threadIdx.x == 0 && threadIdx.y == 0)) return;
    // The last split of the tile: each thread sums, in split order, the elements it holds itself.
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = row0 + local_row(i);
        if (row >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int col = col0 + local_col(j);
            if (col < N) acc[i][j] = sum_splits<8>(partials + (size_t)row * N + col, (size_t)M * N, blockIdx.z, acc[i][j]);
        }
    }
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
