// cuda_attention: the paged KV cache on the GPU: writing new keys and
// values into their slots, and decode attention reading them back through
// block tables (kernels/cpu/attention.h is the reference; the layout is
// engine/kv_memory.h: per layer (n_slots, kv_dim), slot = block * block_size
// + position % block_size).
//
// paged_attention_kernel: one thread block per (query row, KV head, head
// group of up to 8 query heads, partition of CUDA_ATTENTION_PARTITION
// positions). The block's 128 threads form "segments" of L lanes; a
// segment reads one token's key and value row of this KV head (L lanes x
// VB bytes each, VB = 16 where the row allows it) and updates, for each of
// the query heads sharing the KV head, a running max m, a running sum l
// and a running output acc (online softmax, fp32):
//   s = (q . k) [* key_scale] / sqrt(head_dim)
//   m' = max(m, s); l = l e^(m - m') + e^(s - m'); acc = acc e^(m - m') + e^(s - m') v
// so K and V are read once, whatever the number of query heads per KV
// head. Segments then merge inside the block; partitions (long contexts)
// merge in paged_attention_reduce_kernel the same way.
#include <cfloat>

#include "kernels/cuda/cuda_common.cuh"

constexpr int ATT_THREADS = 128;
constexpr int ATT_MAX_GROUP = 8;      // query heads per block
constexpr int ATT_MAX_ELEMENTS = 8;   // KV elements per lane per token (registers)
constexpr int ATT_MAX_HEAD_DIM = 256; // 32 lanes x 8 elements

struct attention_params {
    float* out;         // (n_rows, query_stride): the heads' outputs
    const float* query; // (n_rows, query_stride)
    int query_stride;
    const uint8_t* keys; // (n_slots, kv_dim) elements
    const uint8_t* values;
    const float* key_scales; // KV_I8: (n_slots, n_kv_heads)
    const float* value_scales;
    const int32_t* block_tables;    // concatenated physical block ids
    const int32_t* table_offsets;   // (n_rows) where row r's table starts
    const int32_t* context_lengths; // (n_rows)
    int n_heads, n_kv_heads, head_dim, block_size;
    int heads_per_kv_head; // n_heads / n_kv_heads
    int head_groups;       // ceil(heads_per_kv_head / ATT_MAX_GROUP)
    int n_partitions;      // gridDim.z; 1: write out directly
    int lanes_per_token;   // L: a power of two <= 32
    int vectors_per_lane;  // VB-byte loads per lane per token row
    float* partial_max;    // (n_rows, n_heads, n_partitions)
    float* partial_sum;    // (n_rows, n_heads, n_partitions)
    float* partial_out;    // (n_rows, n_heads, n_partitions, head_dim) unnormalized
};

template <int VB> struct raw_vector { uint32_t words[VB >= 4 ? VB / 4 : 1]; };

template <int VB> __device__ __forceinline__ raw_vector<VB> load_raw(const uint8_t* pointer) {
    raw_vector<VB> raw;
    if constexpr (VB == 16) {
        const uint4 v = __ldg((const uint4*)pointer);
        raw.words[0] = v.x, raw.words[1] = v.y, raw.words[2] = v.z, raw.words[3] = v.w;
    } else if constexpr (VB == 8) {
        const uint2 v = __ldg((const uint2*)pointer);
        raw.words[0] = v.x, raw.words[1] = v.y;
    } else if constexpr (VB == 4) {
        raw.words[0] = __ldg((const unsigned int*)pointer);
    } else {
        raw.words[0] = __ldg((const unsigned short*)pointer);
    }
    return raw;
}

template <int DTYPE> struct kv_element_bytes {
    static constexpr int value = DTYPE == KV_F32 ? 4 : DTYPE == KV_F16 ? 2 : 1;
};

// Element e of a loaded vector, widened (an int8 one still unscaled).
template <int DTYPE> __device__ __forceinline__ float kv_element(const uint32_t* words, int e) {
    if constexpr (DTYPE == KV_F32)
        return __uint_as_float(words[e]);
    else if constexpr (DTYPE == KV_F16)
        return half_bits_to_float((uint16_t)(words[e >> 1] >> (16 * (e & 1))));
    else
        return (float)(int8_t)(uint8_t)(words[e >> 2] >> (8 * (e & 3)));
}

template <int DTYPE, int VB>
__global__ void __launch_bounds__(ATT_THREADS, 4) paged_attention_kernel(attention_params p) {
    constexpr int ELEMENT_BYTES = kv_element_bytes<DTYPE>::value;
    constexpr int PER_VECTOR = VB / ELEMENT_BYTES;             // elements per load
    constexpr int MAX_VECTORS = ATT_MAX_ELEMENTS / PER_VECTOR; // loads per lane per row
    constexpr int N_WARPS = ATT_THREADS / 32;
    extern __shared__ float shared[]; // attention_shared_bytes(): query (heads, head_dim), then warp_out
    __shared__ float warp_max[N_WARPS][ATT_MAX_GROUP], warp_sum[N_WARPS][ATT_MAX_GROUP];

    const int kv_head = blockIdx.x / p.head_groups, head_group = blockIdx.x % p.head_groups;
    const int row = blockIdx.y, partition = blockIdx.z;
    const int first_head = kv_head * p.heads_per_kv_head + head_group * ATT_MAX_GROUP;
    const int n_group_heads = min(ATT_MAX_GROUP, p.heads_per_kv_head - head_group * ATT_MAX_GROUP);
    const int head_dim = p.head_dim, kv_dim = p.n_kv_heads * head_dim;
    const int context_length = p.context_lengths[row];
    const int begin = partition * CUDA_ATTENTION_PARTITION;
    const int end = min(context_length, begin + CUDA_ATTENTION_PARTITION);
    if (begin >= end) { // nothing to attend to in this partition
        if (context_length == 0 && partition == 0 && p.n_partitions == 1)
            for (int i = threadIdx.x; i < n_group_heads * head_dim; i += ATT_THREADS)
                p.out[(size_t)row * p.query_stride + (size_t)first_head * head_dim + i] = 0.0f;
        return; // the whole block leaves: no __syncthreads skipped by some threads only
    }

    float* query = shared;                               // (n_group_heads, head_dim)
    float* warp_out = shared + n_group_heads * head_dim; // (N_WARPS, n_group_heads, head_dim)
    for (int i = threadIdx.x; i < n_group_heads * head_dim; i += ATT_THREADS)
        query[i] = p.query[(size_t)row * p.query_stride + (size_t)first_head * head_dim + i];
    __syncthreads();

    const int lanes = p.lanes_per_token, n_segments = ATT_THREADS / lanes;
    const int segment = threadIdx.x / lanes, lane = threadIdx.x % lanes;
    const int row_bytes = head_dim * ELEMENT_BYTES;
    const int32_t* table = p.block_tables + p.table_offsets[row];
    const float sqrt_head_dim = sqrtf((float)head_dim); // the CPU divides by sqrtf(head_dim); so do we

    float running_max[ATT_MAX_GROUP], running_sum[ATT_MAX_GROUP], acc[ATT_MAX_GROUP][ATT_MAX_ELEMENTS];
#pragma unroll
    for (int h = 0; h < ATT_MAX_GROUP; h++) {
        running_max[h] = -INFINITY;
        running_sum[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < ATT_MAX_ELEMENTS; e++)
            acc[h][e] = 0.0f;
    }

    // Every thread runs the same number of iterations (shuffles need the
    // whole warp); a segment past the end computes on zeros and keeps its state.
    for (int base = begin; base < end; base += n_segments) {
        const int position = base + segment;
        const bool valid = position < end;
        int64_t slot = 0;
        if (valid) slot = (int64_t)table[position / p.block_size] * p.block_size + position % p.block_size;
        const size_t row_offset = ((size_t)slot * (size_t)kv_dim + (size_t)kv_head * head_dim) * ELEMENT_BYTES;
        raw_vector<VB> key[MAX_VECTORS], value[MAX_VECTORS];
#pragma unroll
        for (int v = 0; v < MAX_VECTORS; v++) {
            const int byte = (v * lanes + lane) * VB;
            const bool loads = valid && v < p.vectors_per_lane && byte < row_bytes;
            key[v] = loads ? load_raw<VB>(p.keys + row_offset + byte) : raw_vector<VB>{};
            value[v] = loads ? load_raw<VB>(p.values + row_offset + byte) : raw_vector<VB>{};
        }
        float key_scale = 1.0f, value_scale = 1.0f;
        if (DTYPE == KV_I8 && valid) {
            key_scale = p.key_scales[(size_t)slot * p.n_kv_heads + kv_head];
            value_scale = p.value_scales[(size_t)slot * p.n_kv_heads + kv_head];
        }
#pragma unroll
        for (int h = 0; h < ATT_MAX_GROUP; h++) {
            if (h >= n_group_heads) break; // uniform over the block
            float dot = 0.0f;
#pragma unroll
            for (int v = 0; v < MAX_VECTORS; v++) {
                const int first = (v * lanes + lane) * PER_VECTOR; // zeros past the row: key[v] is 0 there
#pragma unroll
                for (int e = 0; e < PER_VECTOR; e++)
                    if (first + e < head_dim)
                        dot += query[h * head_dim + first + e] * kv_element<DTYPE>(key[v].words, e);
            }
            for (int offset = lanes >> 1; offset > 0; offset >>= 1)
                dot += __shfl_xor_sync(0xffffffffu, dot, offset);
            if (!valid) continue;
            float score = dot;
            if (DTYPE == KV_I8) score *= key_scale;
            score /= sqrt_head_dim;
            const float new_max = fmaxf(running_max[h], score);
            const float correction = expf(running_max[h] - new_max); // e^-inf = 0 on the first token
            const float weight = expf(score - new_max);
            running_sum[h] = running_sum[h] * correction + weight;
            running_max[h] = new_max;
            const float value_weight = DTYPE == KV_I8 ? weight * value_scale : weight;
#pragma unroll
            for (int v = 0; v < MAX_VECTORS; v++)
#pragma unroll
                for (int e = 0; e < PER_VECTOR; e++)
                    acc[h][v * PER_VECTOR + e] =
                        acc[h][v * PER_VECTOR + e] * correction + value_weight * kv_element<DTYPE>(value[v].words, e);
        }
    }

    // ---- merge: the segments of a warp by shuffles, then the warps ----
    // Lanes with the same index inside their segment hold the same
    // elements, so XOR offsets >= lanes combine segments element-wise.
    const int warp = threadIdx.x >> 5, lane_in_warp = threadIdx.x & 31;
#pragma unroll
    for (int h = 0; h < ATT_MAX_GROUP; h++) {
        if (h >= n_group_heads) break; // uniform over the block
        float merged_max = running_max[h];
        for (int offset = 16; offset >= lanes; offset >>= 1)
            merged_max = fmaxf(merged_max, __shfl_xor_sync(0xffffffffu, merged_max, offset));
        // A segment (or a whole warp) that saw no position has max -inf and weighs 0.
        const float rescale = running_max[h] == -INFINITY ? 0.0f : expf(running_max[h] - merged_max);
        float sum = running_sum[h] * rescale;
        for (int offset = 16; offset >= lanes; offset >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, offset);
#pragma unroll
        for (int v = 0; v < MAX_VECTORS; v++) {
            const int first = (v * lanes + lane) * PER_VECTOR;
#pragma unroll
            for (int e = 0; e < PER_VECTOR; e++) {
                float value = acc[h][v * PER_VECTOR + e] * rescale;
                for (int offset = 16; offset >= lanes; offset >>= 1)
                    value += __shfl_xor_sync(0xffffffffu, value, offset);
                if (lane_in_warp < lanes && first + e < head_dim)
                    warp_out[(warp * n_group_heads + h) * head_dim + first + e] = value;
            }
        }
        if (lane_in_warp == 0) {
            warp_max[warp][h] = merged_max;
            warp_sum[warp][h] = sum;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n_group_heads * head_dim; i += ATT_THREADS) {
        const int h = i / head_dim, d = i % head_dim;
        float block_max = -INFINITY;
        for (int w = 0; w < N_WARPS; w++)
            block_max = fmaxf(block_max, warp_max[w][h]); // finite: >= 1 position
        float sum = 0.0f, out = 0.0f;
        for (int w = 0; w < N_WARPS; w++) {
            const float rescale = warp_max[w][h] == -INFINITY ? 0.0f : expf(warp_max[w][h] - block_max);
            sum += warp_sum[w][h] * rescale;
            out += warp_out[(w * n_group_heads + h) * head_dim + d] * rescale;
        }
        const int head = first_head + h;
        if (p.n_partitions == 1) {
            p.out[(size_t)row * p.query_stride + (size_t)head * head_dim + d] = out / sum;
        } else {
            const size_t partial = ((size_t)row * p.n_heads + (size_t)head) * p.n_partitions + (size_t)partition;
            p.partial_out[partial * head_dim + d] = out;
            if (d == 0) {
                p.partial_max[partial] = block_max;
                p.partial_sum[partial] = sum;
            }
        }
    }
}

// Merges the partitions of one (row, head): M = max m_p, then
// out = sum_p acc_p e^(m_p - M) / sum_p l_p e^(m_p - M). grid (n_heads, n_rows).
__global__ void paged_attention_reduce_kernel(attention_params p) {
    const int head = blockIdx.x, row = blockIdx.y;
    const int context_length = p.context_lengths[row];
    const int n_used = (context_length + CUDA_ATTENTION_PARTITION - 1) / CUDA_ATTENTION_PARTITION;
    const size_t first = ((size_t)row * p.n_heads + (size_t)head) * p.n_partitions;
    float* out = p.out + (size_t)row * p.query_stride + (size_t)head * p.head_dim;
    float global_max = -INFINITY, sum = 0.0f;
    for (int q = 0; q < n_used; q++)
        global_max = fmaxf(global_max, p.partial_max[first + q]);
    for (int q = 0; q < n_used; q++)
        sum += p.partial_sum[first + q] * expf(p.partial_max[first + q] - global_max);
    for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
        float total = 0.0f;
        for (int q = 0; q < n_used; q++)
            total += p.partial_out[(first + q) * p.head_dim + d] * expf(p.partial_max[first + q] - global_max);
        out[d] = n_used > 0 ? total / sum : 0.0f;
    }
}

// The widest load (bytes) that divides a head's row, keeps at most
// ATT_MAX_ELEMENTS elements per load, and suits every base pointer's alignment.
static int attention_vector_bytes(const cuda_kv_layer* layer) {
    const int element_bytes = kv_dtype_bytes(layer->dtype), row_bytes = layer->head_dim * element_bytes;
    for (int bytes = 16; bytes >= 2; bytes /= 2) {
        if (bytes > ATT_MAX_ELEMENTS * element_bytes || bytes < element_bytes) continue;
        if (row_bytes % bytes != 0) continue;
        if ((uintptr_t)layer->keys % bytes != 0 || (uintptr_t)layer->values % bytes != 0) continue;
        return bytes;
    }
    return 0;
}

// Dynamic shared memory: the group's queries and each warp's merged
// outputs, (1 + 4 warps) x up to 8 heads x head_dim floats (<= 40 KiB).
static size_t attention_shared_bytes(const attention_params& p) {
    const int n_group_heads = p.heads_per_kv_head < ATT_MAX_GROUP ? p.heads_per_kv_head : ATT_MAX_GROUP;
    return (size_t)(1 + ATT_THREADS / 32) * (size_t)n_group_heads * (size_t)p.head_dim * sizeof(float);
}

// int8 rows are loaded at most 8 bytes at a time (8 elements per load).
template <int DTYPE>
static void launch_attention(int vector_bytes, dim3 grid, cudaStream_t stream, const attention_params& p) {
    const size_t shared = attention_shared_bytes(p);
    switch (vector_bytes) {
    case 16:
        if constexpr (DTYPE != KV_I8) paged_attention_kernel<DTYPE, 16><<<grid, ATT_THREADS, shared, stream>>>(p);
        break;
    case 8: paged_attention_kernel<DTYPE, 8><<<grid, ATT_THREADS, shared, stream>>>(p); break;
    case 4: paged_attention_kernel<DTYPE, 4><<<grid, ATT_THREADS, shared, stream>>>(p); break;
    default:
        if constexpr (DTYPE != KV_F32) paged_attention_kernel<DTYPE, 2><<<grid, ATT_THREADS, shared, stream>>>(p);
        break;
    }
}

extern "C" int cuda_paged_attention(cuda_context* context, float* device_out, const float* device_query,
                                    int query_stride, const cuda_kv_layer* layer, const int32_t* device_block_tables,
                                    const int32_t* device_table_offsets, const int32_t* device_context_lengths,
                                    int n_rows, int max_context_length, int n_heads,
                                    const int32_t* host_context_lengths, kernel_traffic* traffic, error_info* err) {
    const int head_dim = layer->head_dim, n_kv_heads = layer->n_kv_heads;
    if (n_rows <= 0) return 0;
    if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || head_dim <= 0 || head_dim % 2 != 0 ||
        head_dim > ATT_MAX_HEAD_DIM || layer->block_size <= 0 || max_context_length < 0 ||
        query_stride < n_heads * head_dim)
        return error_set(err,
                         "cuda_paged_attention: unsupported shape (%d heads, %d KV heads, head_dim %d (even, <= %d), "
                         "block size %d)",
                         n_heads, n_kv_heads, head_dim, ATT_MAX_HEAD_DIM, layer->block_size);
    const int vector_bytes = attention_vector_bytes(layer);
    if (vector_bytes == 0)
        return error_set(err, "cuda_paged_attention: KV pool pointers are not aligned to the element size");
    attention_params p = {};
    p.out = device_out;
    p.query = device_query;
    p.query_stride = query_stride;
    p.keys = (const uint8_t*)layer->keys;
    p.values = (const uint8_t*)layer->values;
    p.key_scales = layer->key_scales;
    p.value_scales = layer->value_scales;
    p.block_tables = device_block_tables;
    p.table_offsets = device_table_offsets;
    p.context_lengths = device_context_lengths;
    p.n_heads = n_heads;
    p.n_kv_heads = n_kv_heads;
    p.head_dim = head_dim;
    p.block_size = layer->block_size;
    p.heads_per_kv_head = n_heads / n_kv_heads;
    p.head_groups = (p.heads_per_kv_head + ATT_MAX_GROUP - 1) / ATT_MAX_GROUP;
    const int row_vectors = head_dim * kv_dtype_bytes(layer->dtype) / vector_bytes;
    int lanes = 1;
    while (lanes < row_vectors && lanes < 32)
        lanes *= 2;
    p.lanes_per_token = lanes;
    p.vectors_per_lane = (row_vectors + lanes - 1) / lanes; // <= ATT_MAX_ELEMENTS / elements per load (head_dim <= 256)
    p.n_partitions = max_context_length > CUDA_ATTENTION_PARTITION
                         ? (max_context_length + CUDA_ATTENTION_PARTITION - 1) / CUDA_ATTENTION_PARTITION
                         : 1;
    if (p.n_partitions > 1) {
        const size_t n_partials = (size_t)n_rows * (size_t)n_heads * (size_t)p.n_partitions;
        void* scratch = nullptr;
        if (cuda_scratch(context, SCRATCH_ATTENTION, n_partials * (2 + (size_t)head_dim) * sizeof(float), &scratch,
                         err))
            return -1;
        p.partial_max = (float*)scratch;
        p.partial_sum = p.partial_max + n_partials;
        p.partial_out = p.partial_sum + n_partials;
    }
    const dim3 grid((unsigned)(n_kv_heads * p.head_groups), (unsigned)n_rows, (unsigned)p.n_partitions);
    switch (layer->dtype) {
    case KV_F32: launch_attention<KV_F32>(vector_bytes, grid, context->stream, p); break;
    case KV_F16: launch_attention<KV_F16>(vector_bytes, grid, context->stream, p); break;
    default: launch_attention<KV_I8>(vector_bytes, grid, context->stream, p); break;
    }
    LAUNCH_CHECK("paged_attention_kernel", err);
    if (p.n_partitions > 1) {
        paged_attention_reduce_kernel<<<dim3((unsigned)n_heads, (unsigned)n_rows), 128, 0, context->stream>>>(p);
        LAUNCH_CHECK("paged_attention_reduce_kernel", err);
    }
    if (traffic && host_context_lengths) // attention_row's figures, per row
        for (int r = 0; r < n_rows; r++) {
            traffic->kv_bytes_read +=
                2ull * (uint64_t)host_context_lengths[r] * (uint64_t)kv_slot_bytes(layer->dtype, n_kv_heads, head_dim);
            traffic->attention_flops +=
                4ull * (uint64_t)n_heads * (uint64_t)host_context_lengths[r] * (uint64_t)head_dim;
            traffic->activation_bytes += 2ull * (uint64_t)n_heads * (uint64_t)head_dim * sizeof(float);
        }
    return 0;
}

// ---- KV write ------------------------------------------------------------------

// grid (n_rows, n_kv_heads, 2: key / value); one head's head_dim values per
// block, narrowed like kv_write_row: fp16 round to nearest even; int8 with
// scale = max|x| / 127 and code = round-half-even(x / scale) (0 when the
// head is all zero).
__global__ void kv_write_kernel(cuda_kv_layer layer, const float* keys, const float* values, int key_stride,
                                const int64_t* slots) {
    __shared__ float reduce[32];
    const int row = blockIdx.x, head = blockIdx.y, is_value = blockIdx.z;
    const int64_t slot = slots[row];
    if (slot < 0) return; // a padding row (the whole block leaves)
    const int head_dim = layer.head_dim, kv_dim = layer.n_kv_heads * head_dim;
    const float* source = (is_value ? values : keys) + (size_t)row * key_stride + (size_t)head * head_dim;
    const size_t first = (size_t)slot * kv_dim + (size_t)head * head_dim;
    void* destination = is_value ? layer.values : layer.keys;
    if (layer.dtype == KV_F32) {
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
            ((float*)destination)[first + i] = source[i];
    } else if (layer.dtype == KV_F16) {
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
            ((__half*)destination)[first + i] = __float2half_rn(source[i]);
    } else {
        float max_abs = 0.0f;
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
            max_abs = fmaxf(max_abs, fabsf(source[i]));
        max_abs = block_max(max_abs, reduce);
        const float scale = max_abs / 127.0f;
        if (threadIdx.x == 0)
            (is_value ? layer.value_scales : layer.key_scales)[(size_t)slot * layer.n_kv_heads + head] = scale;
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
            ((int8_t*)destination)[first + i] = scale > 0.0f ? (int8_t)__float2int_rn(source[i] / scale) : (int8_t)0;
    }
}

extern "C" int cuda_kv_write(cuda_context* context, const cuda_kv_layer* layer, const float* device_keys,
                             const float* device_values, int key_stride, const int64_t* device_slots, int n_rows,
                             kernel_traffic* traffic, error_info* err) {
    if (n_rows <= 0) return 0;
    const int kv_dim = layer->n_kv_heads * layer->head_dim;
    if (layer->n_kv_heads <= 0 || layer->head_dim <= 0 || key_stride < kv_dim)
        return error_set(err, "cuda_kv_write: bad shape (%d KV heads, head_dim %d, row stride %d)", layer->n_kv_heads,
                         layer->head_dim, key_stride);
    kv_write_kernel<<<dim3((unsigned)n_rows, (unsigned)layer->n_kv_heads, 2), 64, 0, context->stream>>>(
        *layer, device_keys, device_values, key_stride, device_slots);
    LAUNCH_CHECK("kv_write_kernel", err);
    if (traffic) { // kv_write_row's figures, per row
        traffic->kv_bytes_written +=
            2ull * (uint64_t)n_rows * (uint64_t)kv_slot_bytes(layer->dtype, layer->n_kv_heads, layer->head_dim);
        traffic->activation_bytes += 2ull * (uint64_t)n_rows * (uint64_t)kv_dim * sizeof(float);
    }
    return 0;
}
