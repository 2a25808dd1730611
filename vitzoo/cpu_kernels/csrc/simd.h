// Vector helpers shared by vitzoo's CPU kernels: one AVX register of float or double through GCC/Clang vector
// extensions, a register-blocked matrix product and a vectorised 2^x.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace vitzoo {

template <typename T> struct VecOf { typedef T type __attribute__((vector_size(32))); };
template <typename T> using vec = typename VecOf<T>::type;  // one AVX register of T
template <typename T> constexpr int lanes() { return 32 / sizeof(T); }

template <typename T> inline vec<T> load(const T* p) { vec<T> v; std::memcpy(&v, p, sizeof(v)); return v; }
template <typename T> inline void store(T* p, vec<T> v) { std::memcpy(p, &v, sizeof(v)); }
template <typename T> inline vec<T> splat(T x) { return vec<T>{} + x; }
template <typename T> inline T hsum(vec<T> v) {
  T s = 0;
  for (int i = 0; i < lanes<T>(); ++i) s += v[i];
  return s;
}
template <typename T> inline T hmax(vec<T> v) {
  T s = v[0];
  for (int i = 1; i < lanes<T>(); ++i) s = v[i] > s ? v[i] : s;
  return s;
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// RW rows x 2 vectors of C (+)= A(m, j) B[j, :] over j < R; a = A's first row, c = C's first row.
template <typename T, int RW>
inline void gemm_tile(int64_t R, const T* a, int64_t sam, int64_t saj, const T* b, int64_t ldb, T* c, int64_t ldc,
                      bool accumulate) {
  constexpr int W = lanes<T>();
  vec<T> s[RW][2];
  for (int r = 0; r < RW; ++r) {
    s[r][0] = accumulate ? load<T>(c + r * ldc) : vec<T>{};
    s[r][1] = accumulate ? load<T>(c + r * ldc + W) : vec<T>{};
  }
  for (int64_t j = 0; j < R; ++j) {
    const vec<T> b0 = load<T>(b + j * ldb), b1 = load<T>(b + j * ldb + W);
    for (int r = 0; r < RW; ++r) {
      const vec<T> x = splat<T>(a[r * sam + j * saj]);
      s[r][0] += x * b0;
      s[r][1] += x * b1;
    }
  }
  for (int r = 0; r < RW; ++r) {
    store<T>(c + r * ldc, s[r][0]);
    store<T>(c + r * ldc + W, s[r][1]);
  }
}

// C[M, N] = A(m, j) B[j, N] summed over j < R (or added to C with accumulate), with A(m, j) = A[m * sam + j * saj]
// (any layout: it is broadcast) and B, C row-major. Tiles of 6 rows x 2 vectors (12 accumulators, as many as
// hide the FMA latency on AVX2 with registers to spare), then a narrower tile for the last M % 6 rows.
// N % (2 lanes) == 0; M and R any.
template <typename T>
void gemm(int64_t M, int64_t N, int64_t R, const T* A, int64_t sam, int64_t saj, const T* B, int64_t ldb, T* C,
          int64_t ldc, bool accumulate = false) {
  constexpr int W = lanes<T>();
  int64_t m0 = 0;
  for (; m0 + 6 <= M; m0 += 6)
    for (int64_t n0 = 0; n0 < N; n0 += 2 * W)
      gemm_tile<T, 6>(R, A + m0 * sam, sam, saj, B + n0, ldb, C + m0 * ldc + n0, ldc, accumulate);
  const T* a = A + m0 * sam;
  for (int64_t n0 = 0; n0 < N; n0 += 2 * W) {
    T* c = C + m0 * ldc + n0;
    switch (M - m0) {
      case 5: gemm_tile<T, 5>(R, a, sam, saj, B + n0, ldb, c, ldc, accumulate); break;
      case 4: gemm_tile<T, 4>(R, a, sam, saj, B + n0, ldb, c, ldc, accumulate); break;
      case 3: gemm_tile<T, 3>(R, a, sam, saj, B + n0, ldb, c, ldc, accumulate); break;
      case 2: gemm_tile<T, 2>(R, a, sam, saj, B + n0, ldb, c, ldc, accumulate); break;
      case 1: gemm_tile<T, 1>(R, a, sam, saj, B + n0, ldb, c, ldc, accumulate); break;
      default: break;
    }
  }
}

// 2^x for x <= 0, NaN for NaN. float: a degree-6 polynomial after rounding to an integer power (relative error
// < 2e-7, flushed to 2^-126 below it); double: std::exp2.
inline vec<float> exp2v(vec<float> x) {
  typedef int32_t ivec __attribute__((vector_size(32)));
  x = x < -126.0f ? splat<float>(-126.0f) : x;
  const ivec k = __builtin_convertvector(x - 0.5f, ivec);  // toward zero: the nearest integer, |f| <= 0.5
  const vec<float> f = (x - __builtin_convertvector(k, vec<float>)) * 0.69314718056f;  // 2^f = e^(f ln 2)
  const vec<float> p = 1.0f + f * (1.0f + f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120 + f / 720)))));
  const ivec bits = (k + 127) << 23;  // 2^k as a float
  vec<float> two_k;
  std::memcpy(&two_k, &bits, sizeof(two_k));
  return x == x ? p * two_k : x;  // NaN lanes: x itself (the integer conversion of NaN is not defined)
}
inline vec<double> exp2v(vec<double> x) {
  for (int i = 0; i < 4; ++i) x[i] = std::exp2(x[i]);
  return x;
}

// sin x and cos x. float: x = kπ/2 + r with |r| <= π/4 (π/2 in three parts, exact products for |k| < 2^12),
// polynomials of degree 9 (sin) and 10 (cos) in r (error < 2e-7 for |x| up to about 10^4), the quadrant k mod 4
// swapping and negating them; double: std::sin and std::cos.
inline void sincosv(vec<float> x, vec<float>& sin_x, vec<float>& cos_x) {
  typedef int32_t ivec __attribute__((vector_size(32)));
  const vec<float> y = x * 0.636619772f;  // x / (π/2)
  const ivec k = __builtin_convertvector(y + (y < 0 ? splat<float>(-0.5f) : splat<float>(0.5f)), ivec);  // nearest
  const vec<float> kf = __builtin_convertvector(k, vec<float>);
  const vec<float> r = ((x - kf * 1.5703125f) - kf * 4.837512969970703125e-4f) - kf * 7.549789948768648e-8f;
  const vec<float> r2 = r * r;
  const vec<float> s = r * (1.0f + r2 * (-1.0f / 6 + r2 * (1.0f / 120 + r2 * (-1.0f / 5040 + r2 * (1.0f / 362880)))));
  const vec<float> c = 1.0f + r2 * (-0.5f + r2 * (1.0f / 24 + r2 * (-1.0f / 720 + r2 * (1.0f / 40320 - r2 / 3628800))));
  const ivec swap = (k & 1) != 0, neg_sin = (k & 2) != 0, neg_cos = ((k + 1) & 2) != 0;
  const vec<float> sn = swap ? c : s, cs = swap ? s : c;
  sin_x = neg_sin ? -sn : sn;
  cos_x = neg_cos ? -cs : cs;
}
inline void sincosv(vec<double> x, vec<double>& sin_x, vec<double>& cos_x) {
  for (int i = 0; i < 4; ++i) sin_x[i] = std::sin(x[i]), cos_x[i] = std::cos(x[i]);
}

}  // namespace vitzoo
