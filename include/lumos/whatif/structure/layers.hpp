#pragma once
// Structure facet: the transformer layers of each pass, from module scopes enclosing the
// launches or from a repeating block of kernels with attention in it.

#include <lumos/pipeline/schedule.hpp>
#include <lumos/trace/data.hpp>
#include <lumos/whatif/detail/periodicity.hpp>
#include <lumos/whatif/detail/shapes.hpp>
#include <lumos/whatif/structure/classify.hpp>
#include <lumos/whatif/structure/inputs.hpp>
#include <lumos/whatif/structure/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace lumos::whatif {

namespace detail {

/// The layers of one rank's passes, read from its launches (whose `layer` it sets).
struct layer_reader {
  const trace::rank_trace& t;
  std::vector<launch_rec>& launches;
  const structure_options& options;

  /// The launches of `idx` that can repeat per layer: communication on another stream than the
  /// pass's compute (data-parallel gradient buckets launched between layers, ZeRO prefetches)
  /// is left out, or it would break the period of the layers it sits between.
  [[nodiscard]] std::vector<std::size_t> periodic(const std::vector<std::size_t>& idx) const {
    std::map<std::int64_t, std::size_t> compute_streams;
    for (const std::size_t li : idx) {
      if (!launches[li].comm) ++compute_streams[t.events[launches[li].op].stream];
    }
    std::int64_t main_stream = -1;
    std::size_t most = 0;
    for (const auto& [st, n] : compute_streams) {
      if (n > most) most = n, main_stream = st;
    }
    std::vector<std::size_t> kept;
    kept.reserve(idx.size());
    for (const std::size_t li : idx) {
      if (launches[li].comm && most > 0 && t.events[launches[li].op].stream != main_stream) continue;
      kept.push_back(li);
    }
    return kept;
  }

  /// The block of `ids`' kernel names repeated back to back (`times` times when not 0).
  [[nodiscard]] periodic_run period_of(const std::vector<std::size_t>& ids, std::size_t times) const {
    std::vector<std::uint32_t> seq;
    seq.reserve(ids.size());
    for (const std::size_t li : ids) seq.push_back(t.events[launches[li].op].name);
    return find_period(seq, options.min_period, std::min(options.max_period, seq.size() / 2), times);
  }

  /// Whether one copy of `run` over `ids` has an attention kernel or a GEMM shaped as attention.
  [[nodiscard]] bool has_attention(const std::vector<std::size_t>& ids, const periodic_run& run) const {
    bool attention = false;
    for (std::size_t k = run.start; run.found() && k < run.start + run.period; ++k) {
      const auto& l = launches[ids[k]];
      attention = attention || is_attention_kernel(t.name(t.events[l.op]));
      if (l.shape_op != no_event) {
        const auto gs = gemm_of(t.name(t.events[l.shape_op]), parse_dims(t.arg_text(l.shape_op, trace::arg_key::input_dims)));
        attention = attention || (gs && (gs->kind == gemm_shape::role::attention ||
                                         (gs->kind == gemm_shape::role::batched && gs->m == gs->n)));
      }
    }
    return attention;
  }

  /// Layers of a forward pass by periodicity: every launch first; then without the
  /// communication on other streams, which can break the period (gradient buckets) but is
  /// per-layer in some traces (a TP all-reduce stream). Returns whether layers were found.
  bool forward_by_period(pass_info& p, const std::vector<std::size_t>& idx) const {
    std::vector<std::size_t> kept = idx;
    auto run = period_of(kept, 0);
    bool attention = has_attention(kept, run);
    if (!(run.found() && attention)) {
      std::vector<std::size_t> alt = periodic(idx);
      const auto alt_run = alt.size() != kept.size() ? period_of(alt, 0) : periodic_run{};
      if (alt_run.found() && has_attention(alt, alt_run)) kept = std::move(alt), run = alt_run, attention = true;
    }
    const std::size_t seq_size = kept.size();
    if (run.found() && attention) {
      for (std::size_t k = run.start; k < run.start + run.covered(); ++k) {
        launches[kept[k]].layer = static_cast<int>((k - run.start) / run.period);
      }
      p.layers.value = static_cast<int>(run.repetitions);
      p.layers.source = "a block of " + std::to_string(run.period) + " GPU ops (with attention) repeated " +
                        std::to_string(run.repetitions) + " times from op " + std::to_string(run.start) + " of " +
                        std::to_string(seq_size) + " in the pass";
      return true;
    }
    p.layers.value = 0;
    p.layers.source = run.found() ? "no layer annotations; the longest repeating block (" + std::to_string(run.period) + " ops × " +
                                        std::to_string(run.repetitions) + ") has no attention op or kernel: no transformer layers"
                                  : "no layer annotations and no repeating block of at least " + std::to_string(options.min_period) +
                                        " GPU ops: no transformer layers";
    return false;
  }

  /// Layers of a forward pass by the layer scopes enclosing its launches, numbered in order of
  /// first appearance. Returns whether any launch had one.
  bool forward_by_scope(pass_info& p, const std::vector<std::size_t>& idx) const {
    std::vector<std::int64_t> scopes;
    for (const std::size_t li : idx) {
      const auto s = launches[li].scope;
      if (s >= 0 && std::find(scopes.begin(), scopes.end(), s) == scopes.end()) scopes.push_back(s);
    }
    if (scopes.empty()) return false;
    for (const std::size_t li : idx) {
      auto& l = launches[li];
      if (l.scope >= 0) l.layer = static_cast<int>(std::find(scopes.begin(), scopes.end(), l.scope) - scopes.begin());
    }
    p.layers.value = static_cast<int>(scopes.size());
    p.layers.source = "'" + std::string(t.name(t.events[static_cast<std::size_t>(scopes.front())])).substr(0, 60) +
                      "' scopes enclosing the launches";
    return true;
  }

  /// The linear GEMM launch `l` runs, when its operator recorded its shapes.
  [[nodiscard]] std::optional<gemm_shape> linear_of(const launch_rec& l) const {
    if (l.shape_op == no_event) return std::nullopt;
    auto gs = gemm_of(t.name(t.events[l.shape_op]), parse_dims(t.arg_text(l.shape_op, trace::arg_key::input_dims)));
    if (!gs || gs->kind != gemm_shape::role::linear) return std::nullopt;
    return gs;
  }

  /// The GEMM dims of launches `idx` (their `layer` is `in_layer` or not), each GEMM's M, K, N.
  [[nodiscard]] std::set<std::int64_t> gemm_dims(const std::vector<std::size_t>& idx, bool in_layer) const {
    std::set<std::int64_t> out;
    for (const std::size_t li : idx) {
      if ((launches[li].layer >= 0) != in_layer) continue;
      if (const auto gs = linear_of(launches[li])) out.insert({gs->m, gs->k, gs->n});
    }
    return out;
  }

  /// The one layer of a backward pass whose forward held one layer (no block repeats): the
  /// launches after the head's backward — the last GEMM with a dim of the forward head's GEMMs that
  /// no GEMM of the layer has (the vocabulary's share) — up to the pass's last GEMM (the layer's
  /// first one, QKV); the embedding's backward follows. `head`: those dims (empty: no head on the
  /// stage). Left undelimited when no GEMM follows the head's.
  void backward_single(pass_info& p, const std::vector<std::size_t>& pass, const std::set<std::int64_t>& head) const {
    const std::vector<std::size_t> idx = periodic(pass);
    std::size_t first = 0, last = idx.size();
    for (std::size_t k = 0; k < idx.size(); ++k) {
      const auto gs = linear_of(launches[idx[k]]);
      if (!gs) continue;
      if (head.count(gs->m) + head.count(gs->k) + head.count(gs->n) > 0) {
        first = k + 1, last = idx.size();
      } else {
        last = k;
      }
    }
    if (last >= idx.size() || last < first) return;
    for (std::size_t k = first; k <= last; ++k) launches[idx[k]].layer = 0;
    p.layers.value = 1;
    p.layers.source = "one layer: the launches after the head's last GEMM over the vocabulary up to the pass's last GEMM";
  }

  /// Layers of a backward pass: a block repeated `layers` times, in reverse layer order, its
  /// start aligned by the durations of the ops.
  void backward(pass_info& p, const std::vector<std::size_t>& pass, std::size_t layers) const {
    std::vector<std::size_t> idx = pass;
    auto run = period_of(idx, layers);
    if (!run.found()) {
      std::vector<std::size_t> alt = periodic(idx);
      const auto alt_run = alt.size() != idx.size() ? period_of(alt, layers) : periodic_run{};
      if (alt_run.found()) idx = std::move(alt), run = alt_run;
    }
    p.layers.flag = "--layers";
    if (!run.found()) {
      p.layers.source = "no block repeated " + std::to_string(layers) + " times in the backward pass: its layers are not delimited";
      return;
    }
    run.start = align_by_duration(run, [&](std::size_t k) { return t.events[launches[idx[k]].op].dur; });
    for (std::size_t k = run.start; k < run.start + run.covered(); ++k) {
      launches[idx[k]].layer = static_cast<int>(layers - 1 - (k - run.start) / run.period);
    }
    p.layers.value = static_cast<int>(layers);
    p.layers.source = "a block of " + std::to_string(run.period) + " GPU ops repeated " + std::to_string(layers) + " times (reverse order)";
  }
};

/// How the layers of the job were found, over all ranks.
struct layer_methods {
  bool by_annotation = false, by_period = false;
  std::string period_example;  ///< the first pass whose layers periodicity found
};

/// The layers of every pass of rank `rs` (its launches in `w`), and its `layers_per_pass`.
inline void rank_layers(const layer_reader& reader, rank_structure& rs, const rank_work& w, layer_methods& methods) {
  std::optional<int> forward_layers;
  for (std::size_t pi = 0; pi < rs.passes.size(); ++pi) {
    auto& p = rs.passes[pi];
    if (p.op.kind != pipeline::op_kind::forward) continue;
    if (reader.forward_by_scope(p, w.pass_launches[pi])) {
      methods.by_annotation = true;
    } else if (reader.forward_by_period(p, w.pass_launches[pi])) {
      methods.by_period = true;
      if (methods.period_example.empty()) methods.period_example = "rank " + std::to_string(rs.rank) + ": " + p.layers.source;
    }
    p.layers.flag = "--layers";
    if (!forward_layers) forward_layers = p.layers.value;
  }
  if (forward_layers) {
    rs.layers_per_pass.value = *forward_layers;
    rs.layers_per_pass.source = std::find_if(rs.passes.begin(), rs.passes.end(), [](const auto& p) {
                                  return p.op.kind == pipeline::op_kind::forward;
                                })->layers.source;
  } else {
    rs.layers_per_pass.source = "no forward pass found in the iteration";
  }
  rs.layers_per_pass.flag = "--layers";
  if (!forward_layers || *forward_layers <= 0) return;
  // One layer repeats in no block: its backward lies between the head's and the embedding's
  // (where every forward pass holds one: a chunk of more is no single layer).
  const bool single = std::all_of(rs.passes.begin(), rs.passes.end(), [](const pass_info& p) {
    return p.op.kind != pipeline::op_kind::forward || p.layers.value == std::optional<int>(1);
  });
  std::set<std::int64_t> head;
  if (single) {
    const auto first = std::find_if(rs.passes.begin(), rs.passes.end(), [](const auto& p) { return p.op.kind == pipeline::op_kind::forward; });
    const auto& fwd = w.pass_launches[static_cast<std::size_t>(first - rs.passes.begin())];
    head = reader.gemm_dims(fwd, false);
    for (const std::int64_t d : reader.gemm_dims(fwd, true)) head.erase(d);
  }
  for (std::size_t pi = 0; pi < rs.passes.size(); ++pi) {
    if (rs.passes[pi].op.kind != pipeline::op_kind::backward) continue;
    reader.backward(rs.passes[pi], w.pass_launches[pi], static_cast<std::size_t>(*forward_layers));
    if (single && !rs.passes[pi].layers.known()) reader.backward_single(rs.passes[pi], w.pass_launches[pi], head);
  }
}

/// The layers of each model chunk of rank `rs`, in chunk order: its first forward pass's (a
/// pipeline layout may give the chunks of a stage unlike counts, and a chunk may hold no layer:
/// the embedding alone). Once the schedule has given the passes their chunks; notes forward
/// passes of one chunk that disagree. Empty when a chunk has no forward pass with a known count.
[[nodiscard]] inline std::vector<int> chunk_layers(const rank_structure& rs, int chunks, std::vector<std::string>& notes) {
  std::vector<std::optional<int>> per(static_cast<std::size_t>(std::max(chunks, 1)));
  bool noted = false;
  for (const auto& p : rs.passes) {
    if (p.op.kind != pipeline::op_kind::forward || !p.layers.value || p.op.chunk < 0 || p.op.chunk >= std::ssize(per)) continue;
    auto& c = per[static_cast<std::size_t>(p.op.chunk)];
    if (c && *c != *p.layers.value && !noted) {
      notes.push_back("rank " + std::to_string(rs.rank) + ": forward passes of chunk " + std::to_string(p.op.chunk) +
                      " disagree on the layer count (" + std::to_string(*c) + " and " + std::to_string(*p.layers.value) + ")");
      noted = true;
    }
    if (!c) c = p.layers.value;
  }
  std::vector<int> out;
  for (const auto& c : per) {
    if (!c) return {};
    out.push_back(*c);
  }
  return out;
}

}  // namespace detail

/// Fills the `layers` of every pass, each rank's `layers_per_pass` and `out.layers_method`,
/// and assigns each launch of `in` in a layer its layer index. A forward pass's layers are the
/// `options.layer_scopes` scopes enclosing its launches, else the repeating block of kernel
/// names (at least `min_period` ops) with attention in it; backward passes then look for the
/// same number of blocks, in reverse order.
/// Runs after `discover_passes`. O(ops per pass × max_period).
inline void discover_layers(discovery_inputs& in, job_structure& out) {
  detail::layer_methods methods;
  for (std::size_t ri = 0; ri < in.rank_count(); ++ri) {
    const detail::layer_reader reader{in.job.ranks[ri], in.ranks[ri].launches, in.options};
    detail::rank_layers(reader, out.ranks[ri], in.ranks[ri], methods);
  }
  out.layers_method.flag = "--layers";
  if (methods.by_annotation) {
    out.layers_method.value = "module annotations";
    out.layers_method.source = "record_function / nn.Module scopes matching";
    for (const auto& s : in.options.layer_scopes) out.layers_method.source += " '" + s + "'";
  } else if (methods.by_period) {
    out.layers_method.value = "kernel periodicity";
    out.layers_method.source = methods.period_example;
  } else {
    out.layers_method.source = "no layer annotations and no repeating block with attention in any forward pass";
  }
}

}  // namespace lumos::whatif
