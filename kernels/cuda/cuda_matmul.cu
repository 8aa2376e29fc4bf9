// cuda_matmul: out[r][o] = sum_i in[r][i] * W[o][i] on the GPU, for every
// weight format of kernels/cpu/matmul.h (the paths are listed in
// cuda_backend.h).
//
// Decode is memory-bound: a matvec streams every weight byte once and does
// 2 FLOPs per weight, so the kernel's job is to keep HBM busy. The matvec16
// kernel below reads each weight row in 16-byte pieces ("chunks": 32 INT4
// codes, 16 INT8 codes, 8 fp16 or 4 fp32 values), several chunks and rows
// per lane in flight at once, and dequantizes in registers. The activation
// rows sit in shared memory, read back as float4 at addresses XOR-swizzled
// so that the 8 lanes of a quarter warp hit 8 different bank groups.
#include <cfloat>
#include <cstring>

#include "kernels/cuda/cuda_common.cuh"

// W4A16 multiplies activations rounded to bf16, as the CPU does
// (fp32_round_to_bf16, kernels/cpu/fp16.h): nearest even, NaN made quiet,
// subnormals to a zero of their sign. The same bits as the CPU's, so that
// the GPU and CPU results differ only in the order of the sums.
__device__ __forceinline__ float round_to_bf16(float x) {
    const uint32_t bits = __float_as_uint(x);
    uint32_t rounded;
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0)
        rounded = bits | 0x00400000u;
    else if ((bits & 0x7f800000u) == 0)
        rounded = bits & 0x80000000u;
    else
        rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
    return __uint_as_float(rounded & 0xffff0000u);
}

// ---- the generic kernel: one element at a time, any format ----------------

// W[o][i] as fp32 (the CPU's int_row_to_f32 / weight_row_to_f32 values).
__device__ __forceinline__ float weight_element(const cuda_weights& w, int o, int i) {
    const size_t index = (size_t)o * (size_t)w.cols + (size_t)i;
    switch (w.dtype) {
    case WEIGHT_F32: return ((const float*)w.values)[index];
    case WEIGHT_F16: return half_bits_to_float(((const uint16_t*)w.values)[index]);
    case WEIGHT_Q8_0: return (float)((const int8_t*)w.values)[index] * w.scales[index / (size_t)w.group_size];
    default: break;
    }
    const size_t group = (size_t)o * (size_t)(w.cols / w.group_size) + (size_t)(i / w.group_size);
    int code, zero;
    if (w.dtype == WEIGHT_I4) {
        const uint8_t byte = ((const uint8_t*)w.values)[(size_t)o * (((size_t)w.cols + 1) / 2) + (size_t)(i >> 1)];
        code = i & 1 ? byte >> 4 : byte & 0x0f;
        zero = w.zero_points ? w.zero_points[group] : 8;
    } else if (w.zero_points) {
        code = ((const uint8_t*)w.values)[index];
        zero = w.zero_points[group];
    } else {
        code = ((const int8_t*)w.values)[index];
        zero = 0;
    }
    return half_bits_to_float(w.scales_f16[group]) * (float)(code - zero);
}

constexpr int GENERIC_BATCH = 8; // activation rows per pass
constexpr int GENERIC_THREADS = 256;

// One warp per output o; rows [0, n_rows) of this pass (n_rows <= 8).
// x: (n_rows, cols); out: (n_rows, w.rows).
__global__ void __launch_bounds__(GENERIC_THREADS)
    matvec_generic_kernel(float* out, const float* x, int n_rows, cuda_weights w) {
    const int o = (int)((blockIdx.x * (size_t)GENERIC_THREADS + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (o >= w.rows) return; // whole warps leave together: o is the same for all 32 lanes
    float acc[GENERIC_BATCH] = {};
    const bool bf16_activations = w.dtype == WEIGHT_I4;
    for (int i = lane; i < w.cols; i += 32) {
        const float weight = weight_element(w, o, i);
#pragma unroll
        for (int b = 0; b < GENERIC_BATCH; b++) {
            if (b >= n_rows) continue;
            const float xv = x[(size_t)b * (size_t)w.cols + (size_t)i];
            acc[b] += weight * (bf16_activations ? round_to_bf16(xv) : xv);
        }
    }
#pragma unroll
    for (int b = 0; b < GENERIC_BATCH; b++) {
        const float total = warp_sum(acc[b]);
        if (b < n_rows && lane == 0) out[(size_t)b * (size_t)w.rows + (size_t)o] = total;
    }
}

// Rows of W widened to fp16 (for cuBLAS after dequantizing INT8/INT4):
// out (w.rows, w.cols) halves.
__global__ void dequantize_to_f16_kernel(__half* out, cuda_weights w) {
    const int64_t count = (int64_t)w.rows * w.cols;
    for (int64_t index = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; index < count;
         index += (int64_t)gridDim.x * blockDim.x)
        out[index] = __float2half_rn(weight_element(w, (int)(index / w.cols), (int)(index % w.cols)));
}

// bf16_first: W4A16's activations, rounded to bf16 before fp16 (exact
// then, inside fp16's range).
__global__ void f32_to_f16_kernel(__half* out, const float* in, int64_t count, bool bf16_first) {
    for (int64_t index = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; index < count;
         index += (int64_t)gridDim.x * blockDim.x)
        out[index] = __float2half_rn(bf16_first ? round_to_bf16(in[index]) : in[index]);
}

// Embedding rows: out[r] = W[token_ids[r]] widened to fp32.
__global__ void embed_rows_kernel(float* out, const int32_t* token_ids, int n_rows, cuda_weights w) {
    const int row = blockIdx.x;
    if (row >= n_rows) return;
    const int token = token_ids[row];
    if (token < 0 || token >= w.rows) return; // the host checked the ids; never read outside W
    for (int i = threadIdx.x; i < w.cols; i += blockDim.x)
        out[(size_t)row * (size_t)w.cols + (size_t)i] = weight_element(w, token, i);
}

// ---- matvec16: 16-byte weight loads, dequantization in registers -----------

constexpr int MV_THREADS = 256;        // 8 warps
constexpr int MV_UNROLL = 2;           // chunks per lane per row loaded before any is used
constexpr int MV_X_TILE_FLOATS = 8192; // shared memory for activations: 32 KiB, split between the batch rows

template <int DTYPE> struct chunk_traits;
template <> struct chunk_traits<WEIGHT_F32> { static constexpr int columns = 4; };
template <> struct chunk_traits<WEIGHT_F16> { static constexpr int columns = 8; };
template <> struct chunk_traits<WEIGHT_I8> { static constexpr int columns = 16; };
template <> struct chunk_traits<WEIGHT_I4> { static constexpr int columns = 32; };

// Where float4 number f of a row's tile lives in shared memory: its low 3
// bits XOR the next 3 (a permutation inside each aligned run of 8). Lanes
// l = 0..7 of a quarter warp read float4 (chunk l) * k + j for a fixed j
// with k = columns / 4 = 8, 4, 2 or 1; the swizzle puts them in 8
// different 16-byte bank groups in all four cases (worked through for
// k = 8: low bits j ^ l; k = 4: (4(l&1) + j) ^ (l>>1); k = 2: (2(l&3) + j) ^ (l>>2);
// k = 1: l ^ const).
__device__ __forceinline__ int x_swizzle(int f) { return f ^ ((f >> 3) & 7); }

// The float exactly equal to the unsigned byte (or nibble) value v < 256,
// minus `bias`: 2^23 + v is an fp32 whose low mantissa bits are v, built by
// one byte permute; one subtraction removes 2^23 + bias, exactly.
// byte_index selects which byte of `word` holds v (0..3).
__device__ __forceinline__ float code_minus_bias(uint32_t word, int byte_index, float biased_zero) {
    const uint32_t bits = __byte_perm(word, 0x4B000000u, 0x7440u | (uint32_t)byte_index);
    return __uint_as_float(bits) - biased_zero;
}

// Columns 4k .. 4k+3 of a chunk as floats: the weights (float formats) or
// code - zero (integer formats; the group scale is applied per chunk).
template <int DTYPE>
__device__ __forceinline__ float4 decode_float4(const uint4& q, int k, float biased_zero, uint32_t sign_flip) {
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
    if constexpr (DTYPE == WEIGHT_F32) {
        return make_float4(__uint_as_float(q.x), __uint_as_float(q.y), __uint_as_float(q.z), __uint_as_float(q.w));
    } else if constexpr (DTYPE == WEIGHT_F16) { // words 2k, 2k+1: two halves each, low half first
        const float2 a = __half22float2(
            __halves2half2(__ushort_as_half((uint16_t)words[2 * k]), __ushort_as_half((uint16_t)(words[2 * k] >> 16))));
        const float2 b = __half22float2(__halves2half2(__ushort_as_half((uint16_t)words[2 * k + 1]),
                                                       __ushort_as_half((uint16_t)(words[2 * k + 1] >> 16))));
        return make_float4(a.x, a.y, b.x, b.y);
    } else if constexpr (DTYPE == WEIGHT_I8) {      // the 4 bytes of word k
        const uint32_t word = words[k] ^ sign_flip; // signed codes: byte + 128, removed by the bias
        return make_float4(code_minus_bias(word, 0, biased_zero), code_minus_bias(word, 1, biased_zero),
                           code_minus_bias(word, 2, biased_zero), code_minus_bias(word, 3, biased_zero));
    } else { // WEIGHT_I4: bytes 2k, 2k+1 (half of word k/2); byte j holds column 2j low, 2j + 1 high
        const uint32_t word = words[k >> 1] >> (16 * (k & 1));
        const uint32_t low = word & 0x0f0fu,
                       high = (word >> 4) & 0x0f0fu; // byte 0: columns 4k / 4k+1; byte 1: 4k+2 / 4k+3
        return make_float4(code_minus_bias(low, 0, biased_zero), code_minus_bias(high, 0, biased_zero),
                           code_minus_bias(low, 1, biased_zero), code_minus_bias(high, 1, biased_zero));
    }
}

// Output rows per warp: fewer for 8 activation rows, so that the
// accumulators (rows x batch) and the loaded chunks fit in 128 registers.
template <int BATCH> __host__ __device__ constexpr int matvec_rows_per_warp() { return BATCH >= 8 ? 2 : 4; }
template <int BATCH> __host__ __device__ constexpr int matvec_rows_per_block() {
    return (MV_THREADS / 32) * matvec_rows_per_warp<BATCH>();
}

// Block b computes outputs [b * R * 8, (b + 1) * R * 8) for `n_rows`
// (<= BATCH) activation rows, R = matvec_rows_per_warp. Each warp owns R
// consecutive outputs; lane l takes chunks l, l + 32, ... of each of its
// rows: MV_UNROLL x R independent 16-byte loads are issued before the
// first is used. Each float4 of x read from shared memory serves all R
// rows. The activations go through shared memory in column tiles of
// MV_X_TILE_FLOATS / BATCH floats per row.
// Requires (checked by the host): cols and group_size multiples of the
// chunk's columns, x and W 16-byte aligned.
template <int DTYPE, int BATCH>
__global__ void __launch_bounds__(MV_THREADS, 2) // <= 128 registers: two blocks (16 warps) per SM
    matvec16_kernel(float* out, const float* x, int n_rows, cuda_weights w) {
    __shared__ float4 x_tile[MV_X_TILE_FLOATS / 4]; // (BATCH, TILE_FLOAT4S) swizzled
    constexpr int COLUMNS = chunk_traits<DTYPE>::columns;
    constexpr int ROWS = matvec_rows_per_warp<BATCH>();
    constexpr int TILE_COLUMNS = MV_X_TILE_FLOATS / BATCH; // a multiple of 32 for BATCH <= 8
    constexpr int TILE_FLOAT4S = TILE_COLUMNS / 4;
    constexpr bool INTEGER = DTYPE == WEIGHT_I8 || DTYPE == WEIGHT_I4;
    const int cols = w.cols, d_out = w.rows;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int first_output = blockIdx.x * matvec_rows_per_block<BATCH>() + warp * ROWS;
    const size_t row_chunks = (size_t)(cols / COLUMNS); // 16-byte chunks per weight row
    const int n_groups = INTEGER ? cols / w.group_size : 1;
    const int chunks_per_group = INTEGER ? w.group_size / COLUMNS : 1;
    // Signed INT8 codes are read as byte ^ 0x80 = code + 128; symmetric INT4
    // nibbles are code + 8: the bias folds that back.
    const bool asymmetric = w.zero_points != nullptr;
    const uint32_t sign_flip = DTYPE == WEIGHT_I8 && !asymmetric ? 0x80808080u : 0u;
    const uint4* rows = (const uint4*)w.values;

    float acc[ROWS][BATCH] = {};
    for (int tile_begin = 0; tile_begin < cols; tile_begin += TILE_COLUMNS) {
        const int tile_columns = min(TILE_COLUMNS, cols - tile_begin); // a multiple of COLUMNS
        const int tile_float4s = tile_columns / 4;
        __syncthreads(); // every warp is done with the previous tile
        for (int index = threadIdx.x; index < BATCH * tile_float4s; index += MV_THREADS) {
            const int b = index / tile_float4s, f = index % tile_float4s;
            float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (b < n_rows) value = *(const float4*)(x + (size_t)b * (size_t)cols + (size_t)tile_begin + 4 * (size_t)f);
            if (DTYPE == WEIGHT_I4) // W4A16: bf16 activations, rounded once per tile of columns
                value = make_float4(round_to_bf16(value.x), round_to_bf16(value.y), round_to_bf16(value.z),
                                    round_to_bf16(value.w));
            x_tile[b * TILE_FLOAT4S + x_swizzle(f)] = value;
        }
        __syncthreads();
        const int tile_chunks = tile_columns / COLUMNS, first_chunk = tile_begin / COLUMNS;
        for (int c0 = lane; c0 < tile_chunks; c0 += 32 * MV_UNROLL) {
            uint4 q[MV_UNROLL][ROWS];
#pragma unroll
            for (int u = 0; u < MV_UNROLL; u++)
#pragma unroll
                for (int r = 0; r < ROWS; r++) {
                    const int c = c0 + 32 * u, o = first_output + r;
                    q[u][r] = c < tile_chunks && o < d_out
                                  ? __ldg(rows + (size_t)o * row_chunks + (size_t)(first_chunk + c))
                                  : make_uint4(0u, 0u, 0u, 0u);
                }
#pragma unroll
            for (int u = 0; u < MV_UNROLL; u++) {
                const int c = c0 + 32 * u;
                if (c >= tile_chunks) break;
                float scale[ROWS], biased_zero[ROWS];
#pragma unroll
                for (int r = 0; r < ROWS; r++) {
                    scale[r] = 1.0f, biased_zero[r] = 0.0f;
                    const int o = first_output + r;
                    if (INTEGER && o < d_out) {
                        const size_t group =
                            (size_t)o * (size_t)n_groups + (size_t)((first_chunk + c) / chunks_per_group);
                        scale[r] = half_bits_to_float(__ldg(w.scales_f16 + group));
                        const int zero = asymmetric ? (int)__ldg(w.zero_points + group) : DTYPE == WEIGHT_I4 ? 8 : 128;
                        biased_zero[r] = 8388608.0f + (float)zero; // 2^23 + zero, exact
                    }
                }
                float partial[ROWS][BATCH] = {};
#pragma unroll
                for (int k = 0; k < COLUMNS / 4; k++) {
                    float4 weights[ROWS];
#pragma unroll
                    for (int r = 0; r < ROWS; r++)
                        weights[r] = decode_float4<DTYPE>(q[u][r], k, biased_zero[r], sign_flip);
#pragma unroll
                    for (int b = 0; b < BATCH; b++) {
                        const float4 xv = x_tile[b * TILE_FLOAT4S + x_swizzle(c * (COLUMNS / 4) + k)];
#pragma unroll
                        for (int r = 0; r < ROWS; r++)
                            partial[r][b] +=
                                weights[r].x * xv.x + weights[r].y * xv.y + weights[r].z * xv.z + weights[r].w * xv.w;
                    }
                }
#pragma unroll
                for (int r = 0; r < ROWS; r++)
#pragma unroll
                    for (int b = 0; b < BATCH; b++)
                        acc[r][b] += INTEGER ? partial[r][b] * scale[r] : partial[r][b];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            const float total = warp_sum(acc[r][b]);
            const int o = first_output + r;
            if (lane == 0 && o < d_out && b < n_rows) out[(size_t)b * (size_t)d_out + (size_t)o] = total;
        }
}

// ---- W8A8: int8 activations, integer group sums, the CPU's float order -------

// Row r of x quantized exactly as matmul_quantize_row does it: a_scale =
// max|x| / 127 (NaN when the row holds a NaN or inf); codes = x / a_scale
// clamped to [-127, 127], rounded half to even; all 0 unless 0 < a_scale
// <= FLT_MAX. One block per row. codes: (n_rows, cols); scales: (n_rows).
__global__ void quantize_rows_kernel(int8_t* codes, float* scales, const float* x, int cols) {
    __shared__ float reduce[32];
    const float* row = x + (size_t)blockIdx.x * (size_t)cols;
    float max_abs = 0.0f, non_finite = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float a = fabsf(row[i]);
        if (!(a <= FLT_MAX))
            non_finite = 1.0f;
        else
            max_abs = fmaxf(max_abs, a);
    }
    max_abs = block_max(max_abs, reduce);
    non_finite = block_max(non_finite, reduce);
    const float scale = non_finite > 0.0f ? NAN : max_abs / 127.0f; // IEEE division, as on the CPU
    if (threadIdx.x == 0) scales[blockIdx.x] = scale;
    const bool quantizes = scale > 0.0f && scale <= FLT_MAX;
    int8_t* out = codes + (size_t)blockIdx.x * (size_t)cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = quantizes ? row[i] / scale : 0.0f;
        v = v > -127.0f ? v : -127.0f;
        v = v < 127.0f ? v : 127.0f;
        out[i] = (int8_t)__float2int_rn(v); // round half to even, as the CPU's 1.5 * 2^23 trick
    }
}

constexpr int W8A8_BATCH = 8;
constexpr int W8A8_THREADS = 256;

// One warp per output o, for up to 8 activation rows. Per group g in
// order: isum = sum of code * weight over the group (dp4a, exact in int32,
// wrapping like the CPU's uint32 sum), reduced over the warp, then
//   total = total + ((float)isum * s_g) * a_scale
// with each operation rounded on its own (__fmul_rn / __fadd_rn: no FMA
// contraction), the CPU's w8a8_term in the CPU's order: the same bits.
// vectorized: cols and group_size multiples of 4, so that 4-byte loads of
// weights and codes are aligned (dp4a); otherwise one code at a time.
__global__ void __launch_bounds__(W8A8_THREADS) w8a8_kernel(float* out, const int8_t* codes, const float* code_scales,
                                                            int n_rows, cuda_weights w, bool vectorized) {
    const int o = (int)((blockIdx.x * (size_t)W8A8_THREADS + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (o >= w.rows) return; // whole warps
    const int cols = w.cols, group_size = w.group_size, n_groups = cols / group_size;
    const int8_t* row = (const int8_t*)w.values + (size_t)o * (size_t)cols;
    float total[W8A8_BATCH] = {};
    for (int g = 0; g < n_groups; g++) {
        int isum[W8A8_BATCH] = {};
        const int end = (g + 1) * group_size;
        if (vectorized) {
#pragma unroll 4
            for (int i = g * group_size + 4 * lane; i < end; i += 128) {
                const int weights4 = __ldg((const int*)(row + i));
#pragma unroll
                for (int b = 0; b < W8A8_BATCH; b++)
                    if (b < n_rows)
                        isum[b] = __dp4a(weights4, *(const int*)(codes + (size_t)b * (size_t)cols + i), isum[b]);
            }
        } else {
            for (int i = g * group_size + lane; i < end; i += 32) {
                const int weight = row[i];
#pragma unroll
                for (int b = 0; b < W8A8_BATCH; b++)
                    if (b < n_rows)
                        isum[b] = (int)((unsigned)isum[b] + (unsigned)(weight * codes[(size_t)b * (size_t)cols + i]));
            }
        }
        const float scale = half_bits_to_float(__ldg(w.scales_f16 + (size_t)o * (size_t)n_groups + (size_t)g));
#pragma unroll
        for (int b = 0; b < W8A8_BATCH; b++) {
            const int group_sum = (int)__reduce_add_sync(0xffffffffu, (unsigned)isum[b]);
            if (b < n_rows)
                total[b] = __fadd_rn(total[b], __fmul_rn(__fmul_rn((float)group_sum, scale), code_scales[b]));
        }
    }
    if (lane == 0)
        for (int b = 0; b < n_rows && b < W8A8_BATCH; b++)
            out[(size_t)b * (size_t)w.rows + (size_t)o] = total[b];
}

// cuBLASLt's int32 result C (n_rows, d_out) to the CPU's one-group W8A8
// value: +0 + ((float)C * s_o) * a_scale.
__global__ void w8a8_per_channel_epilogue_kernel(float* out, const int32_t* sums, const uint16_t* scales_f16,
                                                 const float* code_scales, int n_rows, int d_out) {
    const int64_t count = (int64_t)n_rows * d_out;
    for (int64_t index = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; index < count;
         index += (int64_t)gridDim.x * blockDim.x) {
        const int o = (int)(index % d_out), r = (int)(index / d_out);
        out[index] = __fadd_rn(
            0.0f, __fmul_rn(__fmul_rn((float)sums[index], half_bits_to_float(scales_f16[o])), code_scales[r]));
    }
}

// ---- dispatch ---------------------------------------------------------------

static constexpr int MATVEC_MAX_ROWS = 32; // beyond this, a GEMM (weights read once instead of n_rows / 8 times)

static int chunk_columns(weight_dtype dtype) {
    switch (dtype) {
    case WEIGHT_F32: return 4;
    case WEIGHT_F16: return 8;
    case WEIGHT_I8: return 16;
    case WEIGHT_I4: return 32;
    default: return 0;
    }
}

static bool is_w8a8(const cuda_weights* w) {
    return w->dtype == WEIGHT_I8 && w->activation_bits == 8 && w->zero_points == nullptr;
}

static bool matvec16_fits(const cuda_weights* w, const float* device_in) {
    const int columns = chunk_columns(w->dtype);
    if (columns == 0 || w->cols % columns != 0) return false;
    if ((w->dtype == WEIGHT_I8 || w->dtype == WEIGHT_I4) && w->group_size % columns != 0) return false;
    return ((uintptr_t)device_in % 16 == 0 || device_in == nullptr) && (uintptr_t)w->values % 16 == 0;
}

static bool w8a8_vectorized(const cuda_weights* w) { return w->cols % 4 == 0 && w->group_size % 4 == 0; }

extern "C" const char* cuda_matmul_path(const cuda_weights* w, int n_rows) {
    if (is_w8a8(w)) {
        if (n_rows > MATVEC_MAX_ROWS && w->group_size == w->cols && w->cols % 4 == 0 && w->rows % 4 == 0)
            return "cublaslt-i8";
        return "w8a8";
    }
    if (n_rows <= MATVEC_MAX_ROWS || w->dtype == WEIGHT_Q8_0) return matvec16_fits(w, nullptr) ? "matvec16" : "matvec";
    if (w->dtype == WEIGHT_F32) return "cublas-f32";
    if (w->dtype == WEIGHT_F16) return "cublas-f16";
    return "dequant+cublas";
}

template <int DTYPE>
static void launch_matvec16(cudaStream_t stream, float* out, const float* in, int n_rows, const cuda_weights* w) {
    auto blocks = [w](int rows_per_block) { return (unsigned)((w->rows + rows_per_block - 1) / rows_per_block); };
    if (n_rows == 1)
        matvec16_kernel<DTYPE, 1><<<blocks(matvec_rows_per_block<1>()), MV_THREADS, 0, stream>>>(out, in, n_rows, *w);
    else if (n_rows == 2)
        matvec16_kernel<DTYPE, 2><<<blocks(matvec_rows_per_block<2>()), MV_THREADS, 0, stream>>>(out, in, n_rows, *w);
    else if (n_rows <= 4)
        matvec16_kernel<DTYPE, 4><<<blocks(matvec_rows_per_block<4>()), MV_THREADS, 0, stream>>>(out, in, n_rows, *w);
    else
        matvec16_kernel<DTYPE, 8><<<blocks(matvec_rows_per_block<8>()), MV_THREADS, 0, stream>>>(out, in, n_rows, *w);
}

// The small-batch kernels, in passes of at most 8 activation rows.
static int run_matvec(cuda_context* context, float* out, const float* in, int n_rows, const cuda_weights* w,
                      error_info* err) {
    const bool fast = matvec16_fits(w, in);
    for (int first = 0; first < n_rows; first += 8) {
        const int pass_rows = n_rows - first < 8 ? n_rows - first : 8;
        float* pass_out = out + (size_t)first * (size_t)w->rows;
        const float* pass_in = in + (size_t)first * (size_t)w->cols; // 16-byte aligned when in is and cols % 4 == 0
        if (fast) {
            switch (w->dtype) {
            case WEIGHT_F32: launch_matvec16<WEIGHT_F32>(context->stream, pass_out, pass_in, pass_rows, w); break;
            case WEIGHT_F16: launch_matvec16<WEIGHT_F16>(context->stream, pass_out, pass_in, pass_rows, w); break;
            case WEIGHT_I8: launch_matvec16<WEIGHT_I8>(context->stream, pass_out, pass_in, pass_rows, w); break;
            default: launch_matvec16<WEIGHT_I4>(context->stream, pass_out, pass_in, pass_rows, w); break;
            }
            LAUNCH_CHECK("matvec16_kernel", err);
        } else {
            const unsigned blocks = (unsigned)(((int64_t)w->rows * 32 + GENERIC_THREADS - 1) / GENERIC_THREADS);
            matvec_generic_kernel<<<blocks, GENERIC_THREADS, 0, context->stream>>>(pass_out, pass_in, pass_rows, *w);
            LAUNCH_CHECK("matvec_generic_kernel", err);
        }
    }
    return 0;
}

// out (n_rows, d_out) = in (n_rows, d_in) x W^T with W (d_out, d_in)
// row-major: in cuBLAS's column-major terms C (d_out x n_rows) = A^T B with
// A = W seen as (d_in x d_out), B = in seen as (d_in x n_rows).
static int run_cublas(cuda_context* context, float* out, const void* weights, cudaDataType weight_type, const void* in,
                      cudaDataType in_type, int n_rows, int d_out, int d_in, error_info* err) {
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasGemmEx(context->cublas, CUBLAS_OP_T, CUBLAS_OP_N, d_out, n_rows, d_in, &alpha, weights,
                              weight_type, d_in, in, in_type, d_in, &beta, out, CUDA_R_32F, d_out, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 err);
    return 0;
}

static int to_f16(cuda_context* context, __half** out, const float* in, int64_t count, bool bf16_first,
                  error_info* err) {
    void* scratch = nullptr;
    if (cuda_scratch(context, SCRATCH_ACTIVATIONS, (size_t)count * sizeof(__half), &scratch, err)) return -1;
    *out = (__half*)scratch;
    f32_to_f16_kernel<<<cuda_blocks_for(count, 256), 256, 0, context->stream>>>(*out, in, count, bf16_first);
    LAUNCH_CHECK("f32_to_f16_kernel", err);
    return 0;
}

// Per-channel W8A8 on tensor cores: C (int32) = W (int8) x codes^T through
// cuBLASLt. Returns 1 (nothing done) when cuBLASLt has no algorithm for
// the shape, so the caller falls back to the dp4a kernel.
static int run_cublaslt_i8(cuda_context* context, int32_t* sums, const int8_t* codes, int n_rows, const cuda_weights* w,
                           error_info* err) {
    cublasLtMatmulDesc_t operation = nullptr;
    cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, c_layout = nullptr;
    cublasLtMatmulPreference_t preference = nullptr;
    int result = 1;
    const cublasOperation_t transpose = CUBLAS_OP_T;
    const size_t workspace = CUBLASLT_WORKSPACE_BYTES;
    cublasLtMatmulHeuristicResult_t heuristic = {};
    int n_found = 0;
    const int32_t alpha = 1, beta = 0;
    cublasStatus_t status = cublasLtMatmulDescCreate(&operation, CUBLAS_COMPUTE_32I, CUDA_R_32I);
    if (status == CUBLAS_STATUS_SUCCESS)
        status = cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose);
    if (status == CUBLAS_STATUS_SUCCESS)
        status = cublasLtMatrixLayoutCreate(&a_layout, CUDA_R_8I, (uint64_t)w->cols, (uint64_t)w->rows, w->cols);
    if (status == CUBLAS_STATUS_SUCCESS)
        status = cublasLtMatrixLayoutCreate(&b_layout, CUDA_R_8I, (uint64_t)w->cols, (uint64_t)n_rows, w->cols);
    if (status == CUBLAS_STATUS_SUCCESS)
        status = cublasLtMatrixLayoutCreate(&c_layout, CUDA_R_32I, (uint64_t)w->rows, (uint64_t)n_rows, w->rows);
    if (status == CUBLAS_STATUS_SUCCESS) status = cublasLtMatmulPreferenceCreate(&preference);
    if (status == CUBLAS_STATUS_SUCCESS)
        status = cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                      sizeof workspace);
    if (status == CUBLAS_STATUS_SUCCESS)
        status = cublasLtMatmulAlgoGetHeuristic(context->cublas_lt, operation, a_layout, b_layout, c_layout, c_layout,
                                                preference, 1, &heuristic, &n_found);
    if (status == CUBLAS_STATUS_SUCCESS && n_found > 0) {
        status = cublasLtMatmul(context->cublas_lt, operation, &alpha, w->values, a_layout, codes, b_layout, &beta,
                                sums, c_layout, sums, c_layout, &heuristic.algo, context->cublas_lt_workspace,
                                workspace, context->stream);
        if (status == CUBLAS_STATUS_SUCCESS)
            result = 0;
        else if (status == CUBLAS_STATUS_NOT_SUPPORTED)
            result = 1; // the dp4a kernel takes over
        else
            result = error_set(err, "cublasLtMatmul (int8, %d x %d x %d) failed at %s:%d: %s", w->rows, n_rows, w->cols,
                               __FILE__, __LINE__, cublasGetStatusString(status));
    }
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (c_layout) cublasLtMatrixLayoutDestroy(c_layout);
    if (b_layout) cublasLtMatrixLayoutDestroy(b_layout);
    if (a_layout) cublasLtMatrixLayoutDestroy(a_layout);
    if (operation) cublasLtMatmulDescDestroy(operation);
    return result;
}

static int run_w8a8(cuda_context* context, float* out, const float* in, int n_rows, const cuda_weights* w,
                    error_info* err) {
    // Scratch: codes (n_rows, cols) int8, padded to 16 bytes, then scales (n_rows) floats.
    const size_t codes_bytes = ((size_t)n_rows * (size_t)w->cols + 15) / 16 * 16;
    void* scratch = nullptr;
    if (cuda_scratch(context, SCRATCH_ACTIVATIONS, codes_bytes + (size_t)n_rows * sizeof(float), &scratch, err))
        return -1;
    int8_t* codes = (int8_t*)scratch;
    float* code_scales = (float*)((char*)scratch + codes_bytes);
    quantize_rows_kernel<<<(unsigned)n_rows, 256, 0, context->stream>>>(codes, code_scales, in, w->cols);
    LAUNCH_CHECK("quantize_rows_kernel", err);
    if (strcmp(cuda_matmul_path(w, n_rows), "cublaslt-i8") == 0) {
        void* sums = nullptr;
        if (cuda_scratch(context, SCRATCH_WEIGHTS, (size_t)n_rows * (size_t)w->rows * sizeof(int32_t), &sums, err))
            return -1;
        const int status = run_cublaslt_i8(context, (int32_t*)sums, codes, n_rows, w, err);
        if (status < 0) return -1;
        if (status == 0) {
            const int64_t count = (int64_t)n_rows * w->rows;
            w8a8_per_channel_epilogue_kernel<<<cuda_blocks_for(count, 256), 256, 0, context->stream>>>(
                out, (const int32_t*)sums, w->scales_f16, code_scales, n_rows, w->rows);
            LAUNCH_CHECK("w8a8_per_channel_epilogue_kernel", err);
            return 0;
        }
    }
    for (int first = 0; first < n_rows; first += W8A8_BATCH) {
        const int pass_rows = n_rows - first < W8A8_BATCH ? n_rows - first : W8A8_BATCH;
        const unsigned blocks = (unsigned)(((int64_t)w->rows * 32 + W8A8_THREADS - 1) / W8A8_THREADS);
        w8a8_kernel<<<blocks, W8A8_THREADS, 0, context->stream>>>(
            out + (size_t)first * (size_t)w->rows, codes + (size_t)first * (size_t)w->cols, code_scales + first,
            pass_rows, *w, w8a8_vectorized(w));
        LAUNCH_CHECK("w8a8_kernel", err);
    }
    return 0;
}

extern "C" int cuda_matmul(cuda_context* context, float* device_out, const float* device_in, int n_rows,
                           const cuda_weights* w, kernel_traffic* traffic, error_info* err) {
    if (n_rows < 0 || w->rows <= 0 || w->cols <= 0)
        return error_set(err, "cuda_matmul: bad shape (%d rows of a %dx%d matrix)", n_rows, w->rows, w->cols);
    if (n_rows > 0) {
        const char* path = cuda_matmul_path(w, n_rows);
        int failed = 0;
        if (is_w8a8(w))
            failed = run_w8a8(context, device_out, device_in, n_rows, w, err);
        else if (strncmp(path, "matvec", 6) == 0)
            failed = run_matvec(context, device_out, device_in, n_rows, w, err);
        else if (w->dtype == WEIGHT_F32)
            failed = run_cublas(context, device_out, w->values, CUDA_R_32F, device_in, CUDA_R_32F, n_rows, w->rows,
                                w->cols, err);
        else {
            __half* in16 = nullptr;
            const void* weights16 = w->values;
            failed = to_f16(context, &in16, device_in, (int64_t)n_rows * w->cols, w->dtype == WEIGHT_I4, err);
            if (!failed && w->dtype != WEIGHT_F16) { // W8A16 / W4A16: widen the matrix to fp16 first
                void* scratch = nullptr;
                failed = cuda_scratch(context, SCRATCH_WEIGHTS, (size_t)w->rows * (size_t)w->cols * sizeof(__half),
                                      &scratch, err);
                if (!failed) {
                    dequantize_to_f16_kernel<<<cuda_blocks_for((int64_t)w->rows * w->cols, 256), 256, 0,
                                               context->stream>>>((__half*)scratch, *w);
                    LAUNCH_CHECK("dequantize_to_f16_kernel", err);
                    weights16 = scratch;
                }
            }
            if (!failed)
                failed = run_cublas(context, device_out, weights16, CUDA_R_16F, in16, CUDA_R_16F, n_rows, w->rows,
                                    w->cols, err);
        }
        if (failed) return -1;
    }
    if (traffic) { // the CPU's accounting (kernels/cpu/matmul.c)
        traffic->weight_bytes_read += w->bytes;
        traffic->activation_bytes += (uint64_t)n_rows * (uint64_t)(w->cols + w->rows) * sizeof(float);
        traffic->matmul_flops += 2ull * (uint64_t)n_rows * (uint64_t)w->cols * (uint64_t)w->rows;
    }
    return 0;
}

extern "C" int cuda_embed_rows(cuda_context* context, float* device_out, const int32_t* device_token_ids, int n_rows,
                               const cuda_weights* w, kernel_traffic* traffic, error_info* err) {
    if (n_rows <= 0) return 0;
    embed_rows_kernel<<<(unsigned)n_rows, 128, 0, context->stream>>>(device_out, device_token_ids, n_rows, *w);
    LAUNCH_CHECK("embed_rows_kernel", err);
    if (traffic) { // weight_row_to_f32's figures, once per row
        const uint64_t row_bytes = w->bytes / (uint64_t)w->rows;
        traffic->weight_bytes_read += (uint64_t)n_rows * row_bytes;
        traffic->activation_bytes += (uint64_t)n_rows * (uint64_t)w->cols * sizeof(float);
    }
    return 0;
}
