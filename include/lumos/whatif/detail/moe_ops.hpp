#pragma once
// The MoE ops of a trace's MoE layers that a MoE what-if (whatif/moe.hpp) rescales: the router,
// its routing and permutation ops, the experts' GEMMs (grouped or a loop per expert) and their
// activation, found per rank in launch order from the job's structure, with what each rank's
// experts computed (token copies, experts, rows per expert) and the traced expert FFN width.

#include <lumos/graph/build_options.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/detail/shapes.hpp>
#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/structure/moe.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace lumos::whatif::detail {

/// The MoE ops of the layers a MoE what-if rescales.
enum class moe_op_kind : std::uint8_t { router, route, permute, expert_gemm, expert_act };

struct moe_op {
  graph::task_id task = graph::no_task;
  std::size_t rank = 0;  ///< index into job.ranks
  moe_op_kind kind = moe_op_kind::router;
  std::int64_t rows = 0;  ///< a per-expert GEMM's rows (0: a grouped GEMM or another op)
  /// A grouped GEMM's dims per expert (M x K · K x N) and experts, when recorded; `wgrad`: a
  /// weight gradient (K = rows, an fp32 output), else M = rows.
  double m = 0, n = 0, k = 0, experts = 0;
  bool wgrad = false;
  std::uint32_t owner = ~std::uint32_t{0};  ///< the operator that launched it (`moe_shape_op`)
  int pass = -1, layer = -1, phase = -1;
};

/// What the traces' MoE layers hold per rank: the copies its experts computed (first forward
/// grouped GEMM, or the sum of the first MoE layer's per-expert GEMMs) and its experts.
struct moe_ranks {
  std::vector<double> copies;       ///< per job rank (0: no expert GEMM seen)
  std::vector<std::int64_t> local;  ///< experts of the rank
  /// Per job rank, the rows of each of its experts where a loop's GEMMs tell them (empty: a
  /// grouped GEMM, whose per-expert sizes are not recorded).
  std::vector<std::vector<double>> expert_rows;
  std::vector<std::int64_t> tokens;  ///< per job rank, the rows of its first forward router GEMM (0: none seen)
  std::int64_t width = 0;           ///< the expert FFN width per rank, as traced
  bool grouped = false, loop = false;
};

/// The names that tell what a GPU op of a MoE layer is: its kernel and its innermost operator.
[[nodiscard]] inline std::string moe_names_of(const trace::rank_trace& t, const gpu_op_context& c) {
  std::string s = lower(t.name(t.events[c.op]));
  if (c.shape_op != no_event) s += "|" + lower(t.name(t.events[c.shape_op]));
  if (c.cpu_op != no_event) s += "|" + lower(t.name(t.events[c.cpu_op]));
  return s;
}

/// The operator whose shapes tell op `c`'s: the innermost GEMM operator, else the outermost one.
[[nodiscard]] inline std::uint32_t moe_shape_op(const gpu_op_context& c) noexcept { return c.shape_op != no_event ? c.shape_op : c.cpu_op; }

/// The GEMM dims of op `c` (`moe_shape_op`'s `Input Dims`).
[[nodiscard]] inline std::vector<std::vector<std::int64_t>> moe_dims_of(const trace::rank_trace& t, const gpu_op_context& c) {
  const std::uint32_t op = moe_shape_op(c);
  return op != no_event ? parse_dims(t.arg_text(op, trace::arg_key::input_dims)) : std::vector<std::vector<std::int64_t>>{};
}

/// Whether op `c` is a grouped GEMM over experts (its operator's or its kernel's name).
[[nodiscard]] inline bool moe_grouped(const trace::rank_trace& t, const gpu_op_context& c) {
  const std::uint32_t op = moe_shape_op(c);
  return (op != no_event && is_grouped_gemm_op(t.name(t.events[op]))) || lower(t.name(t.events[c.op])).find("grouped") != std::string::npos;
}

/// The width the traces' experts compute per rank: `n` the N of the first forward grouped GEMM
/// reading the hidden width, else of the first forward GEMM after a router that reads the hidden
/// width for fewer rows than the router saw (an expert of a loop); 0 when none. `fused`: the
/// down projection after it reads half of it (gate and up in one GEMM, Megatron's GroupedMLP):
/// the expert FFN is `n` / 2.
struct expert_width {
  std::int64_t n = 0;
  bool fused = false;
  int inputs = 0;  ///< GEMMs that read the hidden width before the first that writes it (gate and up apart: 2)
  [[nodiscard]] std::int64_t ffn() const noexcept { return fused ? n / 2 : n; }
};

[[nodiscard]] inline expert_width traced_expert_width(const trace::job& job, const job_structure& st, std::int64_t hidden,
                                                      std::int64_t experts) {
  std::int64_t router_rows = 0;
  expert_width out;
  // The first expert GEMM reading the hidden width (`n`), then the first writing it.
  const auto seen = [&](std::int64_t k, std::int64_t n) {
    if (k == hidden) ++out.inputs;
    if (out.n == 0 && k == hidden) {
      out.n = n;
    } else if (out.n > 0 && n == hidden && k != hidden) {
      out.fused = 2 * k == out.n;
      return true;
    }
    return false;
  };
  for (const gpu_op_context& c : st.gpu_ops) {
    if (c.layer < 0 || c.comm || c.phase != phase_kind::forward || moe_shape_op(c) == no_event) continue;
    const trace::rank_trace& t = job.ranks[c.rank];
    const auto dims = moe_dims_of(t, c);
    if (moe_grouped(t, c)) {
      if (const auto g = grouped_dims_of(dims); g && seen(g->k, g->n)) return out;
      continue;
    }
    if (c.shape_op == no_event) continue;
    const auto gs = gemm_of(t.name(t.events[c.shape_op]), dims);
    if (!gs || gs->kind != gemm_shape::role::linear) continue;
    if (gs->k == hidden && gs->n == experts) {
      router_rows = gs->m;
    } else if (router_rows > 0 && gs->m < router_rows && seen(gs->k, gs->n)) {
      return out;
    }
  }
  return out;
}

/// The MoE ops of `st`'s layers (see the header comment), per rank in launch order, and what
/// each rank's experts computed. `hidden`, `experts`, `width`: the traces'.
[[nodiscard]] inline std::vector<moe_op> find_moe_ops(const trace::job& job, const graph::built_job& b, const job_structure& st,
                                                      std::int64_t hidden, std::int64_t experts, std::int64_t width, moe_ranks& ranks) {
  std::vector<moe_op> out;
  ranks.copies.assign(job.ranks.size(), 0.0);
  ranks.local.assign(job.ranks.size(), 0);
  ranks.expert_rows.assign(job.ranks.size(), {});
  ranks.tokens.assign(job.ranks.size(), 0);
  ranks.width = width;
  std::vector<std::int64_t> loop_layer(job.ranks.size(), -1);  // the pass and layer whose per-expert GEMMs were summed
  std::vector<std::int64_t>& tokens = ranks.tokens;
  // The layer pass of the last GEMM with shapes, and whether it was an expert's: an activation
  // after another GEMM of its layer pass is a shared expert's or a dense MLP's.
  std::tuple<std::size_t, int, int> last_gemm{~std::size_t{0}, -1, -1};
  bool last_expert = false;
  // With grouped experts no other GEMM is one expert's (one over as many tokens as the FFN is wide).
  const bool grouped = std::any_of(st.gpu_ops.begin(), st.gpu_ops.end(), [&](const gpu_op_context& c) {
    return c.layer >= 0 && !c.comm && c.rank < job.ranks.size() && moe_grouped(job.ranks[c.rank], c);
  });
  for (const gpu_op_context& c : st.gpu_ops) {
    if (c.layer < 0 || c.comm || c.rank >= b.ranks.size()) continue;
    const auto& map = b.ranks[c.rank].task_of_event;
    if (c.op >= map.size() || map[c.op] == graph::no_task) continue;
    const trace::rank_trace& t = job.ranks[c.rank];
    moe_op m{.task = map[c.op], .rank = c.rank, .owner = moe_shape_op(c), .pass = c.pass, .layer = c.layer, .phase = static_cast<int>(c.phase)};
    const std::string names = moe_names_of(t, c);
    const bool forward = c.phase == phase_kind::forward;
    const auto dims = moe_dims_of(t, c);
    // The GEMM's dims, copied out of the optional (GCC 12 takes its members for uninitialized).
    std::array<std::int64_t, 3> d{0, 0, 0};  // M, K, N
    bool linear = false;
    if (c.shape_op != no_event) {
      if (const auto gs = gemm_of(t.name(t.events[c.shape_op]), dims); gs && gs->kind == gemm_shape::role::linear) {
        d = {gs->m, gs->k, gs->n};
        linear = true;
      }
    }
    const std::tuple<std::size_t, int, int> here{c.rank, c.pass, c.layer};
    const auto gemm_seen = [&](bool expert) { last_gemm = here, last_expert = expert; };
    if (moe_grouped(t, c)) {
      m.kind = moe_op_kind::expert_gemm;
      ranks.grouped = true;
      gemm_seen(true);
      if (const auto g = grouped_dims_of(dims); g && g->experts > 0) {
        if (forward && ranks.copies[c.rank] == 0 && g->k == hidden) {
          ranks.copies[c.rank] = static_cast<double>(g->rows);
          ranks.local[c.rank] = g->experts;
        }
        m.experts = static_cast<double>(g->experts);
        m.m = static_cast<double>(g->rows) / m.experts, m.k = static_cast<double>(g->k), m.n = static_cast<double>(g->n);
        // A weight gradient reads the rows as K (backward only: a forward down projection reads
        // the width, or half a fused gate-and-up width).
        m.wgrad = !forward && g->k != hidden && g->k != width && 2 * g->k != width;
      }
    } else if (linear) {
      const auto has = [&](std::int64_t v) { return std::find(d.begin(), d.end(), v) != d.end(); };
      gemm_seen(false);
      // The router's GEMMs by where its dims sit, not by holding them: with as many tokens as
      // experts every GEMM over the tokens that reads the hidden width holds both. Forward: the
      // hidden width to the experts; data gradient: back; weight gradient: the hidden width and
      // the experts over the tokens (K).
      const bool router = (d[1] == hidden && d[2] == experts) || (d[1] == experts && d[2] == hidden) ||
                          (tokens[c.rank] > 0 && d[1] == tokens[c.rank] &&
                           ((d[0] == hidden && d[2] == experts) || (d[0] == experts && d[2] == hidden)));
      if (experts != hidden && router) {
        m.kind = moe_op_kind::router;
        if (forward && tokens[c.rank] == 0 && d[1] == hidden && d[2] == experts) tokens[c.rank] = d[0];
      } else if (!grouped && width > 0 && width != hidden && has(width) && has(hidden)) {
        // A per-expert GEMM of a loop: rows are M, or K of a weight gradient. One over every
        // token the router saw is a shared expert's (or a dense MLP's), which routing leaves be.
        m.kind = moe_op_kind::expert_gemm;
        m.rows = d[1] != hidden && d[1] != width ? d[1] : d[0];
        if (m.rows == tokens[c.rank]) continue;
        gemm_seen(true);
        ranks.loop = true;
        const std::int64_t key = static_cast<std::int64_t>(c.pass) * 1000000 + c.layer;
        if (forward && d[2] == hidden && (loop_layer[c.rank] < 0 || loop_layer[c.rank] == key)) {
          loop_layer[c.rank] = key;
          ranks.copies[c.rank] += static_cast<double>(d[0]);
          ranks.expert_rows[c.rank].push_back(static_cast<double>(d[0]));
          ++ranks.local[c.rank];
        }
      } else {
        continue;
      }
    } else if (names.find("topk") != std::string::npos || names.find("scatter") != std::string::npos) {
      m.kind = moe_op_kind::route;
    } else if (names.find("index") != std::string::npos) {
      m.kind = moe_op_kind::permute;
    } else if (names.find("silu") != std::string::npos || names.find("gelu") != std::string::npos) {
      if (last_gemm == here && !last_expert) continue;
      m.kind = moe_op_kind::expert_act;
    } else {
      continue;
    }
    out.push_back(m);
  }
  // The ops told by their names alone count in the layers with a router or an expert GEMM: a
  // dense layer's (DeepSeek's first layers) are its own.
  std::set<std::pair<std::size_t, int>> moe_layers;
  for (const moe_op& o : out) {
    if (o.kind == moe_op_kind::router || o.kind == moe_op_kind::expert_gemm) moe_layers.insert({o.rank, o.layer});
  }
  std::erase_if(out, [&](const moe_op& o) {
    return o.kind != moe_op_kind::router && o.kind != moe_op_kind::expert_gemm && moe_layers.count({o.rank, o.layer}) == 0;
  });
  return out;
}

}  // namespace lumos::whatif::detail
