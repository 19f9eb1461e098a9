// Token / position embedding: a row gather forward and a deterministic scatter-add backward.
#include "common.cuh"

// out[t, :] = weight[idx[t], :]. Launch: one block per token, 256 threads striding over C.
// weight: (V, C); idx: (N,) int64, every id in [0, V): cuda.py checks that on the host before
// the launch and raises the ValueError embedding/cpu.py raises (no bounds check here). As
// cpu.embedding_fwd (weight[idx]).
template <typename T>
__global__ void embedding_fwd(const T* weight, const long long* idx, T* out, int C) {
    const T* src = weight + idx[blockIdx.x] * C;
    T* dst = out + (long long)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}

// dweight[id, :] = sum of dout[t, :] over the tokens t with idx[t] == id, in increasing t.
// keys: (N,) sorted values of idx[t] * N + t, so equal ids form runs ordered by position.
// Launch: one block per sorted position, 256 threads striding over C; the block at the first
// position of a run sums that run's rows in order (every other block returns), so the result
// does not depend on scheduling: deterministic, and the same order as cpu.embedding_bwd
// (stable argsort, then add.reduceat). dout: (N, C); dweight: (V, C), zeroed by the caller;
// every id in [0, V), checked by cuda.py as for the forward.
template <typename T>
__global__ void embedding_bwd(const T* dout, const long long* keys, T* dweight, int N, int C) {
    const int start = blockIdx.x;
    const long long id = keys[start] / N;
    if (start > 0 && keys[start - 1] / N == id) return;
    int end = start + 1;
    while (end < N && keys[end] / N == id) ++end;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        acc_t<T> sum = 0;
        for (int j = start; j < end; ++j) sum += to_acc(dout[(keys[j] % N) * C + c]);
        dweight[id * C + c] = from_acc<T>(sum);
    }
}

#ifdef TG_CHECK_INSTANTIATE
// Every variant cuda.py launches (see elementwise.cu).
void* tg_instances_embedding[] = {
    (void*)&embedding_fwd<float>, (void*)&embedding_fwd<__half>,
    (void*)&embedding_fwd<__nv_bfloat16>, (void*)&embedding_fwd<double>,
    (void*)&embedding_bwd<float>, (void*)&embedding_bwd<__half>,
    (void*)&embedding_bwd<__nv_bfloat16>, (void*)&embedding_bwd<double>,
};
#endif
