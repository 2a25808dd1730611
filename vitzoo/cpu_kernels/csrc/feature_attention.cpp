// Random-feature kernel attention for the CPU: the "exp" (performer's FAVOR+) and "fourier" (rfa) feature maps of
// vitzoo.attention.linear.feature_core.
//
// Papers: Choromanski et al., "Rethinking Attention with Performers", ICLR 2021, https://arxiv.org/abs/2009.14794;
// Peng et al., "Random Feature Attention", ICLR 2021, https://arxiv.org/abs/2103.02143.
//
// out = φ(Q)kv / φ(Q)z per (image, head), with [kv | z] = f·φ(K)ᵀ[V | 1] and f a constant factor (rfa's 1/D).
//   "exp": φ(x) = 2^(w̃x - shift) with w̃ = ω log2(e) / d^¼ (log2 units: exp2 is the fast exponential). A query's
//     shift is the largest w̃x of its row; a key's is ‖x̃‖²/2 (log2 units) plus the largest exponent over all keys
//     of the (image, head). The shifts cancel in the ratio.
//   "fourier": φ(x) = [sin ωx̃, cos ωx̃] of x̃ = s∘x/‖x‖, with one ω [D, d] and one scale s [d] per head.
//
// One task per (image, head) walks its tokens in blocks of TOK: a block's features [TOK, m] are made in cache
// (product, then exp2 or sin/cos) and read there by the products that use them; nothing N×m is stored. The keys'
// largest exponent ("exp") is a running maximum (kv and z are rescaled when it grows, as FlashAttention rescales
// its accumulator), so the keys are read once. Backward recomputes the features. The kernel computes and saves
// what the PyTorch path of _kernel_core computes and saves (out, kvz = [kv | z], the "exp" shifts and the
// normalisers), so either backward takes either forward's results.
//
// Padded buffers: dp = head dim rounded up to two vectors; Dq = rows of ω rounded up to two vectors (the product
// ωx); mp = feature columns (Dq for "exp"; D + Dq for "fourier": sin in [0, D), cos in [D, 2D)). Padding is zero.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "simd.h"

namespace {
using namespace vitzoo;

constexpr int64_t TOK = 64;  // tokens per block: its features and their gradient (2 x 64 KB at m = 256) stay in L2

struct Dims {
  int64_t B, N, h, d, D, m, dp, Dq, mp;  // D rows of ω; m features (D, or 2D for "fourier")
  bool fourier;
};

Dims dims_of(const at::Tensor& qkv, const at::Tensor& omega, int64_t heads, bool fourier) {
  Dims s;
  s.B = qkv.size(0), s.N = qkv.size(1), s.h = heads, s.d = qkv.size(2) / 3 / heads, s.D = omega.size(-2);
  s.fourier = fourier, s.m = fourier ? 2 * s.D : s.D;
  s.dp = round_up(s.d, 16), s.Dq = round_up(s.D, 16), s.mp = fourier ? round_up(s.D + s.Dq, 16) : s.Dq;
  return s;
}

// The small per-task buffers (row-major; padding columns stay zero).
template <typename T> struct Work {
  std::vector<T> x, u, xs, v, g, acc, proj, phi, gphi, kv, kvt, z, gkv, gkvt, gz, gs, top, half, aux, norm;
  explicit Work(const Dims& s)
      : x(TOK * s.dp), u(TOK * s.dp), xs(TOK * s.dp), v(TOK * s.dp), g(TOK * s.dp), acc(TOK * s.dp),
        proj(TOK * s.Dq), phi(TOK * s.mp), gphi(TOK * s.mp), kv(s.mp * s.dp), kvt(s.dp * s.mp), z(s.mp),
        gkv(s.mp * s.dp), gkvt(s.dp * s.mp), gz(s.mp), gs(s.dp), top(TOK), half(TOK), aux(TOK), norm(TOK) {}
};

// One head's random features as the products take them: wt [d, Dq] for the product (w̃ᵀ in log2 units for "exp",
// ωᵀ for "fourier") and wc [Dq, dp] for the input gradients (c·ω, c = 1/d^¼ for "exp", ω for "fourier").
template <typename T> struct Features {
  std::vector<T> wt, wc;
  T c;
  Features(const T* w, const Dims& s)
      : wt(s.d * s.Dq), wc(s.Dq * s.dp), c(s.fourier ? T(1) : std::pow(T(s.d), T(-0.25))) {
    const T units = s.fourier ? T(1) : T(M_LOG2E);
    for (int64_t r = 0; r < s.D; ++r)
      for (int64_t e = 0; e < s.d; ++e) {
        wt[e * s.Dq + r] = w[r * s.d + e] * c * units;
        wc[r * s.dp + e] = w[r * s.d + e] * c;
      }
  }
};

// What every task of one call reads: sizes, the features of each head (one, shared, for "exp"), the scale s
// [h, d] ("fourier"), the normaliser's floor and the factor.
template <typename T> struct Call {
  Dims s;
  std::vector<Features<T>> feats;
  const T* scale;
  T floor, factor;
  Call(const at::Tensor& qkv, const at::Tensor& omega, const at::Tensor& scale_, int64_t heads, double eps,
       double factor_, bool fourier)
      : s(dims_of(qkv, omega, heads, fourier)), scale(scale_.numel() ? scale_.data_ptr<T>() : nullptr),
        floor(static_cast<T>(eps)), factor(static_cast<T>(factor_)) {
    const int64_t count = omega.dim() == 3 ? omega.size(0) : 1;
    for (int64_t i = 0; i < count; ++i) feats.emplace_back(omega.data_ptr<T>() + i * s.D * s.d, s);
  }
  const Features<T>& f(int64_t hd) const { return feats[feats.size() > 1 ? hd : 0]; }
  const T* s_of(int64_t hd) const { return scale + hd * s.d; }
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

template <typename T> T dot(const T* a, const T* b, int64_t len) {
  constexpr int W = lanes<T>();
  vec<T> sum = {};
  for (int64_t r = 0; r < len; r += W) sum += load<T>(a + r) * load<T>(b + r);
  return hsum<T>(sum);
}

// The largest of the m exponents of an "exp" row.
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

// "exp": phi[t] = 2^(phi[t] - shift[t]) for t < n (exponents <= 0 up to rounding), 0 in the padding columns.
template <typename T> void exp_rows(const Dims& s, T* phi, int64_t n, const T* shift) {
  constexpr int W = lanes<T>();
  for (int64_t t = 0; t < n; ++t) {
    T* row = phi + t * s.mp;
    const vec<T> sh = splat<T>(shift[t]);
    for (int64_t r = 0; r < s.mp; r += W) {
      const vec<T> x = load<T>(row + r) - sh;
      store<T>(row + r, exp2v(x > 0 ? vec<T>{} : x));  // NaN stays NaN: a NaN exponent is never weight 1
    }
    std::fill(row + s.m, row + s.mp, T(0));
  }
}

// "fourier" input: w.norm = max(‖x‖, 1e-12), w.u = x/‖x‖ and w.xs = s∘u for the n rows of w.x (as F.normalize).
template <typename T> void normalise_rows(const Dims& s, const T* scale, Work<T>& w, int64_t n) {
  for (int64_t t = 0; t < n; ++t) {
    const T* x = &w.x[t * s.dp];
    w.norm[t] = std::max(std::sqrt(dot<T>(x, x, s.dp)), T(1e-12));
    for (int64_t e = 0; e < s.d; ++e) {
      w.u[t * s.dp + e] = x[e] / w.norm[t];
      w.xs[t * s.dp + e] = w.u[t * s.dp + e] * scale[e];
    }
  }
}

// "fourier": phi[t] = [sin p | cos p] of p = w.proj[t] (w.proj is left holding cos p), 0 in the padding columns.
// The sines go first: their last vector may spill past D, where the cosines then land.
template <typename T> void sincos_rows(const Dims& s, Work<T>& w, int64_t n) {
  constexpr int W = lanes<T>();
  for (int64_t t = 0; t < n; ++t) {
    T *p = &w.proj[t * s.Dq], *row = &w.phi[t * s.mp];
    for (int64_t r = 0; r < s.Dq; r += W) {
      vec<T> sn, cs;
      sincosv(load<T>(p + r), sn, cs);
      store<T>(row + r, sn);
      store<T>(p + r, cs);
    }
    for (int64_t r = 0; r < s.Dq; r += W) store<T>(row + s.D + r, load<T>(p + r));
    std::fill(row + s.m, row + s.mp, T(0));
  }
}

// w.phi[n, mp] = φ of the n rows in w.x: the "fourier" features, or the "exp" ones with the given shifts (top:
// each query row's largest exponent, written to shift).
template <typename T>
void features(const Call<T>& c, int64_t hd, Work<T>& w, int64_t n, T* shift, bool top) {
  const Dims& s = c.s;
  const Features<T>& f = c.f(hd);
  if (s.fourier) {
    normalise_rows<T>(s, c.s_of(hd), w, n);
    gemm<T>(n, s.Dq, s.d, w.xs.data(), s.dp, 1, f.wt.data(), s.Dq, w.proj.data(), s.Dq);  // ωx̃ [n, Dq]
    sincos_rows<T>(s, w, n);
    return;
  }
  gemm<T>(n, s.Dq, s.d, w.x.data(), s.dp, 1, f.wt.data(), s.Dq, w.phi.data(), s.mp);  // w̃x [n, mp]
  if (top)
    for (int64_t t = 0; t < n; ++t) shift[t] = row_max<T>(s, &w.phi[t * s.mp]);
  exp_rows<T>(s, w.phi.data(), n, shift);
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

// kT[dp, mp] = k[mp, dp]ᵀ.
template <typename T> void transpose(const Dims& s, const T* k, T* kt) {
  for (int64_t r = 0; r < s.mp; ++r)
    for (int64_t e = 0; e < s.dp; ++e) kt[e * s.mp + r] = k[r * s.dp + e];
}

// Keys and values of one (image, head): w.kv = f·φ(K)ᵀV [mp, dp], w.z = f·φ(K)ᵀ1 and the "exp" keys' shifts.
template <typename T>
void key_sums(const Call<T>& c, const T* qkv, int64_t b, int64_t hd, T* shift, Work<T>& w) {
  const Dims& s = c.s;
  const T hs = T(0.5 * M_LOG2E) * c.f(hd).c * c.f(hd).c;  // "exp": ‖x‖² -> ‖x̃‖²/2 in log2 units
  T top = -std::numeric_limits<T>::infinity();  // "exp": largest exponent so far; the sums are relative to it
  std::fill(w.kv.begin(), w.kv.end(), T(0));
  std::fill(w.z.begin(), w.z.end(), T(0));
  for (int64_t t0 = 0; t0 < s.N; t0 += TOK) {
    const int64_t n = std::min(TOK, s.N - t0);
    load_rows<T>(s, qkv, 3, 1, b, hd, t0, n, w.x.data());
    load_rows<T>(s, qkv, 3, 2, b, hd, t0, n, w.v.data());
    if (!s.fourier) {
      const Features<T>& f = c.f(hd);
      gemm<T>(n, s.Dq, s.d, w.x.data(), s.dp, 1, f.wt.data(), s.Dq, w.phi.data(), s.mp);  // w̃x
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
    } else {
      features<T>(c, hd, w, n, nullptr, false);
    }
    gemm<T>(s.mp, s.dp, n, w.phi.data(), 1, s.mp, w.v.data(), s.dp, w.kv.data(), s.dp, true);  // += φᵀV
    add_columns<T>(s, w.phi.data(), n, nullptr, w.z.data());  // += φᵀ1
  }
  if (!s.fourier)
    for (int64_t t = 0; t < s.N; ++t) shift[t] += top;
  for (auto& x : w.kv) x *= c.factor;
  for (auto& x : w.z) x *= c.factor;
}

template <typename T>
void forward_impl(const Call<T>& c, const at::Tensor& qkv, at::Tensor& out, at::Tensor& kvz, at::Tensor& shift_q,
                  at::Tensor& shift_k, at::Tensor& den) {
  const Dims& s = c.s;
  const T* x_all = qkv.data_ptr<T>();
  T *o_all = out.data_ptr<T>(), *kvz_all = kvz.data_ptr<T>(), *den_all = den.data_ptr<T>();
  T *sq_all = s.fourier ? nullptr : shift_q.data_ptr<T>(), *sk_all = s.fourier ? nullptr : shift_k.data_ptr<T>();
  at::parallel_for(0, s.B * s.h, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      Work<T> w(s);  // fresh per (image, head): rows past a partial chunk never carry another image's values
      const int64_t b = bh / s.h, hd = bh % s.h;
      key_sums<T>(c, x_all, b, hd, sk_all ? sk_all + bh * s.N : nullptr, w);
      T* kvz_h = kvz_all + bh * s.m * (s.d + 1);  // [m, d + 1]: [kv | z]
      for (int64_t r = 0; r < s.m; ++r) {
        std::copy_n(&w.kv[r * s.dp], s.d, kvz_h + r * (s.d + 1));
        kvz_h[r * (s.d + 1) + s.d] = w.z[r];
      }
      for (int64_t t0 = 0; t0 < s.N; t0 += TOK) {  // queries
        const int64_t n = std::min(TOK, s.N - t0);
        T* dn = den_all + bh * s.N + t0;
        load_rows<T>(s, x_all, 3, 0, b, hd, t0, n, w.x.data());
        features<T>(c, hd, w, n, sq_all ? sq_all + bh * s.N + t0 : nullptr, true);
        gemm<T>(n, s.dp, s.mp, w.phi.data(), s.mp, 1, w.kv.data(), s.dp, w.acc.data(), s.dp);  // φ(Q)kv
        for (int64_t t = 0; t < n; ++t) {  // divided (not times a reciprocal): backward's g·out recomputed is the same
          dn[t] = dot<T>(&w.phi[t * s.mp], w.z.data(), s.mp);  // φ(Q)z
          for (int64_t e = 0; e < s.dp; ++e) w.acc[t * s.dp + e] /= std::max(dn[t], c.floor);
        }
        store_rows<T>(s, o_all, 1, 0, b, hd, t0, n, w.acc.data());
      }
    }
  });
}

// w.acc[n, dp] = ∂L/∂x of the n rows in w.x from ∂L/∂φ: w.gphi (its product part) plus coef[t]·add[r] (coef = 1
// where null). "exp": ∂L/∂(w̃x) = ∂L/∂φ ⊙ φ (log2 units cancel), times c·ω; the ‖x̃‖² term is added by the caller.
// "fourier": ∂L/∂(ωx̃) = ∂L/∂sin ⊙ cos - ∂L/∂cos ⊙ sin, times ω, then through x̃ = s∘x/‖x‖ (adding ∂L/∂s to w.gs).
template <typename T>
void input_grads(const Call<T>& c, int64_t hd, Work<T>& w, int64_t n, const T* coef, const T* add) {
  constexpr int W = lanes<T>();
  const Dims& s = c.s;
  for (int64_t t = 0; t < n; ++t) {
    const T k = coef ? coef[t] : T(1);
    T *g = &w.gphi[t * s.mp], *p = &w.phi[t * s.mp];
    for (int64_t r = 0; r < s.mp; r += W) {
      const vec<T> gr = load<T>(g + r) + k * load<T>(add + r);
      store<T>(g + r, s.fourier ? gr : gr * load<T>(p + r));
    }
    if (s.fourier)  // lanes past D are garbage; ω's rows there are zero
      for (int64_t r = 0; r < s.Dq; r += W)
        store<T>(&w.proj[t * s.Dq + r], load<T>(g + r) * load<T>(p + s.D + r) - load<T>(g + s.D + r) * load<T>(p + r));
  }
  const T* gp = s.fourier ? w.proj.data() : w.gphi.data();
  const int64_t ld = s.fourier ? s.Dq : s.mp;
  gemm<T>(n, s.dp, s.Dq, gp, ld, 1, c.f(hd).wc.data(), s.dp, w.acc.data(), s.dp);
  if (!s.fourier) return;
  const T* scale = c.s_of(hd);
  for (int64_t t = 0; t < n; ++t) {  // x̃ = s∘u, u = x/‖x‖: ∂L/∂x = (I - uuᵀ)(s∘∂L/∂x̃)/‖x‖
    T *a = &w.acc[t * s.dp], *u = &w.u[t * s.dp];
    T radial = 0;
    for (int64_t e = 0; e < s.d; ++e) {
      w.gs[e] += a[e] * u[e];
      a[e] *= scale[e];
      radial += a[e] * u[e];
    }
    for (int64_t e = 0; e < s.d; ++e) a[e] = (a[e] - u[e] * radial) / w.norm[t];
  }
}

// ∂L/∂q of one (image, head); adds the queries' share to ∂L/∂kv (w.gkv) and ∂L/∂z (w.gz).
template <typename T>
void query_grads(const Call<T>& c, const T* qkv, const T* grad, const T* dots, T* shift, const T* den, int64_t b,
                 int64_t hd, T* gqkv, Work<T>& w) {
  const Dims& s = c.s;
  const T c2 = c.f(hd).c * c.f(hd).c;
  for (int64_t t0 = 0; t0 < s.N; t0 += TOK) {
    const int64_t n = std::min(TOK, s.N - t0);
    load_rows<T>(s, qkv, 3, 0, b, hd, t0, n, w.x.data());
    features<T>(c, hd, w, n, shift ? shift + t0 : nullptr, false);
    load_rows<T>(s, grad, 1, 0, b, hd, t0, n, w.g.data());
    if (!dots)  // g·out from φ(Q)kv recomputed, divided by the normaliser below
      gemm<T>(n, s.dp, s.mp, w.phi.data(), s.mp, 1, w.kv.data(), s.dp, w.acc.data(), s.dp);
    for (int64_t t = 0; t < n; ++t) {
      const T raw = den[t0 + t], dn = std::max(raw, c.floor);
      const T g_out = dots ? dots[t0 + t] : dot<T>(&w.g[t * s.dp], &w.acc[t * s.dp], s.dp) / dn;  // g·out
      const T g_den = raw >= c.floor ? -g_out / dn : T(0);  // ∂L/∂(φ(q)ᵀz): the floor passes no gradient
      w.aux[t] = g_den;
      w.half[t] = c2 * -(g_out + g_den * raw);  // "exp": c²·∂L/∂(‖x̃‖²/2)
      for (int64_t e = 0; e < s.dp; ++e) w.g[t * s.dp + e] /= dn;  // ∂L/∂(φ(q)ᵀkv) = g/den
    }
    gemm<T>(s.mp, s.dp, n, w.phi.data(), 1, s.mp, w.g.data(), s.dp, w.gkv.data(), s.dp, true);  // += φᵀ ∂L/∂num
    add_columns<T>(s, w.phi.data(), n, w.aux.data(), w.gz.data());  // += φᵀ ∂L/∂den
    gemm<T>(n, s.mp, s.d, w.g.data(), s.dp, 1, w.kvt.data(), s.mp, w.gphi.data(), s.mp);  // ∂L/∂φ = g kvᵀ + g_den zᵀ
    input_grads<T>(c, hd, w, n, w.aux.data(), w.z.data());
    store_rows<T>(s, gqkv, 3, 0, b, hd, t0, n, w.acc.data(), s.fourier ? nullptr : w.half.data(), w.x.data());
  }
}

// ∂L/∂k and ∂L/∂v of one (image, head) from ∂L/∂kv (w.gkv, w.gkvt) and ∂L/∂z (w.gz), both times the factor.
template <typename T>
void key_grads(const Call<T>& c, const T* qkv, T* shift, int64_t b, int64_t hd, T* gqkv, Work<T>& w) {
  const Dims& s = c.s;
  const T c2 = c.f(hd).c * c.f(hd).c;
  for (int64_t t0 = 0; t0 < s.N; t0 += TOK) {
    const int64_t n = std::min(TOK, s.N - t0);
    load_rows<T>(s, qkv, 3, 1, b, hd, t0, n, w.x.data());
    load_rows<T>(s, qkv, 3, 2, b, hd, t0, n, w.v.data());
    features<T>(c, hd, w, n, shift ? shift + t0 : nullptr, false);
    gemm<T>(n, s.dp, s.mp, w.phi.data(), s.mp, 1, w.gkv.data(), s.dp, w.acc.data(), s.dp);  // ∂L/∂V = φ ∂L/∂kv
    store_rows<T>(s, gqkv, 3, 2, b, hd, t0, n, w.acc.data());
    for (int64_t t = 0; t < n && !s.fourier; ++t) {  // "exp": Σ ∂L/∂φ·φ = [v | 1]·(φ [∂L/∂kv | ∂L/∂z])
      const T g_z = dot<T>(&w.phi[t * s.mp], w.gz.data(), s.mp);
      w.half[t] = c2 * -(dot<T>(&w.v[t * s.dp], &w.acc[t * s.dp], s.dp) + g_z);
    }
    gemm<T>(n, s.mp, s.d, w.v.data(), s.dp, 1, w.gkvt.data(), s.mp, w.gphi.data(), s.mp);  // ∂L/∂φ = v ∂L/∂kvᵀ + ∂L/∂z
    input_grads<T>(c, hd, w, n, nullptr, w.gz.data());
    store_rows<T>(s, gqkv, 3, 1, b, hd, t0, n, w.acc.data(), s.fourier ? nullptr : w.half.data(), w.x.data());
  }
}

template <typename T>
void backward_impl(const Call<T>& c, const at::Tensor& qkv, const at::Tensor& kvz, const at::Tensor& shift_q,
                   const at::Tensor& shift_k, const at::Tensor& den, const at::Tensor& grad, const at::Tensor& dots,
                   at::Tensor& grad_qkv, at::Tensor& grad_scale) {
  const Dims& s = c.s;
  const T *x_all = qkv.data_ptr<T>(), *kvz_all = kvz.data_ptr<T>(), *g_all = grad.data_ptr<T>(),
          *d_all = dots.numel() ? dots.data_ptr<T>() : nullptr, *den_all = den.data_ptr<T>();
  T *sq_all = s.fourier ? nullptr : shift_q.data_ptr<T>(), *sk_all = s.fourier ? nullptr : shift_k.data_ptr<T>();
  T *gx_all = grad_qkv.data_ptr<T>(), *gs_all = s.fourier ? grad_scale.data_ptr<T>() : nullptr;
  at::parallel_for(0, s.B * s.h, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      Work<T> w(s);  // fresh per (image, head): rows past a partial chunk never carry another image's values
      const int64_t b = bh / s.h, hd = bh % s.h;
      const T* kvz_h = kvz_all + bh * s.m * (s.d + 1);
      for (int64_t r = 0; r < s.m; ++r) {
        std::copy_n(kvz_h + r * (s.d + 1), s.d, &w.kv[r * s.dp]);
        w.z[r] = kvz_h[r * (s.d + 1) + s.d];
      }
      transpose<T>(s, w.kv.data(), w.kvt.data());
      std::fill(w.gkv.begin(), w.gkv.end(), T(0));
      std::fill(w.gz.begin(), w.gz.end(), T(0));
      std::fill(w.gs.begin(), w.gs.end(), T(0));
      query_grads<T>(c, x_all, g_all, d_all ? d_all + bh * s.N : nullptr, sq_all ? sq_all + bh * s.N : nullptr,
                     den_all + bh * s.N, b, hd, gx_all, w);
      for (auto& x : w.gkv) x *= c.factor;  // kv = f·φ(K)ᵀV
      for (auto& x : w.gz) x *= c.factor;
      transpose<T>(s, w.gkv.data(), w.gkvt.data());
      key_grads<T>(c, x_all, sk_all ? sk_all + bh * s.N : nullptr, b, hd, gx_all, w);
      if (gs_all) std::copy_n(w.gs.data(), s.d, gs_all + bh * s.d);
    }
  });
}

// Every argument is checked before any memory is read: a bad call is a Python RuntimeError naming the argument.
void check(const at::Tensor& qkv, const at::Tensor& omega, const at::Tensor& scale, int64_t heads, bool fourier) {
  TORCH_CHECK(heads > 0, "feature attention kernel: heads must be positive; got ", heads);
  TORCH_CHECK(qkv.device().is_cpu() && qkv.dim() == 3 && qkv.is_contiguous() && qkv.size(2) % (3 * heads) == 0 &&
              qkv.size(2) > 0, "feature attention kernel: qkv must be a contiguous CPU tensor [B, N, 3 h d]; got ",
              qkv.sizes());
  TORCH_CHECK(qkv.scalar_type() == at::kFloat || qkv.scalar_type() == at::kDouble,
              "feature attention kernel: qkv must be float32 or float64; got ", qkv.scalar_type());
  const int64_t d = qkv.size(2) / 3 / heads;
  TORCH_CHECK(omega.device().is_cpu() && omega.is_contiguous() && omega.scalar_type() == qkv.scalar_type() &&
              omega.dim() >= 2 && omega.size(-1) == d && omega.size(-2) > 0 &&
              (fourier ? omega.dim() == 3 && omega.size(0) == heads : omega.dim() == 2),
              "feature attention kernel: omega must be contiguous, in qkv's dtype, [m, d=", d, "] (exp) or [h=", heads,
              ", D, d=", d, "] (fourier); got ", omega.sizes());
  TORCH_CHECK(!fourier || (scale.device().is_cpu() && scale.is_contiguous() &&
              scale.scalar_type() == qkv.scalar_type() && scale.numel() == heads * d),
              "feature attention kernel: the fourier scale must be contiguous [h, 1, d] in qkv's dtype; got ",
              scale.sizes());
}

void check_state(const at::Tensor& t, const char* name, const at::Tensor& qkv, at::IntArrayRef shape) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == qkv.scalar_type(),
              "feature attention kernel: ", name, " must be contiguous, in qkv's dtype");
  TORCH_CHECK(t.sizes() == shape, "feature attention kernel: ", name, " must be ", shape, "; got ", t.sizes());
}

}  // namespace

// Returns out[B, N, h d], kvz[B, h, m, d + 1] = f·φ(K)ᵀ[V | 1], the "exp" shifts of queries and keys [B, h, N, 1]
// (log2 units; empty for "fourier") and the normalisers φ(Q)z [B, h, N, 1] before the floor eps.
std::vector<at::Tensor> feature_forward(const at::Tensor& qkv, const at::Tensor& omega, const at::Tensor& scale,
                                        int64_t heads, double eps, double factor, bool fourier) {
  check(qkv, omega, scale, heads, fourier);
  const int64_t B = qkv.size(0), N = qkv.size(1), d = qkv.size(2) / 3 / heads;
  const int64_t m = omega.size(-2) * (fourier ? 2 : 1);
  auto out = at::empty({B, N, heads * d}, qkv.options());
  auto kvz = at::empty({B, heads, m, d + 1}, qkv.options());
  const auto shift_shape = fourier ? std::vector<int64_t>{0} : std::vector<int64_t>{B, heads, N, 1};
  auto shift_q = at::empty(shift_shape, qkv.options()), shift_k = at::empty(shift_shape, qkv.options());
  auto den = at::empty({B, heads, N, 1}, qkv.options());
  AT_DISPATCH_FLOATING_TYPES(qkv.scalar_type(), "feature_forward", [&] {
    const Call<scalar_t> c(qkv, omega, scale, heads, eps, factor, fourier);
    forward_impl<scalar_t>(c, qkv, out, kvz, shift_q, shift_k, den);
  });
  return {out, kvz, shift_q, shift_k, den};
}

// Returns ∂L/∂qkv [B, N, 3 h d] and, for "fourier", ∂L/∂s per image [B, h, d] (empty for "exp"), from
// grad = ∂L/∂out [B, N, h d] and what feature_forward returned; dots = g·out [B, h, N, 1] from the output forward
// returned, or empty (then φ(Q)kv is recomputed for it).
std::vector<at::Tensor> feature_backward(const at::Tensor& qkv, const at::Tensor& omega, const at::Tensor& scale,
                                         int64_t heads, double eps, double factor, bool fourier, const at::Tensor& kvz,
                                         const at::Tensor& shift_q, const at::Tensor& shift_k, const at::Tensor& den,
                                         const at::Tensor& grad, const at::Tensor& dots) {
  check(qkv, omega, scale, heads, fourier);
  const int64_t B = qkv.size(0), N = qkv.size(1), d = qkv.size(2) / 3 / heads;
  const int64_t m = omega.size(-2) * (fourier ? 2 : 1);
  const std::vector<int64_t> rows{B, heads, N, 1}, none{0};
  check_state(kvz, "kvz", qkv, {B, heads, m, d + 1});
  check_state(shift_q, "shift_q", qkv, fourier ? none : rows);
  check_state(shift_k, "shift_k", qkv, fourier ? none : rows);
  check_state(den, "den", qkv, rows);
  check_state(grad, "grad", qkv, {B, N, heads * d});
  if (dots.numel()) check_state(dots, "dots", qkv, rows);
  auto grad_qkv = at::empty(qkv.sizes(), qkv.options());
  auto grad_scale = at::empty(fourier ? std::vector<int64_t>{qkv.size(0), heads, qkv.size(2) / 3 / heads}
                                      : std::vector<int64_t>{0}, qkv.options());
  AT_DISPATCH_FLOATING_TYPES(qkv.scalar_type(), "feature_backward", [&] {
    const Call<scalar_t> c(qkv, omega, scale, heads, eps, factor, fourier);
    backward_impl<scalar_t>(c, qkv, kvz, shift_q, shift_k, den, grad, dots, grad_qkv, grad_scale);
  });
  return {grad_qkv, grad_scale};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("feature_forward", &feature_forward, "random-feature attention forward: (out, kvz, shift_q, shift_k, den)");
  m.def("feature_backward", &feature_backward, "random-feature attention backward: (grad_qkv, grad_scale)");
}
