/* Batch-1 decode kernels for the runtime on CPU (gpu_runtime/model/cpu_kernels.py builds and loads this file).

A batch-1 decode step is ~120 matrix-vector products plus ~25 small vector ops per layer. In eager PyTorch each
small op costs ~10 us of dispatch, more than the arithmetic, and the int8 kernels torch ships for CPU read int8 no
faster than fp32 on AVX2-only cores. Here one call runs a whole decoder layer for one token, so the step is the
weight stream plus a few microseconds per layer.

Weights: fp32 projections are read in the [in, out] storage the model keeps them in (gpu_runtime.model.cpu_layout),
int8 projections in their [out, in] storage with one fp32 scale per output row (gpu_runtime.quant.int8), an int8
output head with one scale per block of inputs (gpu_runtime.quant.int8_blocks). Every sum is fp32; only the order of
the additions differs from torch's kernels.
*/
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Output columns summed per pass of the [in, out] GEMV. A row of a decoder layer's projection (at most a few thousand
   columns) is one pass, and its input rows lie side by side: the weights are one sequential stream the hardware
   prefetcher follows. A longer row (an output head, 49152 columns on SmolLM2) is cut into passes whose partial y
   (128 KiB) stays in L2; a pass then reads four-row segments a whole row apart, a fresh stream every few pages that
   the prefetcher picks up late, so the segments PREFETCH_QUADS input quads ahead are prefetched. SmolLM2's fp32 head
   with the weights cold, on huge pages: 3.9 -> 3.2 ms (OpenBLAS's sgemv 4.0, a read-only sum 3.0); on the layers'
   rows the same prefetch was 10-15% slower, so they run without it. */
#define OUT_CHUNK 32768
#define LONG_ROW 8192
#define PREFETCH_QUADS 2

/* y[out] = x[in] @ wt[in, out] (wt row-major): four input rows at a time stream four weight rows sequentially. */
void gemv_f32(const float *restrict x, const float *restrict wt, int n_in, int n_out, float *restrict y) {
    int ahead = n_out >= LONG_ROW ? 4 * PREFETCH_QUADS : 0; /* input rows ahead to prefetch; 0: none */
    for (int o0 = 0; o0 < n_out; o0 += OUT_CHUNK) {
        int n = n_out - o0 < OUT_CHUNK ? n_out - o0 : OUT_CHUNK;
        float *restrict yc = y + o0;
        memset(yc, 0, sizeof(float) * (size_t)n);
        int i = 0;
        for (; i + 4 <= n_in; i += 4) {
            const float *w0 = wt + (size_t)i * n_out + o0, *w1 = w0 + n_out, *w2 = w1 + n_out, *w3 = w2 + n_out;
            if (ahead && i + ahead + 4 <= n_in) {
                const float *p = w0 + (size_t)ahead * n_out;
                for (int j = 0; j < n; j += 16) { /* a cache line of each of the four rows */
                    __builtin_prefetch(p + j);
                    __builtin_prefetch(p + n_out + j);
                    __builtin_prefetch(p + 2 * (size_t)n_out + j);
                    __builtin_prefetch(p + 3 * (size_t)n_out + j);
                }
            }
            float x0 = x[i], x1 = x[i + 1], x2 = x[i + 2], x3 = x[i + 3];
            for (int j = 0; j < n; j++) yc[j] += x0 * w0[j] + x1 * w1[j] + x2 * w2[j] + x3 * w3[j];
        }
        for (; i < n_in; i++) {
            const float *w0 = wt + (size_t)i * n_out + o0;
            float x0 = x[i];
            for (int j = 0; j < n; j++) yc[j] += x0 * w0[j];
        }
    }
}

#ifdef __AVX2__
#include <immintrin.h>

/* 8 int8 weights as fp32: the 8-byte load folds into the sign extension (one instruction, no shuffles). */
static inline __m256 widen(const int8_t *q) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q))); }

#ifdef __AVX512F__
/* 16 int8 weights as fp32. Widening and converting cost two instructions per vector of weights: with 256-bit vectors
   that, not memory, bounded the int8 GEMV (SmolLM2's int8 step ran at ~21 GB/s of weights); 512-bit halves them. */
static inline __m512 widen16(const int8_t *q) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
}

/* Four independent accumulators: one would wait on each FMA's latency and run at a quarter of the load rate. */
static float dot_i8(const float *restrict x, const int8_t *restrict q, int n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), widen16(q + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), widen16(q + i + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), widen16(q + i + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), widen16(q + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), widen16(q + i), a0);
    float acc = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    for (; i < n; i++) acc += x[i] * (float)q[i];
    return acc;
}

/* sum over blocks g of (x[g] . q[g]) * scale[g], 32-element blocks: each block's two products go into one vector
   that is scaled into two alternating accumulators (one would wait on the previous block's FMA), summed once. */
static float dot_i8_blocks32(const float *restrict x, const int8_t *restrict q, const float *restrict scale,
                             int groups) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    int g = 0;
    for (; g + 2 <= groups; g += 2) {
        const float *xg = x + g * 32;
        const int8_t *qg = q + g * 32;
        __m512 p0 = _mm512_mul_ps(_mm512_loadu_ps(xg), widen16(qg));
        __m512 p1 = _mm512_mul_ps(_mm512_loadu_ps(xg + 32), widen16(qg + 32));
        p0 = _mm512_fmadd_ps(_mm512_loadu_ps(xg + 16), widen16(qg + 16), p0);
        p1 = _mm512_fmadd_ps(_mm512_loadu_ps(xg + 48), widen16(qg + 48), p1);
        a0 = _mm512_fmadd_ps(p0, _mm512_set1_ps(scale[g]), a0);
        a1 = _mm512_fmadd_ps(p1, _mm512_set1_ps(scale[g + 1]), a1);
    }
    float acc = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    for (; g < groups; g++) acc += dot_i8(x + g * 32, q + g * 32, 32) * scale[g];
    return acc;
}

#else
/* Four independent accumulators: one would wait on each FMA's latency and run at a quarter of the load rate. */
static float dot_i8(const float *restrict x, const int8_t *restrict q, int n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), widen(q + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), widen(q + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), widen(q + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), widen(q + i + 24), a3);
    }
    __m256 sum = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 half = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    half = _mm_add_ps(half, _mm_movehl_ps(half, half));
    float acc = _mm_cvtss_f32(_mm_add_ss(half, _mm_movehdup_ps(half)));
    for (; i < n; i++) acc += x[i] * (float)q[i];
    return acc;
}

/* sum over blocks g of (x[g] . q[g]) * scale[g], 32-element blocks: each block's four products go into one vector
   that is scaled into two alternating accumulators (one would wait on the previous block's FMA), summed once. */
static float dot_i8_blocks32(const float *restrict x, const int8_t *restrict q, const float *restrict scale,
                             int groups) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int g = 0;
    for (; g + 2 <= groups; g += 2) {
        const float *xg = x + g * 32;
        const int8_t *qg = q + g * 32;
        __m256 p0 = _mm256_mul_ps(_mm256_loadu_ps(xg), widen(qg));
        __m256 p1 = _mm256_mul_ps(_mm256_loadu_ps(xg + 32), widen(qg + 32));
        p0 = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 8), widen(qg + 8), p0);
        p1 = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 40), widen(qg + 40), p1);
        p0 = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 16), widen(qg + 16), p0);
        p1 = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 48), widen(qg + 48), p1);
        p0 = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 24), widen(qg + 24), p0);
        p1 = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 56), widen(qg + 56), p1);
        a0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(scale[g]), a0);
        a1 = _mm256_fmadd_ps(p1, _mm256_set1_ps(scale[g + 1]), a1);
    }
    __m256 sum = _mm256_add_ps(a0, a1);
    __m128 half = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    half = _mm_add_ps(half, _mm_movehl_ps(half, half));
    float acc = _mm_cvtss_f32(_mm_add_ss(half, _mm_movehdup_ps(half)));
    for (; g < groups; g++) acc += dot_i8(x + g * 32, q + g * 32, 32) * scale[g];
    return acc;
}

#endif

#else
static float dot_i8(const float *restrict x, const int8_t *restrict q, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += x[i] * (float)q[i];
    return acc;
}

static float dot_i8_blocks32(const float *restrict x, const int8_t *restrict q, const float *restrict scale,
                             int groups) {
    float acc = 0.0f;
    for (int g = 0; g < groups; g++) acc += dot_i8(x + g * 32, q + g * 32, 32) * scale[g];
    return acc;
}
#endif

/* y[out] = (x[in] @ q[out, in]^T) * scale[out]: each output is a dot product over one contiguous int8 row. */
/* Every cache line of an int8 weight row I8_AHEAD bytes ahead of it is prefetched: the rows are one sequential stream,
   but the hardware prefetcher alone left SmolLM2's int8 GEMVs at ~24 GB/s (cold, huge pages); 4-8 KB ahead took
   them 4.35 -> 3.7-3.8 ms a step, 2 KB and 16 KB less. */
#define I8_AHEAD 8192

static inline void prefetch_row_ahead(const int8_t *row, int n, const int8_t *end) {
    for (int b = 0; b < n; b += 64)
        if (row + I8_AHEAD + b < end) __builtin_prefetch(row + I8_AHEAD + b);
}

void gemv_i8(const float *restrict x, const int8_t *restrict q, const float *restrict scale, int n_in, int n_out,
             float *restrict y) {
    const int8_t *end = q + (size_t)n_out * n_in;
    for (int o = 0; o < n_out; o++) {
        prefetch_row_ahead(q + (size_t)o * n_in, n_in, end);
        y[o] = dot_i8(x, q + (size_t)o * n_in, n_in) * scale[o];
    }
}

/* y[rows, out] = x[rows, in] @ dequantized q[out, in]^T, q with one scale per `block` inputs (scale[out, in / block];
   block divides in). The output loop is outside the rows loop: each weight row is read from memory once for all
   rows of x (a batched step's head), and the batch-1 case is a GEMV. */
void gemm_i8_blocks(const float *restrict x, const int8_t *restrict q, const float *restrict scale, int rows,
                    int n_in, int n_out, int block, float *restrict y) {
    int groups = n_in / block;
    const int8_t *end = q + (size_t)n_out * n_in;
    for (int o = 0; o < n_out; o++) {
        const int8_t *qo = q + (size_t)o * n_in;
        const float *so = scale + (size_t)o * groups;
        prefetch_row_ahead(qo, n_in, end);
        for (int t = 0; t < rows; t++) {
            const float *xt = x + (size_t)t * n_in;
            float acc = 0.0f;
            if (block == 32) acc = dot_i8_blocks32(xt, qo, so, groups);
            else
                for (int g = 0; g < groups; g++) acc += dot_i8(xt + g * block, qo + g * block, block) * so[g];
            y[(size_t)t * n_out + o] = acc;
        }
    }
}

/* y[rows, out] = x[rows, in] @ wt[in, out] for two rows or more (a batched decode step, a prefill chunk), where
   OpenBLAS's sgemm packs its panels for every call and runs at ~90 GFLOP/s on one core. Columns of y go in chunks
   of GEMM_NC that stay in L2 over all of `in`; `in` in blocks of GEMM_KB rows of wt; each 8-row x 32-column tile of
   y is loaded, updated over the block's rows from registers (16 accumulators, two weight vectors and a broadcast
   per input), and stored; rows past the last whole tile go through a tile of that many rows (1..7), in registers
   too. AVX-512 only: gemm_f32_rows_fast() says whether this build has it (else the caller keeps OpenBLAS, measured
   faster than this loop order without the 512-bit registers).
   A decode step's weights come from memory, never from cache, and a strip of wt is GEMM_KB rows of 128 bytes a
   whole row of wt apart: the hardware prefetcher does not follow that, and each row's miss stalled the tile. So the
   first tile of a strip prefetches the strip GEMM_AHEAD strips on (or the first of the next block): measured on
   SmolLM2's shapes with cold weights, 1.6x the GEMMs of a 16-row step and 1.5x those of a 32-row step. */
#define GEMM_KB 128
#define GEMM_NC 1024
#define GEMM_MR 8
#define GEMM_NR 32
#define GEMM_AHEAD 2

/* The edges (rows below a whole tile, columns below a whole tile), and any tile without AVX-512. */
static void gemm_edge(const float *restrict x, int ldx, const float *restrict w, int ldw, float *restrict y, int ldy,
                      int kb, int m, int n) {
    for (int r = 0; r < m; r++)
        for (int k = 0; k < kb; k++) {
            float a = x[(size_t)r * ldx + k];
            for (int j = 0; j < n; j++) y[(size_t)r * ldy + j] += a * w[(size_t)k * ldw + j];
        }
}

#ifdef __AVX512F__
/* `m` rows (1..GEMM_MR) of a tile; `ahead`: a strip (`ahead_rows` rows of GEMM_NR floats, `ldw` apart) to prefetch
   while it runs, NULL: none. Always inlined with a constant `m` (gemm_rows_tile), so the accumulators stay in
   registers at every row count. */
static inline __attribute__((always_inline)) void gemm_tile(const float *restrict x, int ldx, const float *restrict w,
                                                             int ldw, float *restrict y, int ldy, int kb, int m,
                                                             const float *ahead, int ahead_rows) {
    __m512 c[GEMM_MR][2];
    for (int r = 0; r < m; r++) {
        c[r][0] = _mm512_loadu_ps(y + (size_t)r * ldy);
        c[r][1] = _mm512_loadu_ps(y + (size_t)r * ldy + 16);
    }
    for (int k = 0; k < kb; k++) {
        if (k < ahead_rows) {
            _mm_prefetch((const char *)(ahead + (size_t)k * ldw), _MM_HINT_T0);
            _mm_prefetch((const char *)(ahead + (size_t)k * ldw + 16), _MM_HINT_T0);
        }
        __m512 b0 = _mm512_loadu_ps(w + (size_t)k * ldw), b1 = _mm512_loadu_ps(w + (size_t)k * ldw + 16);
        for (int r = 0; r < m; r++) {
            __m512 a = _mm512_set1_ps(x[(size_t)r * ldx + k]);
            c[r][0] = _mm512_fmadd_ps(a, b0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(a, b1, c[r][1]);
        }
    }
    for (int r = 0; r < m; r++) {
        _mm512_storeu_ps(y + (size_t)r * ldy, c[r][0]);
        _mm512_storeu_ps(y + (size_t)r * ldy + 16, c[r][1]);
    }
}

#define GEMM_TILE_CASE(M) case M: gemm_tile(x, ldx, w, ldw, y, ldy, kb, M, ahead, ahead_rows); break;
static void gemm_rows_tile(const float *restrict x, int ldx, const float *restrict w, int ldw, float *restrict y,
                           int ldy, int kb, int m, const float *ahead, int ahead_rows) {
    switch (m) {
        GEMM_TILE_CASE(1) GEMM_TILE_CASE(2) GEMM_TILE_CASE(3) GEMM_TILE_CASE(4)
        GEMM_TILE_CASE(5) GEMM_TILE_CASE(6) GEMM_TILE_CASE(7) GEMM_TILE_CASE(8)
        default: break;
    }
}
int gemm_f32_rows_fast(void) { return 1; }
#else
static void gemm_rows_tile(const float *restrict x, int ldx, const float *restrict w, int ldw, float *restrict y,
                           int ldy, int kb, int m, const float *ahead, int ahead_rows) {
    (void)ahead;
    (void)ahead_rows;
    gemm_edge(x, ldx, w, ldw, y, ldy, kb, m, GEMM_NR);
}
int gemm_f32_rows_fast(void) { return 0; }
#endif

/* The strip of wt GEMM_AHEAD strips after the one at (k0, o0) in the order gemm_f32_rows visits them: later in the
   same block of rows, else at the start of the next block of rows, else of the next chunk of columns; its row count
   in *rows (0: none, the product ends first). Only ever an address inside wt. */
static const float *strip_ahead(const float *wt, int n_in, int n_out, int c0, int c1, int k0, int kb, int o0,
                                int *rows) {
    int o = o0 + GEMM_AHEAD * GEMM_NR;
    *rows = kb;
    if (o + GEMM_NR <= c1) return wt + (size_t)k0 * n_out + o;
    o = c0 + (o - c1 < c1 - c0 - GEMM_NR ? o - c1 : 0);
    if (k0 + kb < n_in) {
        *rows = n_in - (k0 + kb) < GEMM_KB ? n_in - (k0 + kb) : GEMM_KB;
        return o + GEMM_NR <= c1 ? wt + (size_t)(k0 + kb) * n_out + o : NULL;
    }
    *rows = n_in < GEMM_KB ? n_in : GEMM_KB;
    return c1 + GEMM_NR <= n_out ? wt + c1 : NULL;
}

void gemm_f32_rows(const float *restrict x, const float *restrict wt, int rows, int n_in, int n_out,
                   float *restrict y) {
    memset(y, 0, sizeof(float) * (size_t)rows * n_out);
    for (int c0 = 0; c0 < n_out; c0 += GEMM_NC) {
        int c1 = n_out - c0 < GEMM_NC ? n_out : c0 + GEMM_NC;
        for (int k0 = 0; k0 < n_in; k0 += GEMM_KB) {
            int kb = n_in - k0 < GEMM_KB ? n_in - k0 : GEMM_KB;
            for (int o0 = c0; o0 < c1; o0 += GEMM_NR) {
                int n = c1 - o0 < GEMM_NR ? c1 - o0 : GEMM_NR;
                const float *xk = x + k0, *wk = wt + (size_t)k0 * n_out + o0;
                int ahead_rows = 0;
                const float *ahead = strip_ahead(wt, n_in, n_out, c0, c1, k0, kb, o0, &ahead_rows);
                if (ahead == NULL) ahead_rows = 0;
                if (n < GEMM_NR) {  /* the last columns, below a whole strip */
                    gemm_edge(xk, n_in, wk, n_out, y + o0, n_out, kb, rows, n);
                    continue;
                }
                for (int r0 = 0; r0 < rows; r0 += GEMM_MR)  /* the first tile fetches ahead; the others hit cache */
                    gemm_rows_tile(xk + (size_t)r0 * n_in, n_in, wk, n_out, y + (size_t)r0 * n_out + o0, n_out, kb,
                                   rows - r0 < GEMM_MR ? rows - r0 : GEMM_MR, ahead, r0 == 0 ? ahead_rows : 0);
            }
        }
    }
}

/* One projection: int8 when scale is given, else fp32 in [in, out] storage; bias may be NULL. */
static void project(const float *x, const void *w, const float *scale, const float *bias, int n_in, int n_out,
                    float *y) {
    if (scale) gemv_i8(x, (const int8_t *)w, scale, n_in, n_out, y);
    else gemv_f32(x, (const float *)w, n_in, n_out, y);
    if (bias)
        for (int o = 0; o < n_out; o++) y[o] += bias[o];
}

/* HF LlamaRMSNorm in fp32: (x * rsqrt(mean(x^2) + eps)) * weight. */
void rms_norm(const float *restrict x, const float *restrict weight, float eps, int n, float *restrict out) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)x[i] * x[i];
    float inv = 1.0f / sqrtf((float)(sum / n) + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * inv) * weight[i];
}

/* HF's non-interleaved rotary embedding: x * cos + rotate_half(x) * sin, sin already signed (RopeTables). */
static void rope(float *restrict x, const float *restrict cos, const float *restrict sin, int heads, int d) {
    int half = d / 2;
    float rotated[512];
    for (int h = 0; h < heads; h++, x += d) {
        for (int j = 0; j < d; j++) rotated[j] = x[j] * cos[j] + x[(j + half) % d] * sin[j];
        memcpy(x, rotated, sizeof(float) * (size_t)d);
    }
}

#ifdef __AVX512F__
/* e^x for x <= 0 (a softmax's shifted scores), 16 at a time: Cephes' expf (x = n ln2 + r, a degree-5 polynomial in
   r, 2^n applied by scalef), within ~2 ulp of expf; below -87.3 the result is 0 or subnormal, as expf's. The
   scalar expf was a quarter of the batched decode attention's time. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

#define ATTEND_VECTORS 8 /* head_dim / 16 up to 128 */
#define ATTEND_ACCUMULATORS 16 /* query heads x vectors held in registers at once */

/* The query heads [h0, h0 + g) of one KV head against its keys (see attend): each key and value row is loaded once
   for all of them, the scores' exponentials are taken 16 at a time, and each head's output stays in registers over
   the keys (normalized once at the end). head_dim a multiple of 16, at most 128. */
static void attend_heads(const float *q, const float *keys_head, const float *values_head, const int64_t *blocks,
                         int block_size, long num_keys, int h0, int g, int d, float *scores, float *out) {
    int nv = d / 16;
    float scale = 1.0f / sqrtf((float)d);
    __m512 qv[ATTEND_ACCUMULATORS], acc[ATTEND_ACCUMULATORS];
    float top[ATTEND_ACCUMULATORS], total[ATTEND_ACCUMULATORS];
    for (int hh = 0; hh < g; hh++) {
        for (int c = 0; c < nv; c++) qv[hh * nv + c] = _mm512_loadu_ps(q + (size_t)(h0 + hh) * d + 16 * c);
        top[hh] = -INFINITY;
    }
    for (long t0 = 0; t0 < num_keys; t0 += block_size) {
        const float *keys = keys_head + (size_t)blocks[t0 / block_size] * block_size * d;
        long n = num_keys - t0 < block_size ? num_keys - t0 : block_size;
        for (long t = 0; t < n; t++) {
            __m512 kv[ATTEND_VECTORS];
            for (int c = 0; c < nv; c++) kv[c] = _mm512_loadu_ps(keys + t * d + 16 * c);
            for (int hh = 0; hh < g; hh++) {
                __m512 dot = _mm512_mul_ps(qv[hh * nv], kv[0]);
                for (int c = 1; c < nv; c++) dot = _mm512_fmadd_ps(qv[hh * nv + c], kv[c], dot);
                float sc = _mm512_reduce_add_ps(dot) * scale;
                scores[(size_t)hh * num_keys + t0 + t] = sc;
                top[hh] = sc > top[hh] ? sc : top[hh];
            }
        }
    }
    for (int hh = 0; hh < g; hh++) {
        float *sh = scores + (size_t)hh * num_keys;
        __m512 shift = _mm512_set1_ps(top[hh]), sum = _mm512_setzero_ps();
        long t = 0;
        for (; t + 16 <= num_keys; t += 16) {
            __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sh + t), shift));
            _mm512_storeu_ps(sh + t, e);
            sum = _mm512_add_ps(sum, e);
        }
        if (t < num_keys) {
            __mmask16 tail = (__mmask16)((1u << (num_keys - t)) - 1);
            __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, sh + t), shift));
            _mm512_mask_storeu_ps(sh + t, tail, e);
            sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(tail, e));
        }
        total[hh] = _mm512_reduce_add_ps(sum);
        for (int c = 0; c < nv; c++) acc[hh * nv + c] = _mm512_setzero_ps();
    }
    for (long t0 = 0; t0 < num_keys; t0 += block_size) {
        const float *values = values_head + (size_t)blocks[t0 / block_size] * block_size * d;
        long n = num_keys - t0 < block_size ? num_keys - t0 : block_size;
        for (long t = 0; t < n; t++) {
            __m512 vv[ATTEND_VECTORS];
            for (int c = 0; c < nv; c++) vv[c] = _mm512_loadu_ps(values + t * d + 16 * c);
            for (int hh = 0; hh < g; hh++) {
                __m512 p = _mm512_set1_ps(scores[(size_t)hh * num_keys + t0 + t]);
                for (int c = 0; c < nv; c++) acc[hh * nv + c] = _mm512_fmadd_ps(p, vv[c], acc[hh * nv + c]);
            }
        }
    }
    for (int hh = 0; hh < g; hh++) {
        __m512 inv = _mm512_set1_ps(1.0f / total[hh]);
        for (int c = 0; c < nv; c++)
            _mm512_storeu_ps(out + (size_t)(h0 + hh) * d + 16 * c, _mm512_mul_ps(acc[hh * nv + c], inv));
    }
}
#endif

/* One query token against its num_keys keys: the first num_keys slots of the sequence's blocks (`blocks`, block_size
   slots each, anywhere in the pool) of head-major [kvh, num_slots, d] caches; scores is scratch of
   heads / kv_heads * num_keys floats. A block's keys are side by side, so the walk is one contiguous run per block. */
static void attend(const float *q, const float *k_cache, const float *v_cache, long num_slots, const int64_t *blocks,
                   int block_size, long num_keys, int heads, int kv_heads, int d, float *scores, float *out) {
    int group = heads / kv_heads;
#ifdef __AVX512F__
    if (d % 16 == 0 && d / 16 <= ATTEND_VECTORS) {
        int most = ATTEND_ACCUMULATORS / (d / 16); /* query heads at once: their outputs fill the registers */
        for (int h0 = 0; h0 < heads;) {
            int kh = h0 / group, g = group - h0 % group; /* never past the KV head's own query heads */
            g = g < most ? g : most;
            attend_heads(q, k_cache + (size_t)kh * num_slots * d, v_cache + (size_t)kh * num_slots * d, blocks,
                         block_size, num_keys, h0, g, d, scores, out);
            h0 += g;
        }
        return;
    }
#endif
    float scale = 1.0f / sqrtf((float)d);
    for (int h = 0; h < heads; h++) {
        size_t head = (size_t)(h / group) * num_slots;
        const float *qh = q + (size_t)h * d;
        float top = -INFINITY, total = 0.0f;
        for (long t0 = 0; t0 < num_keys; t0 += block_size) {
            const float *keys = k_cache + (head + (size_t)blocks[t0 / block_size] * block_size) * d;
            long n = num_keys - t0 < block_size ? num_keys - t0 : block_size;
            for (long t = 0; t < n; t++) {
                float s = 0.0f;
                for (int j = 0; j < d; j++) s += qh[j] * keys[t * d + j];
                scores[t0 + t] = s * scale;
                top = scores[t0 + t] > top ? scores[t0 + t] : top;
            }
        }
        for (long t = 0; t < num_keys; t++) total += scores[t] = expf(scores[t] - top);
        float *oh = out + (size_t)h * d;
        memset(oh, 0, sizeof(float) * (size_t)d);
        for (long t0 = 0; t0 < num_keys; t0 += block_size) {
            const float *values = v_cache + (head + (size_t)blocks[t0 / block_size] * block_size) * d;
            long n = num_keys - t0 < block_size ? num_keys - t0 : block_size;
            for (long t = 0; t < n; t++) {
                float p = scores[t0 + t] / total;
                for (int j = 0; j < d; j++) oh[j] += p * values[t * d + j];
            }
        }
    }
}

/* A decoder layer's weights: four projections (fp32 [in, out], or int8 [out, in] with per-row scales) and norms. */
typedef struct {
    const void *qkv, *o, *gate_up, *down;
    const float *qkv_scale, *o_scale, *gate_up_scale, *down_scale; /* NULL: fp32 weights */
    const float *qkv_bias, *input_norm, *post_norm;
    float *k_cache, *v_cache;
} Layer;

typedef struct {
    int hidden, heads, kv_heads, head_dim, intermediate;
    float eps;
    long num_slots;
} Shape;

/* x[hidden] += attention and MLP of one layer for one token at `slot`, attending to its num_keys keys in `blocks`;
   scratch holds hidden + (heads + 2 kv_heads) d + heads d + 2 intermediate + heads / kv_heads * num_keys floats. */
void decode_layer(const Layer *l, const Shape *s, float *x, const float *cos, const float *sin, long slot,
                  const int64_t *blocks, int block_size, long num_keys, float *scratch) {
    int d = s->head_dim, q_dim = s->heads * d, kv_dim = s->kv_heads * d;
    float *normed = scratch, *qkv = normed + s->hidden, *attn = qkv + q_dim + 2 * kv_dim;
    float *gate_up = attn + q_dim, *scores = gate_up + 2 * s->intermediate;
    rms_norm(x, l->input_norm, s->eps, s->hidden, normed);
    project(normed, l->qkv, l->qkv_scale, l->qkv_bias, s->hidden, q_dim + 2 * kv_dim, qkv);
    rope(qkv, cos, sin, s->heads + s->kv_heads, d);
    for (int h = 0; h < s->kv_heads; h++) {
        size_t at = ((size_t)h * s->num_slots + slot) * d;
        memcpy(l->k_cache + at, qkv + q_dim + h * d, sizeof(float) * (size_t)d);
        memcpy(l->v_cache + at, qkv + q_dim + kv_dim + h * d, sizeof(float) * (size_t)d);
    }
    attend(qkv, l->k_cache, l->v_cache, s->num_slots, blocks, block_size, num_keys, s->heads, s->kv_heads, d, scores,
           attn);
    project(attn, l->o, l->o_scale, NULL, q_dim, s->hidden, normed);
    for (int i = 0; i < s->hidden; i++) x[i] += normed[i];
    rms_norm(x, l->post_norm, s->eps, s->hidden, normed);
    project(normed, l->gate_up, l->gate_up_scale, NULL, s->hidden, 2 * s->intermediate, gate_up);
    for (int i = 0; i < s->intermediate; i++) {
        float g = gate_up[i];
        gate_up[i] = g / (1.0f + expf(-g)) * gate_up[s->intermediate + i];
    }
    project(gate_up, l->down, l->down_scale, NULL, s->intermediate, s->hidden, normed);
    for (int i = 0; i < s->hidden; i++) x[i] += normed[i];
}

/* Every layer of the model for one token: one call per step. */
void decode_layers(const Layer *layers, int num_layers, const Shape *s, float *x, const float *cos, const float *sin,
                   long slot, const int64_t *blocks, int block_size, long num_keys, float *scratch) {
    for (int i = 0; i < num_layers; i++)
        decode_layer(layers + i, s, x, cos, sin, slot, blocks, block_size, num_keys, scratch);
}

/* Decode attention of a batched step, one query token a sequence: sequence b's query q[b] ([heads, d]) attends to its
   num_keys[b] keys through its row of `tables` (max_blocks int64 block ids, padded past its own), into out[b]. The
   PyTorch path gathers every sequence's blocks into a padded copy and masks the padding (~12 ms of a ~97 ms step at
   32 sequences on SmolLM2; this loop ~9 ms). scores: scratch of heads / kv_heads times the largest num_keys floats. */
void attend_decode_batch(const float *q, const float *k_cache, const float *v_cache, long num_slots,
                         const int64_t *tables, int max_blocks, const int64_t *num_keys, int num_seqs, int block_size,
                         int heads, int kv_heads, int d, float *scores, float *out) {
    for (int b = 0; b < num_seqs; b++)
        attend(q + (size_t)b * heads * d, k_cache, v_cache, num_slots, tables + (size_t)b * max_blocks, block_size,
               num_keys[b], heads, kv_heads, d, scores, out + (size_t)b * heads * d);
}
