// autotile matvec, float32: y = A x, A row-major.
// config: smem=none,ROWS=4,THREADS_K=32,VEC=4,X_SHARED=False,STAGE_A=False,TILE_K=16,SPLIT_K=8,SPLIT_REDUCE=last_block,UNROLL=4
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

extern "C" __global__ void __launch_bounds__(128)
autotile_matvec(const T* __restrict__ A, const T* __restrict__ x, T* __restrict__ y, int M, int K,
                 T* __restrict__ partials, unsigned int* __restrict__ tickets)
{
    constexpr int ROWS = 4, THREADS_K = 32, VEC = 4, THREADS = 128;
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    // Split-K: block column blockIdx.y takes one run of K (a multiple of VEC long, so wide loads stay
    // aligned) and adds its partial sums into y.
    const int k_len = ((K + 8 - 1) / 8 + VEC - 1) / VEC * VEC;
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
    // Split-K, summed by the last block: this split's partial sums go to its slice of the workspace
    // (SPLIT_K slices of M); the last split of this block of rows to arrive adds them in split order.
    if (lane == 0 && row_ok) partials[(size_t)blockIdx.y * M + row] = acc;
    if (!split_arrived_last<8>(tickets + blockIdx.x, tid == 0)) return;
    if (lane == 0 && row_ok) y[row] = sum_splits<8>(partials + row, M, blockIdx.y, acc);
}
