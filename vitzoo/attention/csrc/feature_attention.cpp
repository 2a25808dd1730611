// FAVOR+ kernel attention for the CPU: the "exp" feature map of vitzoo.attention._kernel_core (performer).
//
// Paper: Choromanski et al., "Rethinking Attention with Performers", ICLR 2021, https://arxiv.org/abs/2009.14794.
//
// out = φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1) per (image, head), with φ(x) = 2^(w̃x - shift) for w̃ = ω log2(e) / d^¼ (log2
// units: exp2 is the fast exponential). A query's shift is the largest w̃x of its row; a key's is ‖x̃‖²/2 (log2
// units) plus the largest exponent over all keys of the (image, head). The shifts cancel in the ratio.
//
// One task per (image, head) walks its tokens in blocks of TOK: a block's features [TOK, m] are made in cache
// (product, then exp2) and read there by the products that use them; nothing N×m is stored. The keys' largest
// exponent is a running maximum (φ(K)ᵀ[V | 1] is rescaled when it grows, as FlashAttention rescales its
// accumulator), so the keys are read once. Backward recomputes the features from the saved shifts. The kernel
// computes and saves what the PyTorch path of _kernel_core computes and saves (out, kvz = φ(K)ᵀ[V | 1], the
// shifts and the normalisers), so either backward takes either forward's results.
//
// Padded buffers: dp = head dim rounded up to two vectors, mp = m rounded up to two vectors (padding is zero).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "simd.h"

namespace {
using namespace vitzoo;

constexpr int64_t TOK = 64;  // tokens per block: the block's features and their gradient (2 x 64 KB at m = 256) stay in L2

struct Dims {
  int64_t B, N, h, d, m, dp, mp;
};

Dims dims_of(const at::Tensor& qkv, const at::Tensor& omega, int64_t heads) {
  Dims s;
  s.B = qkv.size(0), s.N = qkv.size(1), s.h = heads, s.d = qkv.size(2) / 3 / heads, s.m = omega.size(0);
  s.dp = round_up(s.d, 16), s.mp = round_up(s.m, 16);
  return s;
}

// The small per-task buffers (row-major; padding columns stay zero).
template <typename T> struct Work {
  std::vector<T> x, v, g, acc, phi, gphi, kv, kvt, z, gkv, gkvt, gz, top, half, aux;
  explicit Work(const Dims& s)
      : x(TOK * s.dp), v(TOK * s.dp), g(TOK * s.dp), acc(TOK * s.dp), phi(TOK * s.mp), gphi(TOK * s.mp),
        kv(s.mp * s.dp), kvt(s.dp * s.mp), z(s.mp), gkv(s.mp * s.dp), gkvt(s.dp * s.mp), gz(s.mp), top(TOK),
        half(TOK), aux(TOK) {}
};

// The random features as the products take them: w̃ᵀ [d, mp] (log2 units, for the features) and c·ω [mp, dp] (for
// the input gradients: ∂(w̃x)/∂x in natural units), zero in the padding.
template <typename T> struct Features {
  std::vector<T> wt, wc;
  T c;
  Features(const at::Tensor& omega, const Dims& s) : wt(s.d * s.mp), wc(s.mp * s.dp), c(std::pow(T(s.d), T(-0.25))) {
    const T* w = omega.data_ptr<T>();
    for (int64_t r = 0; r < s.m; ++r)
      for (int64_t e = 0; e < s.d; ++e) {
        wt[e * s.mp + r] = w[r * s.d + e] * c * T(M_LOG2E);
        wc[r * s.dp + e] = w[r * s.d + e] * c;
      }
  }
};

// Copies n rows of one (image, head) from a [B, N, parts, h, d] tensor (part `part`) into buf[n, dp].
template <typename T>
void load_rows(const Dims& s, const T* src, int64_t parts, int64_t part, int64_t b, int64_t hd, int64_t t0, int64_t n,
               T* buf) {
  for (int64_t t = 0; t < n; ++t)
    std::memcpy(buf + t * s.dp, src + (((b * s.N + t0 + t) * parts + part) * s.h + hd) * s.d, s.d * sizeof(T));
}

// Writes buf[n, dp]'s first d columns (plus coef[t] times x[t], when coef is given) to rows of a [B, N, parts, h, d]
// tensor.
template <typename T>
void store_rows(const Dims& s, T* dst, int64_t parts, int64_t part, int64_t b, int64_t hd, int64_t t0, int64_t n,
                const T* buf, const T* coef = nullptr, const T* x = nullptr) {
  for (int64_t t = 0; t < n; ++t) {
    T* row = dst + (((b * s.N + t0 + t) * parts + part) * s.h + hd) * s.d;
    for (int64_t e = 0; e < s.d; ++e) row[e] = buf[t * s.dp + e] + (coef ? coef[t] * x[t * s.dp + e] : T(0));
  }
}

// phi[n, mp] = X w̃ᵀ: the exponents before the shift.
template <typename T> void project(const Dims& s, const Features<T>& f, Work<T>& w, int64_t n) {
  gemm<T>(n, s.mp, s.d, w.x.data(), s.dp, 1, f.wt.data(), s.mp, w.phi.data(), s.mp);
}

// The largest of the m exponents of row t.
template <typename T> T row_max(const Dims& s, const T* row) {
  constexpr int W = lanes<T>();
  const int64_t full = s.m / W * W;
  vec<T> top = splat<T>(-std::numeric_limits<T>::infinity());
  for (int64_t r = 0; r < full; r += W) {
    const vec<T> x = load<T>(row + r);
    top = x > top ? x : top;
  }
  T best = hmax<T>(top);
  for (int64_t r = full; r < s.m; ++r) best = std::max(best, row[r]);
  return best;
}

// phi[t] = 2^(phi[t] - shift[t]) for t < n (exponents <= 0 up to rounding), 0 in the padding columns.
template <typename T> void exp_rows(const Dims& s, T* phi, int64_t n, const T* shift) {
  constexpr int W = lanes<T>();
  for (int64_t t = 0; t < n; ++t) {
    T* row = phi + t * s.mp;
    const vec<T> sh = splat<T>(shift[t]);
    for (int64_t r = 0; r < s.mp; r += W) {
      const vec<T> x = load<T>(row + r) - sh;
      store<T>(row + r, exp2v(x < 0 ? x : vec<T>{}));
    }
    std::fill(row + s.m, row + s.mp, T(0));
  }
}

// dst[mp] += Σ_t coef[t] phi[t] over t < n (coef = 1 where null).
template <typename T> void add_columns(const Dims& s, const T* phi, int64_t n, const T* coef, T* dst) {
  constexpr int W = lanes<T>();
  for (int64_t r = 0; r < s.mp; r += W) {
    vec<T> sum = load<T>(dst + r);
    for (int64_t t = 0; t < n; ++t) sum += load<T>(phi + t * s.mp + r) * (coef ? coef[t] : T(1));
    store<T>(dst + r, sum);
  }
}

template <typename T> T dot(const T* a, const T* b, int64_t len) {
  constexpr int W = lanes<T>();
  vec<T> sum = {};
  for (int64_t r = 0; r < len; r += W) sum += load<T>(a + r) * load<T>(b + r);
  return hsum<T>(sum);
}

// kT[dp, mp] = k[mp, dp]ᵀ.
template <typename T> void transpose(const Dims& s, const T* k, T* kt) {
  for (int64_t r = 0; r < s.mp; ++r)
    for (int64_t e = 0; e < s.dp; ++e) kt[e * s.mp + r] = k[r * s.dp + e];
}

// Keys and values of one (image, head): w.kv = φ(K)ᵀV [mp, dp], w.z = φ(K)ᵀ1 and the keys' shifts.
template <typename T>
void key_sums(const Dims& s, const Features<T>& f, const T* qkv, int64_t b, int64_t hd, T* shift, Work<T>& w) {
  const T hs = T(0.5 * M_LOG2E) * f.c * f.c;  // ‖x‖² -> ‖x̃‖²/2 in log2 units
  T top = -std::numeric_limits<T>::infinity();  // largest exponent so far; the sums are relative to it
  std::fill(w.kv.begin(), w.kv.end(), T(0));
  std::fill(w.z.begin(), w.z.end(), T(0));
  for (int64_t t0 = 0; t0 < s.N; t0 += TOK) {
    const int64_t n = std::min(TOK, s.N - t0);
    load_rows<T>(s, qkv, 3, 1, b, hd, t0, n, w.x.data());
    load_rows<T>(s, qkv, 3, 2, b, hd, t0, n, w.v.data());
    project<T>(s, f, w, n);
    T block = -std::numeric_limits<T>::infinity();
    for (int64_t t = 0; t < n; ++t) {
      w.half[t] = hs * dot<T>(&w.x[t * s.dp], &w.x[t * s.dp], s.dp);
      block = std::max(block, row_max<T>(s, &w.phi[t * s.mp]) - w.half[t]);
    }
    if (block > top) {  // rescale the sums to the new largest exponent
      const T r = std::exp2(top - block);
      for (auto& x : w.kv) x *= r;
      for (auto& x : w.z) x *= r;
      top = block;
    }
    for (int64_t t = 0; t < n; ++t) {
      shift[t0 + t] = w.half[t];  // the final largest exponent is added below
      w.top[t] = w.half[t] + top;
    }
    exp_rows<T>(s, w.phi.data(), n, w.top.data());
    gemm<T>(s.mp, s.dp, n, w.phi.data(), 1, s.mp, w.v.data(), s.dp, w.kv.data(), s.dp, true);  // += φᵀV
    add_columns<T>(s, w.phi.data(), n, nullptr, w.z.data());  // += φᵀ1
  }
  for (int64_t t = 0; t < s.N; ++t) shift[t] += top;
}

template <typename T>
void forward_impl(const at::Tensor& qkv, const at::Tensor& omega, int64_t heads, double eps, at::Tensor& out,
                  at::Tensor& kvz, at::Tensor& shift_q, at::Tensor& shift_k, at::Tensor& den) {
  const Dims s = dims_of(qkv, omega, heads);
  const Features<T> f(omega, s);
  const T floor = static_cast<T>(eps);
  const T* x_all = qkv.data_ptr<T>();
  T *o_all = out.data_ptr<T>(), *kvz_all = kvz.data_ptr<T>(), *sq_all = shift_q.data_ptr<T>(),
    *sk_all = shift_k.data_ptr<T>(), *den_all = den.data_ptr<T>();
  at::parallel_for(0, s.B * s.h, 1, [&](int64_t begin, int64_t end) {
    Work<T> w(s);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.h, hd = bh % s.h;
      key_sums<T>(s, f, x_all, b, hd, sk_all + bh * s.N, w);
      T* kvz_h = kvz_all + bh * s.m * (s.d + 1);  // [m, d + 1]: [φ(K)ᵀV | φ(K)ᵀ1]
      for (int64_t r = 0; r < s.m; ++r) {
        std::copy_n(&w.kv[r * s.dp], s.d, kvz_h + r * (s.d + 1));
        kvz_h[r * (s.d + 1) + s.d] = w.z[r];
      }
      for (int64_t t0 = 0; t0 < s.N; t0 += TOK) {  // queries
        const int64_t n = std::min(TOK, s.N - t0);
        T *sq = sq_all + bh * s.N + t0, *dn = den_all + bh * s.N + t0;
        load_rows<T>(s, x_all, 3, 0, b, hd, t0, n, w.x.data());
        project<T>(s, f, w, n);
        for (int64_t t = 0; t < n; ++t) sq[t] = row_max<T>(s, &w.phi[t * s.mp]);
        exp_rows<T>(s, w.phi.data(), n, sq);
        gemm<T>(n, s.dp, s.mp, w.phi.data(), s.mp, 1, w.kv.data(), s.dp, w.acc.data(), s.dp);  // φ(Q)(φ(K)ᵀV)
        for (int64_t t = 0; t < n; ++t) {  // divided (not times a reciprocal): backward's g·out recomputed is the same
          dn[t] = dot<T>(&w.phi[t * s.mp], w.z.data(), s.mp);  // φ(Q)(φ(K)ᵀ1)
          for (int64_t e = 0; e < s.dp; ++e) w.acc[t * s.dp + e] /= std::max(dn[t], floor);
        }
        store_rows<T>(s, o_all, 1, 0, b, hd, t0, n, w.acc.data());
      }
    }
  });
}

// w.acc[n, dp] = ∂L/∂x through the features (without the ‖x̃‖² term): ∂L/∂φ is w.gphi (its product part) plus
// coef[t]·add[r] (coef = 1 where null); ∂L/∂(w̃x) = ∂L/∂φ ⊙ φ (log2 units cancel: ∂2^u/∂(u ln 2) = 2^u); times c·ω.
template <typename T>
void feature_grads(const Dims& s, const Features<T>& f, Work<T>& w, int64_t n, const T* coef, const T* add) {
  constexpr int W = lanes<T>();
  for (int64_t t = 0; t < n; ++t) {
    const T k = coef ? coef[t] : T(1);
    T *g = &w.gphi[t * s.mp], *p = &w.phi[t * s.mp];
    for (int64_t r = 0; r < s.mp; r += W) store<T>(g + r, (load<T>(g + r) + k * load<T>(add + r)) * load<T>(p + r));
  }
  gemm<T>(n, s.dp, s.mp, w.gphi.data(), s.mp, 1, f.wc.data(), s.dp, w.acc.data(), s.dp);
}

// ∂L/∂q of one (image, head); adds the queries' share to ∂L/∂(φ(K)ᵀV) (w.gkv) and ∂L/∂(φ(K)ᵀ1) (w.gz).
template <typename T>
void query_grads(const Dims& s, const Features<T>& f, const T* qkv, const T* grad, const T* dots, const T* shift,
                 const T* den, T floor, int64_t b, int64_t hd, T* gqkv, Work<T>& w) {
  for (int64_t t0 = 0; t0 < s.N; t0 += TOK) {
    const int64_t n = std::min(TOK, s.N - t0);
    load_rows<T>(s, qkv, 3, 0, b, hd, t0, n, w.x.data());
    project<T>(s, f, w, n);
    exp_rows<T>(s, w.phi.data(), n, shift + t0);
    load_rows<T>(s, grad, 1, 0, b, hd, t0, n, w.g.data());
    if (!dots)  // g·out from φ(Q)(φ(K)ᵀV) recomputed, divided by the normaliser below
      gemm<T>(n, s.dp, s.mp, w.phi.data(), s.mp, 1, w.kv.data(), s.dp, w.acc.data(), s.dp);
    for (int64_t t = 0; t < n; ++t) {
      const T raw = den[t0 + t], dn = std::max(raw, floor);
      const T g_out = dots ? dots[t0 + t] : dot<T>(&w.g[t * s.dp], &w.acc[t * s.dp], s.dp) / dn;  // g·out
      const T g_den = raw >= floor ? -g_out / dn : T(0);  // ∂L/∂(φ(q)ᵀz): the floor passes no gradient
      w.aux[t] = g_den;
      w.half[t] = f.c * f.c * -(g_out + g_den * raw);  // c²·∂L/∂(‖x̃‖²/2)
      for (int64_t e = 0; e < s.dp; ++e) w.g[t * s.dp + e] /= dn;  // ∂L/∂(φ(q)ᵀkv) = g/den
    }
    gemm<T>(s.mp, s.dp, n, w.phi.data(), 1, s.mp, w.g.data(), s.dp, w.gkv.data(), s.dp, true);  // += φᵀ ∂L/∂num
    add_columns<T>(s, w.phi.data(), n, w.aux.data(), w.gz.data());  // += φᵀ ∂L/∂den
    gemm<T>(n, s.mp, s.d, w.g.data(), s.dp, 1, w.kvt.data(), s.mp, w.gphi.data(), s.mp);  // ∂L/∂φ = g kvᵀ + g_den zᵀ
    feature_grads<T>(s, f, w, n, w.aux.data(), w.z.data());
    store_rows<T>(s, gqkv, 3, 0, b, hd, t0, n, w.acc.data(), w.half.data(), w.x.data());
  }
}

// ∂L/∂k and ∂L/∂v of one (image, head) from ∂L/∂(φ(K)ᵀV) (w.gkv, w.gkvt) and ∂L/∂(φ(K)ᵀ1) (w.gz).
template <typename T>
void key_grads(const Dims& s, const Features<T>& f, const T* qkv, const T* shift, int64_t b, int64_t hd, T* gqkv,
               Work<T>& w) {
  for (int64_t t0 = 0; t0 < s.N; t0 += TOK) {
    const int64_t n = std::min(TOK, s.N - t0);
    load_rows<T>(s, qkv, 3, 1, b, hd, t0, n, w.x.data());
    load_rows<T>(s, qkv, 3, 2, b, hd, t0, n, w.v.data());
    project<T>(s, f, w, n);
    exp_rows<T>(s, w.phi.data(), n, shift + t0);
    gemm<T>(n, s.dp, s.mp, w.phi.data(), s.mp, 1, w.gkv.data(), s.dp, w.acc.data(), s.dp);  // ∂L/∂V = φ ∂L/∂kv
    store_rows<T>(s, gqkv, 3, 2, b, hd, t0, n, w.acc.data());
    for (int64_t t = 0; t < n; ++t) {  // ∂L/∂φ·φ summed over the features: [v | 1]·(φ [∂L/∂kv | ∂L/∂z])
      const T g_z = dot<T>(&w.phi[t * s.mp], w.gz.data(), s.mp);
      w.half[t] = f.c * f.c * -(dot<T>(&w.v[t * s.dp], &w.acc[t * s.dp], s.dp) + g_z);
    }
    gemm<T>(n, s.mp, s.d, w.v.data(), s.dp, 1, w.gkvt.data(), s.mp, w.gphi.data(), s.mp);  // ∂L/∂φ = v ∂L/∂kvᵀ + ∂L/∂z
    feature_grads<T>(s, f, w, n, nullptr, w.gz.data());
    store_rows<T>(s, gqkv, 3, 1, b, hd, t0, n, w.acc.data(), w.half.data(), w.x.data());
  }
}

template <typename T>
void backward_impl(const at::Tensor& qkv, const at::Tensor& omega, int64_t heads, double eps, const at::Tensor& kvz,
                   const at::Tensor& shift_q, const at::Tensor& shift_k, const at::Tensor& den, const at::Tensor& grad,
                   const at::Tensor& dots, at::Tensor& grad_qkv) {
  const Dims s = dims_of(qkv, omega, heads);
  const Features<T> f(omega, s);
  const T floor = static_cast<T>(eps);
  const T *x_all = qkv.data_ptr<T>(), *kvz_all = kvz.data_ptr<T>(), *g_all = grad.data_ptr<T>(),
          *d_all = dots.numel() ? dots.data_ptr<T>() : nullptr, *sq_all = shift_q.data_ptr<T>(),
          *sk_all = shift_k.data_ptr<T>(), *den_all = den.data_ptr<T>();
  T* gx_all = grad_qkv.data_ptr<T>();
  at::parallel_for(0, s.B * s.h, 1, [&](int64_t begin, int64_t end) {
    Work<T> w(s);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.h, hd = bh % s.h;
      const T* kvz_h = kvz_all + bh * s.m * (s.d + 1);
      for (int64_t r = 0; r < s.m; ++r) {
        std::copy_n(kvz_h + r * (s.d + 1), s.d, &w.kv[r * s.dp]);
        w.z[r] = kvz_h[r * (s.d + 1) + s.d];
      }
      transpose<T>(s, w.kv.data(), w.kvt.data());
      std::fill(w.gkv.begin(), w.gkv.end(), T(0));
      std::fill(w.gz.begin(), w.gz.end(), T(0));
      query_grads<T>(s, f, x_all, g_all, d_all ? d_all + bh * s.N : nullptr, sq_all + bh * s.N, den_all + bh * s.N, floor, b, hd, gx_all, w);
      transpose<T>(s, w.gkv.data(), w.gkvt.data());
      key_grads<T>(s, f, x_all, sk_all + bh * s.N, b, hd, gx_all, w);
    }
  });
}

void check(const at::Tensor& qkv, const at::Tensor& omega, int64_t heads) {
  TORCH_CHECK(qkv.device().is_cpu() && qkv.dim() == 3 && qkv.is_contiguous() && qkv.size(2) % (3 * heads) == 0,
              "feature attention kernel: qkv must be a contiguous CPU tensor [B, N, 3 h d]");
  TORCH_CHECK(omega.dim() == 2 && omega.is_contiguous() && omega.scalar_type() == qkv.scalar_type() &&
              omega.size(1) == qkv.size(2) / 3 / heads, "feature attention kernel: omega must be contiguous [m, d] ",
              "in qkv's dtype");
}

void check_state(const at::Tensor& t, const at::Tensor& qkv) {
  TORCH_CHECK(t.is_contiguous() && t.scalar_type() == qkv.scalar_type(), "feature attention kernel: saved tensors ",
              "and gradients must be contiguous, in qkv's dtype");
}

}  // namespace

// Returns out[B, N, h d], kvz[B, h, m, d + 1] = [φ(K)ᵀV | φ(K)ᵀ1], the shifts of queries and keys [B, h, N, 1]
// (log2 units) and the normalisers φ(Q)(φ(K)ᵀ1) [B, h, N, 1] before the floor eps.
std::vector<at::Tensor> exp_forward(const at::Tensor& qkv, const at::Tensor& omega, int64_t heads, double eps) {
  check(qkv, omega, heads);
  const int64_t B = qkv.size(0), N = qkv.size(1), d = qkv.size(2) / 3 / heads;
  auto out = at::empty({B, N, heads * d}, qkv.options());
  auto kvz = at::empty({B, heads, omega.size(0), d + 1}, qkv.options());
  auto shift_q = at::empty({B, heads, N, 1}, qkv.options()), shift_k = at::empty({B, heads, N, 1}, qkv.options());
  auto den = at::empty({B, heads, N, 1}, qkv.options());
  AT_DISPATCH_FLOATING_TYPES(qkv.scalar_type(), "exp_forward", [&] {
    forward_impl<scalar_t>(qkv, omega, heads, eps, out, kvz, shift_q, shift_k, den);
  });
  return {out, kvz, shift_q, shift_k, den};
}

// Returns ∂L/∂qkv [B, N, 3 h d] from grad = ∂L/∂out [B, N, h d] and what exp_forward returned; dots = g·out
// [B, h, N, 1] from the output forward returned, or empty (then φ(Q)(φ(K)ᵀV) is recomputed for it).
at::Tensor exp_backward(const at::Tensor& qkv, const at::Tensor& omega, int64_t heads, double eps,
                        const at::Tensor& kvz, const at::Tensor& shift_q, const at::Tensor& shift_k,
                        const at::Tensor& den, const at::Tensor& grad, const at::Tensor& dots) {
  check(qkv, omega, heads);
  for (const auto& t : {kvz, shift_q, shift_k, den, grad}) check_state(t, qkv);
  if (dots.numel()) check_state(dots, qkv);
  auto grad_qkv = at::empty(qkv.sizes(), qkv.options());
  AT_DISPATCH_FLOATING_TYPES(qkv.scalar_type(), "exp_backward", [&] {
    backward_impl<scalar_t>(qkv, omega, heads, eps, kvz, shift_q, shift_k, den, grad, dots, grad_qkv);
  });
  return grad_qkv;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("exp_forward", &exp_forward, "FAVOR+ kernel attention forward: (out, kvz, shift_q, shift_k, den)");
  m.def("exp_backward", &exp_backward, "FAVOR+ kernel attention backward: grad_qkv");
}
