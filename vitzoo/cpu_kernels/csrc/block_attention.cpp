// Fused block-sparse attention for the CPU: the kernel of vitzoo.attention.sparse.gather.block_attention.
//
// Paper: Dao et al., "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness",
// NeurIPS 2022, https://arxiv.org/abs/2205.14135 (backward from the saved log-sum-exp; scores never stored).
//
// n blocks of S queries; block i's queries are q[b, h, q_ids[i]] and its keys/values the G global ones
// followed by k[b, h, k_ids[h or 0, i]]. One task per (image, head) owns that head's gradient rows, so tasks
// never write the same memory. Per block a task copies the block's rows into small buffers (in cache) and runs
// register-blocked products on them: no gathered [B, h, n, K, d] copy, no per-block Python. Scores are kept
// transposed, [keys, queries], so the softmax runs across the query lanes of a vector and the key rows are
// copied without a transpose. Probabilities use exp2 (log2 units: the scale times log2(e) is folded into the
// queries) and the log-sum-exp is saved in log2 units.
//
// Layout of the padded buffers: Kp = keys rounded up to 4, Sp = queries rounded up to 16, dp = head dim rounded
// up to two vectors. The mask comes in that layout too, keep[mask heads, n, Kp, Sp] (bytes, 0 in the padding),
// from vitzoo.cpu_kernels.block_kernel.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "simd.h"

namespace {
using namespace vitzoo;

template <typename T> struct LaneMask {
  typedef std::conditional_t<sizeof(T) == 4, int32_t, int64_t> type __attribute__((vector_size(32)));
};
template <typename T> struct ByteLanes { typedef uint8_t type __attribute__((vector_size(32 / sizeof(T)))); };

// W bytes of a keep row as a lane mask (all ones where kept).
template <typename T> inline typename LaneMask<T>::type kept(const uint8_t* m) {
  typename ByteLanes<T>::type b;
  std::memcpy(&b, m, sizeof(b));
  return __builtin_convertvector(b, typename LaneMask<T>::type) != 0;
}

struct Dims {
  int64_t B, c, d, n, S, K, G, Kn, Kp, Sp, dp, id_heads, mask_heads;
};

// One (image, head)'s rows of a [B, c, L, d] tensor (last dim contiguous).
template <typename T> struct Rows {
  const T* base;
  int64_t step;
  const T* operator[](int64_t l) const { return base + l * step; }
};
template <typename T> Rows<T> rows_of(const at::Tensor& t, int64_t b, int64_t h) {
  return {t.data_ptr<T>() + b * t.stride(0) + h * t.stride(1), t.stride(2)};
}

// The rows of one (image, head): queries, keys, values and the global keys/values.
template <typename T> struct Head {
  Rows<T> q, k, v, kg, vg;
  Head(const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_, const at::Tensor& kg_, const at::Tensor& vg_,
       int64_t b, int64_t h)
      : q(rows_of<T>(q_, b, h)), k(rows_of<T>(k_, b, h)), v(rows_of<T>(v_, b, h)), kg(rows_of<T>(kg_, b, h)),
        vg(rows_of<T>(vg_, b, h)) {}
};

// The small per-task buffers of one block (row-major unless named transposed).
template <typename T> struct Block {
  std::vector<T> q, qt, k, v, o, ot, st, dst, acc, dk, dv;
  explicit Block(const Dims& s)
      : q(s.Sp * s.dp), qt(s.dp * s.Sp), k(s.Kp * s.dp), v(s.Kp * s.dp), o(s.Sp * s.dp), ot(s.dp * s.Sp),
        st(s.Kp * s.Sp), dst(s.Kp * s.Sp), acc(s.Sp * s.dp), dk(s.Kp * s.dp), dv(s.Kp * s.dp) {}
};

// Copies block i's query rows (q, and qt = qᵀ times scale2) and key/value rows of one (image, head).
template <typename T>
void load_block(const Dims& s, const Head<T>& head, const int64_t* q_ids, const int64_t* k_ids, T scale2,
                Block<T>& blk) {
  for (int64_t r = 0; r < s.S; ++r) {
    const T* row = head.q[q_ids[r]];
    std::memcpy(&blk.q[r * s.dp], row, s.d * sizeof(T));
    for (int64_t e = 0; e < s.d; ++e) blk.qt[e * s.Sp + r] = row[e] * scale2;
  }
  for (int64_t j = 0; j < s.Kn; ++j) {
    std::memcpy(&blk.k[j * s.dp], j < s.G ? head.kg[j] : head.k[k_ids[j - s.G]], s.d * sizeof(T));
    std::memcpy(&blk.v[j * s.dp], j < s.G ? head.vg[j] : head.v[k_ids[j - s.G]], s.d * sizeof(T));
  }
}

// Transposed scores st[Kp, Sp] = K (Q scale2)ᵀ, in log2 units.
template <typename T> void scores(const Dims& s, Block<T>& blk) {
  gemm<T>(s.Kp, s.Sp, s.d, blk.k.data(), s.dp, 1, blk.qt.data(), s.Sp, blk.st.data(), s.Sp);
}

Dims dims_of(const at::Tensor& q, const at::Tensor& kg, const at::Tensor& q_ids, const at::Tensor& k_ids,
             const at::Tensor& keep) {
  Dims s;
  s.B = q.size(0), s.c = q.size(1), s.d = q.size(3), s.n = q_ids.size(0), s.S = q_ids.size(1);
  s.id_heads = k_ids.size(0), s.K = k_ids.size(2), s.G = kg.size(2), s.Kn = s.G + s.K;
  s.Kp = round_up(s.Kn, 4), s.Sp = round_up(s.S, 16), s.dp = round_up(s.d, 16);
  s.mask_heads = keep.size(0);
  TORCH_CHECK(keep.size(1) == s.n && keep.size(2) == s.Kp && keep.size(3) == s.Sp, "block_attention: keep is not ",
              "[heads, ", s.n, ", ", s.Kp, ", ", s.Sp, "]");
  return s;
}

template <typename T>
void forward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kg,
                  const at::Tensor& vg, const at::Tensor& q_ids, const at::Tensor& k_ids, const at::Tensor& keep,
                  double scale, at::Tensor& out, at::Tensor& lse) {
  constexpr int W = lanes<T>();
  const Dims s = dims_of(q, kg, q_ids, k_ids, keep);
  const int64_t *qi = q_ids.data_ptr<int64_t>(), *ki = k_ids.data_ptr<int64_t>();
  const uint8_t* mk = keep.data_ptr<uint8_t>();
  const T scale2 = static_cast<T>(scale * M_LOG2E);
  T *o_all = out.data_ptr<T>(), *l_all = lse.data_ptr<T>();
  at::parallel_for(0, s.B * s.c, 1, [&](int64_t begin, int64_t end) {
    Block<T> blk(s);
    std::vector<T> mx(s.Sp), inv(s.Sp);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.c, h = bh % s.c;
      const Head<T> head(q, k, v, kg, vg, b, h);
      for (int64_t i = 0; i < s.n; ++i) {
        load_block<T>(s, head, qi + i * s.S, ki + ((s.id_heads > 1 ? h : 0) * s.n + i) * s.K, scale2, blk);
        scores<T>(s, blk);
        const uint8_t* m = mk + ((s.mask_heads > 1 ? h : 0) * s.n + i) * s.Kp * s.Sp;  // keep[Kp, Sp]
        for (int64_t r = 0; r < s.Sp; r += W) {  // W queries at a time: max, then 2^(x - max) and the sum
          vec<T> top = splat<T>(-INFINITY), sum = {};
          for (int64_t j = 0; j < s.Kn; ++j) {
            const vec<T> x = load<T>(&blk.st[j * s.Sp + r]);
            top = (kept<T>(m + j * s.Sp + r) & (x > top)) ? x : top;
          }
          for (int64_t j = 0; j < s.Kp; ++j) {
            T* p = &blk.st[j * s.Sp + r];
            // <= 0 where kept; clamped elsewhere (padding lanes: top = -inf). NaN is kept: a NaN score (a NaN query,
            // key or weight) gives a NaN probability, as the PyTorch path's softmax does, never weight 1.
            const vec<T> x = load<T>(p) - top;
            const vec<T> e = exp2v(x > 0 ? vec<T>{} : x);
            store<T>(p, kept<T>(m + j * s.Sp + r) ? e : vec<T>{});
            sum += load<T>(p);
          }
          store<T>(&mx[r], top);
          store<T>(&inv[r], 1 / sum);
        }
        // O = P V: P(s, j) = st[j, s]
        gemm<T>(s.Sp, s.dp, s.Kp, blk.st.data(), 1, s.Sp, blk.v.data(), s.dp, blk.acc.data(), s.dp);
        T* o = o_all + (bh * s.n + i) * s.S * s.d;
        T* l = l_all + (bh * s.n + i) * s.S;
        for (int64_t r = 0; r < s.S; ++r) {
          for (int64_t e = 0; e < s.d; ++e) o[r * s.d + e] = blk.acc[r * s.dp + e] * inv[r];
          l[r] = mx[r] - std::log2(inv[r]);
        }
      }
    }
  });
}

// Adds rows[j] (j < count) of a [count, dp] buffer to dst rows ids[j] (d elements each).
template <typename T> void add_rows(T* dst, int64_t d, const int64_t* ids, const T* rows, int64_t dp, int64_t count) {
  for (int64_t j = 0; j < count; ++j)
    for (int64_t x = 0; x < d; ++x) dst[ids[j] * d + x] += rows[j * dp + x];
}

template <typename T>
void backward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kg,
                   const at::Tensor& vg, const at::Tensor& q_ids, const at::Tensor& k_ids, const at::Tensor& keep,
                   double scale, const at::Tensor& lse, const at::Tensor& grad, const at::Tensor& rows, at::Tensor& dq,
                   at::Tensor& dk, at::Tensor& dv, at::Tensor& dkg, at::Tensor& dvg) {
  constexpr int W = lanes<T>();
  const Dims s = dims_of(q, kg, q_ids, k_ids, keep);
  const int64_t *qi = q_ids.data_ptr<int64_t>(), *ki = k_ids.data_ptr<int64_t>();
  const uint8_t* mk = keep.data_ptr<uint8_t>();
  const T scale2 = static_cast<T>(scale * M_LOG2E), sc = static_cast<T>(scale);
  const int64_t Lq = dq.size(2), Lk = dk.size(2);
  const int64_t* slot_rows = rows.numel() ? rows.data_ptr<int64_t>() : nullptr;
  const T* l_all = lse.data_ptr<T>();
  T *gq = dq.data_ptr<T>(), *gk = dk.data_ptr<T>(), *gv = dv.data_ptr<T>(), *gkg = dkg.data_ptr<T>(),
    *gvg = dvg.data_ptr<T>();
  at::parallel_for(0, s.B * s.c, 1, [&](int64_t begin, int64_t end) {
    Block<T> blk(s);
    std::vector<T> lr(s.Sp);
    std::vector<int64_t> glob(s.G);  // global rows 0..G-1
    for (int64_t j = 0; j < s.G; ++j) glob[j] = j;
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.c, h = bh % s.c;
      const Head<T> head(q, k, v, kg, vg, b, h);
      const Rows<T> g = rows_of<T>(grad, b, h);
      for (int64_t i = 0; i < s.n; ++i) {
        const int64_t* kid = ki + ((s.id_heads > 1 ? h : 0) * s.n + i) * s.K;
        load_block<T>(s, head, qi + i * s.S, kid, scale2, blk);
        for (int64_t r = 0; r < s.S; ++r) {  // dO of the block [S, d]: output rows, or 0 for slots without one
          const int64_t row = slot_rows ? slot_rows[i * s.S + r] : i * s.S + r;
          for (int64_t e = 0; e < s.d; ++e) blk.o[r * s.dp + e] = blk.ot[e * s.Sp + r] = row < 0 ? T(0) : g[row][e];
        }
        std::copy_n(l_all + (bh * s.n + i) * s.S, s.S, lr.begin());
        scores<T>(s, blk);
        // dPᵀ[Kp, Sp] = V dOᵀ
        gemm<T>(s.Kp, s.Sp, s.d, blk.v.data(), s.dp, 1, blk.ot.data(), s.Sp, blk.dst.data(), s.Sp);
        const uint8_t* m = mk + ((s.mask_heads > 1 ? h : 0) * s.n + i) * s.Kp * s.Sp;
        for (int64_t r = 0; r < s.Sp; r += W) {  // P = 2^(x - lse) (<= 1); dS = P (dP - rowsum(P dP)) scale
          const vec<T> top = load<T>(&lr[r]);
          vec<T> dot = {};
          for (int64_t j = 0; j < s.Kp; ++j) {
            T* p = &blk.st[j * s.Sp + r];
            const vec<T> x = load<T>(p) - top;
            const vec<T> e = exp2v(x > 0 ? vec<T>{} : x);  // NaN stays NaN (see the forward)
            store<T>(p, kept<T>(m + j * s.Sp + r) ? e : vec<T>{});
            dot += load<T>(p) * load<T>(&blk.dst[j * s.Sp + r]);
          }
          for (int64_t j = 0; j < s.Kp; ++j) {
            T* ds = &blk.dst[j * s.Sp + r];
            store<T>(ds, load<T>(&blk.st[j * s.Sp + r]) * (load<T>(ds) - dot) * sc);
          }
        }
        // dQ = dS K, dK = dSᵀ Q, dV = Pᵀ dO (dS(s, j) = dst[j, s], P(s, j) = st[j, s])
        gemm<T>(s.Sp, s.dp, s.Kp, blk.dst.data(), 1, s.Sp, blk.k.data(), s.dp, blk.acc.data(), s.dp);
        gemm<T>(s.Kp, s.dp, s.Sp, blk.dst.data(), s.Sp, 1, blk.q.data(), s.dp, blk.dk.data(), s.dp);
        gemm<T>(s.Kp, s.dp, s.Sp, blk.st.data(), s.Sp, 1, blk.o.data(), s.dp, blk.dv.data(), s.dp);
        add_rows<T>(gq + bh * Lq * s.d, s.d, qi + i * s.S, blk.acc.data(), s.dp, s.S);
        add_rows<T>(gkg + bh * s.G * s.d, s.d, glob.data(), blk.dk.data(), s.dp, s.G);
        add_rows<T>(gvg + bh * s.G * s.d, s.d, glob.data(), blk.dv.data(), s.dp, s.G);
        add_rows<T>(gk + bh * Lk * s.d, s.d, kid, blk.dk.data() + s.G * s.dp, s.dp, s.K);
        add_rows<T>(gv + bh * Lk * s.d, s.d, kid, blk.dv.data() + s.G * s.dp, s.dp, s.K);
      }
    }
  });
}

// Every argument is checked before any memory is read: a bad call is a Python RuntimeError naming the argument.
void check_rows(const at::Tensor& t, const char* name, const at::Tensor& q) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 4, "block_attention kernel: ", name, " must be a 4-d CPU tensor ",
              "[B, c, L, d], got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == q.scalar_type() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble),
              "block_attention kernel: ", name, " must be float32 or float64, in q's dtype; got ", t.scalar_type());
  TORCH_CHECK(t.size(0) == q.size(0) && t.size(1) == q.size(1) && t.size(3) == q.size(3), "block_attention kernel: ",
              name, " must have q's B, c and d ", q.sizes(), "; got ", t.sizes());
  TORCH_CHECK(t.stride(3) == 1 || t.size(3) <= 1, "block_attention kernel: ", name, "'s head dim must be contiguous");
}

void check_ids(const at::Tensor& ids, const char* name, int64_t dims, int64_t limit, int64_t low) {
  TORCH_CHECK(ids.device().is_cpu() && ids.scalar_type() == at::kLong && ids.is_contiguous() && ids.dim() == dims,
              "block_attention kernel: ", name, " must be a contiguous ", dims, "-d int64 CPU tensor; got ",
              ids.scalar_type(), " ", ids.sizes());
  if (ids.numel() == 0) return;
  const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
  TORCH_CHECK(lo >= low && hi < limit, "block_attention kernel: ", name, " must lie in [", low, ", ", limit,
              "); got values from ", lo, " to ", hi);
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kg,
                  const at::Tensor& vg, const at::Tensor& q_ids, const at::Tensor& k_ids, const at::Tensor& keep) {
  check_rows(q, "q", q), check_rows(k, "k", q), check_rows(v, "v", q), check_rows(kg, "k_glob", q);
  check_rows(vg, "v_glob", q);
  TORCH_CHECK(v.size(2) == k.size(2), "block_attention kernel: v must have k's ", k.size(2), " rows; got ", v.size(2));
  TORCH_CHECK(vg.size(2) == kg.size(2), "block_attention kernel: v_glob must have k_glob's ", kg.size(2),
              " rows; got ", vg.size(2));
  check_ids(q_ids, "q_ids", 2, q.size(2), 0);
  check_ids(k_ids, "k_ids", 3, k.size(2), 0);
  TORCH_CHECK((k_ids.size(0) == 1 || k_ids.size(0) == q.size(1)) && k_ids.size(1) == q_ids.size(0),
              "block_attention kernel: k_ids must be [1 or c=", q.size(1), ", n=", q_ids.size(0), ", K]; got ",
              k_ids.sizes());
  TORCH_CHECK(keep.device().is_cpu() && keep.scalar_type() == at::kByte && keep.is_contiguous() && keep.dim() == 4 &&
              (keep.size(0) == 1 || keep.size(0) == q.size(1)),
              "block_attention kernel: keep must be contiguous uint8 [1 or c, n, Kp, Sp]; got ", keep.scalar_type(),
              " ", keep.sizes());
}

void check_backward(const at::Tensor& q, const at::Tensor& q_ids, const at::Tensor& lse, const at::Tensor& grad,
                    const at::Tensor& rows) {
  check_rows(grad, "grad", q);
  const int64_t slots = q_ids.numel();
  TORCH_CHECK(lse.device().is_cpu() && lse.is_contiguous() && lse.scalar_type() == q.scalar_type() &&
              lse.sizes() == at::IntArrayRef({q.size(0), q.size(1), q_ids.size(0), q_ids.size(1)}),
              "block_attention kernel: lse must be contiguous [B, c, n, S] in q's dtype; got ", lse.sizes());
  if (rows.numel() == 0) {
    TORCH_CHECK(slots <= grad.size(2), "block_attention kernel: grad has ", grad.size(2), " rows, fewer than the ",
                slots, " block slots (pass rows)");
    return;
  }
  check_ids(rows, "rows", 1, grad.size(2), -1);
  TORCH_CHECK(rows.numel() == slots, "block_attention kernel: rows must have n * S = ", slots, " entries; got ",
              rows.numel());
}

}  // namespace

// Returns out[B, c, n, S, d] (block order) and lse[B, c, n, S] (log2 units).
std::vector<at::Tensor> block_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& kg, const at::Tensor& vg, const at::Tensor& q_ids,
                                      const at::Tensor& k_ids, const at::Tensor& keep, double scale) {
  check_inputs(q, k, v, kg, vg, q_ids, k_ids, keep);
  auto out = at::empty({q.size(0), q.size(1), q_ids.size(0), q_ids.size(1), q.size(3)}, q.options());
  auto lse = at::empty({q.size(0), q.size(1), q_ids.size(0), q_ids.size(1)}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "block_forward", [&] {
    forward_impl<scalar_t>(q, k, v, kg, vg, q_ids, k_ids, keep, scale, out, lse);
  });
  return {out, lse};
}

// Returns dq, dk, dv (contiguous, shaped as q, k, v), dkg, dvg. grad is dO[B, c, L_out, d] (head dim contiguous);
// rows[n * S] the output row of each block slot (-1: none, zero gradient), or empty: slot i * S + r is row i * S + r.
std::vector<at::Tensor> block_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& kg, const at::Tensor& vg, const at::Tensor& q_ids,
                                       const at::Tensor& k_ids, const at::Tensor& keep, double scale,
                                       const at::Tensor& lse, const at::Tensor& grad, const at::Tensor& rows) {
  check_inputs(q, k, v, kg, vg, q_ids, k_ids, keep);
  check_backward(q, q_ids, lse, grad, rows);
  auto dq = at::zeros(q.sizes(), q.options()), dk = at::zeros(k.sizes(), k.options());
  auto dv = at::zeros(v.sizes(), v.options()), dkg = at::zeros(kg.sizes(), kg.options());
  auto dvg = at::zeros(vg.sizes(), vg.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "block_backward", [&] {
    backward_impl<scalar_t>(q, k, v, kg, vg, q_ids, k_ids, keep, scale, lse, grad, rows, dq, dk, dv, dkg, dvg);
  });
  return {dq, dk, dv, dkg, dvg};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("block_forward", &block_forward, "fused block attention forward: (out, lse)");
  m.def("block_backward", &block_backward, "fused block attention backward: (dq, dk, dv, dkg, dvg)");
}
