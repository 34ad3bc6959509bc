/* Row norms ||x[r, :]||_2 of a contiguous [rows, k] matrix, for dtg_gpu.graph.row_norms.
 *
 * Why: torch reduces a short inner dimension (the 9 weights of a 3x3 kernel slice) one row at
 * a time, ending every row in a horizontal sum; on CPU that runs at 2-4x the time of a plain
 * read of the weights (benchmarks/bench_filter_norms.py). Here eight rows (four in float64)
 * are squared and summed in eight vector accumulators and their horizontal sums are taken
 * together, in one transpose-and-add tree, so the kernel runs near memory bandwidth.
 *
 * Contract (tests/graph/test_native.py):
 * - out[r] = sqrt(sum_c x[r, c]^2), squares summed in the input's precision (as torch's
 *   vector_norm and cdist do); NaN and Inf propagate; overflow of the squares is the caller's
 *   to detect (dtg_gpu.graph.norms_in_range), as with torch's kernels;
 * - every row is computed by the same operations in the same order whatever its position,
 *   the number of rows or the split over threads: a row's norm is a function of that row
 *   alone, bit for bit (rows of an incomplete last group are summed with zero accumulators
 *   standing in for the missing ones);
 * - AVX2+FMA code is compiled for x86-64 through target attributes, not -march, and chosen at
 *   run time (dtg_row_norms_supported), so a library built on one machine runs on another
 *   of the same architecture; elsewhere the kernel reports itself unsupported and the caller
 *   keeps torch's kernels.
 * Reads exactly rows * k elements (masked loads for the tail of each row), writes rows.
 */
#include <stdint.h>
#include <string.h>
#include <math.h>

int dtg_row_norms_abi(void) { return 1; }

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DTG_AVX2 __attribute__((target("avx2,fma")))

int dtg_row_norms_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* lane j of the result = sum of the 8 lanes of a_j, in the order ((0+1)+(2+3))+((4+5)+(6+7)) */
DTG_AVX2 static inline __m256 hsum8_ps(const __m256 *a) {
    __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* lane j of the result = sum of the 4 lanes of a_j, in the order (0+1)+(2+3) */
DTG_AVX2 static inline __m256d hsum4_pd(const __m256d *a) {
    __m256d t0 = _mm256_hadd_pd(a[0], a[1]), t1 = _mm256_hadd_pd(a[2], a[3]);
    return _mm256_add_pd(_mm256_permute2f128_pd(t0, t1, 0x20), _mm256_permute2f128_pd(t0, t1, 0x31));
}

/* lanewise sums of squares of one row: four independent accumulators over blocks of 32 (so a
 * long row is not one chain of dependent FMAs), then the rest and the masked tail into the first */
DTG_AVX2 static inline __m256 row_sq_ps(const float *p, int64_t full, int64_t rem, __m256i mask) {
    __m256 a = _mm256_setzero_ps();
    int64_t c = 0;
    if (full >= 4) {
        __m256 b = _mm256_setzero_ps(), d = _mm256_setzero_ps(), e = _mm256_setzero_ps();
        for (; c + 4 <= full; c += 4) {
            __m256 v0 = _mm256_loadu_ps(p + 8 * c), v1 = _mm256_loadu_ps(p + 8 * c + 8);
            __m256 v2 = _mm256_loadu_ps(p + 8 * c + 16), v3 = _mm256_loadu_ps(p + 8 * c + 24);
            a = _mm256_fmadd_ps(v0, v0, a);
            b = _mm256_fmadd_ps(v1, v1, b);
            d = _mm256_fmadd_ps(v2, v2, d);
            e = _mm256_fmadd_ps(v3, v3, e);
        }
        a = _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(d, e));
    }
    for (; c < full; c++) {
        __m256 v = _mm256_loadu_ps(p + 8 * c);
        a = _mm256_fmadd_ps(v, v, a);
    }
    if (rem) {
        __m256 v = _mm256_maskload_ps(p + 8 * full, mask);
        a = _mm256_fmadd_ps(v, v, a);
    }
    return a;
}

DTG_AVX2 static inline __m256d row_sq_pd(const double *p, int64_t full, int64_t rem, __m256i mask) {
    __m256d a = _mm256_setzero_pd();
    int64_t c = 0;
    if (full >= 4) {
        __m256d b = _mm256_setzero_pd(), d = _mm256_setzero_pd(), e = _mm256_setzero_pd();
        for (; c + 4 <= full; c += 4) {
            __m256d v0 = _mm256_loadu_pd(p + 4 * c), v1 = _mm256_loadu_pd(p + 4 * c + 4);
            __m256d v2 = _mm256_loadu_pd(p + 4 * c + 8), v3 = _mm256_loadu_pd(p + 4 * c + 12);
            a = _mm256_fmadd_pd(v0, v0, a);
            b = _mm256_fmadd_pd(v1, v1, b);
            d = _mm256_fmadd_pd(v2, v2, d);
            e = _mm256_fmadd_pd(v3, v3, e);
        }
        a = _mm256_add_pd(_mm256_add_pd(a, b), _mm256_add_pd(d, e));
    }
    for (; c < full; c++) {
        __m256d v = _mm256_loadu_pd(p + 4 * c);
        a = _mm256_fmadd_pd(v, v, a);
    }
    if (rem) {
        __m256d v = _mm256_maskload_pd(p + 4 * full, mask);
        a = _mm256_fmadd_pd(v, v, a);
    }
    return a;
}

/* always inlined into callers with a constant k, so the common kernel sizes get unrolled code */
DTG_AVX2 static inline __attribute__((always_inline)) void norms_f32(const float *x, float *out, int64_t rows,
                                                                       int64_t k) {
    const int64_t full = k / 8, rem = k % 8;
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rem), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 acc[8];
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) {
        for (int j = 0; j < 8; j++) acc[j] = row_sq_ps(x + (r + j) * k, full, rem, mask);
        _mm256_storeu_ps(out + r, _mm256_sqrt_ps(hsum8_ps(acc)));
    }
    if (r < rows) {
        float tail[8];
        for (int j = 0; j < 8; j++)
            acc[j] = r + j < rows ? row_sq_ps(x + (r + j) * k, full, rem, mask) : _mm256_setzero_ps();
        _mm256_storeu_ps(tail, _mm256_sqrt_ps(hsum8_ps(acc)));
        memcpy(out + r, tail, (size_t)(rows - r) * sizeof(float));
    }
}

DTG_AVX2 static inline __attribute__((always_inline)) void norms_f64(const double *x, double *out, int64_t rows,
                                                                       int64_t k) {
    const int64_t full = k / 4, rem = k % 4;
    const __m256i mask = _mm256_cmpgt_epi64(_mm256_set1_epi64x(rem), _mm256_setr_epi64x(0, 1, 2, 3));
    __m256d acc[4];
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        for (int j = 0; j < 4; j++) acc[j] = row_sq_pd(x + (r + j) * k, full, rem, mask);
        _mm256_storeu_pd(out + r, _mm256_sqrt_pd(hsum4_pd(acc)));
    }
    if (r < rows) {
        double tail[4];
        for (int j = 0; j < 4; j++)
            acc[j] = r + j < rows ? row_sq_pd(x + (r + j) * k, full, rem, mask) : _mm256_setzero_pd();
        _mm256_storeu_pd(tail, _mm256_sqrt_pd(hsum4_pd(acc)));
        memcpy(out + r, tail, (size_t)(rows - r) * sizeof(double));
    }
}

DTG_AVX2 void dtg_row_norms_f32(const float *x, float *out, int64_t rows, int64_t k) {
    switch (k) {  /* 3x3, 5x5 and 2x2 kernel slices */
    case 9: norms_f32(x, out, rows, 9); break;
    case 25: norms_f32(x, out, rows, 25); break;
    case 4: norms_f32(x, out, rows, 4); break;
    default: norms_f32(x, out, rows, k);
    }
}

DTG_AVX2 void dtg_row_norms_f64(const double *x, double *out, int64_t rows, int64_t k) {
    switch (k) {
    case 9: norms_f64(x, out, rows, 9); break;
    case 25: norms_f64(x, out, rows, 25); break;
    case 4: norms_f64(x, out, rows, 4); break;
    default: norms_f64(x, out, rows, k);
    }
}

#else /* no vector kernel for this architecture: the caller keeps torch's kernels */

int dtg_row_norms_supported(void) { return 0; }
void dtg_row_norms_f32(const float *x, float *out, int64_t rows, int64_t k) {
    for (int64_t r = 0; r < rows; r++) {
        float s = 0.f;
        for (int64_t c = 0; c < k; c++) s += x[r * k + c] * x[r * k + c];
        out[r] = sqrtf(s);
    }
}
void dtg_row_norms_f64(const double *x, double *out, int64_t rows, int64_t k) {
    for (int64_t r = 0; r < rows; r++) {
        double s = 0.;
        for (int64_t c = 0; c < k; c++) s += x[r * k + c] * x[r * k + c];
        out[r] = sqrt(s);
    }
}
#endif
