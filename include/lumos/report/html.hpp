#pragma once
// A replay as one self-contained HTML page (`lumos report`): the job summary, measured vs
// simulated iteration per rank, the 4-way breakdown per rank, an SVG timeline of one iteration
// per shown rank (CPU threads and GPU streams as lanes) with the critical path highlighted, the
// pipeline stage × time diagram for pipeline jobs, and the critical path as a table.
//
// Self-contained on purpose: inline CSS and SVG, no script, no network, so that the file can be
// attached to a review or opened offline years later. Large jobs stay light because nothing
// here grows with the rank count beyond one short table row per *group* of identical ranks:
// ranks whose measured/simulated iteration and breakdown agree (to 0.1 % of the job's iteration)
// share a bar; timelines are drawn for a few sampled ranks; within a lane, ops closer than a
// pixel are merged into one rectangle (its tooltip counts them).

#include <lumos/core/time.hpp>
#include <lumos/graph/task_graph.hpp>
#include <lumos/report/critical_path.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/trace/data.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace lumos::report {

/// What `html_report` draws and how much of it.
struct html_options {
  std::string title = "lumos report";
  std::vector<std::string> inputs;      ///< shown in the summary (the command line's paths)
  std::size_t max_timeline_ranks = 8;   ///< ranks with a timeline (the slowest first)
  std::size_t max_lanes = 16;           ///< lanes per timeline (GPU streams first, then busiest threads)
  std::size_t max_rank_rows = 48;       ///< rows of the per-rank bars (groups of identical ranks)
  std::size_t max_pipeline_rows = 16;   ///< stages in the pipeline diagram
  double timeline_width = 1120;         ///< px of the time axis
};

/// Colour classes of timeline rectangles.
enum class lane_class : std::uint8_t { cpu, cpu_wait, compute, memcpy, comm, comm_wait };
inline constexpr std::size_t lane_class_count = 6;

namespace detail::html {

inline void escape(std::string& out, std::string_view s, std::size_t limit = 160) {
  std::size_t n = 0;
  for (const char c : s) {
    if (++n > limit) {
      out += "&#8230;";
      break;
    }
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default:
        // Control bytes cannot appear in HTML text; a trace may still hold them.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t') {
          out += ' ';
        } else {
          out += c;
        }
    }
  }
}

inline std::string esc(std::string_view s, std::size_t limit = 160) {
  std::string out;
  escape(out, s, limit);
  return out;
}

// Format strings are literals at every call site; clang cannot see through the forwarding.
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wformat-security"
#pragma clang diagnostic ignored "-Wformat-nonliteral"
#endif
template <class... T>
void put(std::string& out, const char* fmt, T... xs) {
  char buf[512];
  const int n = std::snprintf(buf, sizeof buf, fmt, xs...);
  if (n > 0) out.append(buf, static_cast<std::size_t>(std::min<int>(n, static_cast<int>(sizeof buf) - 1)));
}
#if defined(__clang__)
#pragma clang diagnostic pop
#endif

inline std::string ms(time_ns t) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3f ms", static_cast<double>(t) / 1e6);
  return buf;
}

inline std::string pct(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * f);
  return buf;
}

/// "0-3, 8, 10-11": a compact list of sorted rank numbers.
inline std::string rank_ranges(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

inline constexpr std::array<const char*, lane_class_count> class_names = {"cpu", "cpu-wait", "compute", "memcpy", "comm", "comm-wait"};
inline constexpr std::array<const char*, lane_class_count> class_labels = {"CPU", "CPU waiting for the GPU", "GPU compute",
                                                                          "memcpy / memset", "communication", "communication waiting for peers"};

/// Writes the rectangles of one lane. Ops at least `min_px` wide are drawn one by one (with a
/// tooltip); narrower ones are binned per pixel and each run of pixels with the same dominant
/// class (by time) becomes one rectangle, so that a lane costs at most about its width in
/// rectangles whatever the number of ops, and a dense mix of, say, compute and tensor-parallel
/// collectives shows the class that holds most of each pixel.
class lane_painter {
 public:
  lane_painter(std::string& out, const graph::task_graph& g, double y, double h, double width, double min_px = 2.0)
      : out_(out), g_(g), y_(y), h_(h), min_px_(min_px), bins_(static_cast<std::size_t>(std::ceil(std::max(width, 1.0))) + 1) {}

  void add(lane_class c, graph::task_id t, double x0, double x1, time_ns begin, time_ns end) {
    if (x1 - x0 >= min_px_) {
      big_.push_back({c, t, x0, x1, begin, end});
      return;
    }
    const auto first = static_cast<std::size_t>(std::max(0.0, std::floor(x0)));
    const auto last = std::min(bins_.size() - 1, static_cast<std::size_t>(std::max(0.0, std::floor(x1))));
    ++bins_[first].count;
    if (bins_[first].task == graph::no_task) bins_[first].task = t;
    for (std::size_t b = first; b <= last; ++b) {
      // At least a sliver per touched pixel, so that zero-length ops still show.
      const double cover = std::min(x1, static_cast<double>(b + 1)) - std::max(x0, static_cast<double>(b));
      bins_[b].time[static_cast<std::size_t>(c)] += std::max(cover, 0.05);
    }
  }

  void finish() {
    std::size_t b = 0;
    while (b < bins_.size()) {
      const int c = dominant(b);
      if (c < 0) {
        ++b;
        continue;
      }
      std::size_t e = b, count = 0;
      graph::task_id first = graph::no_task;
      while (e < bins_.size() && dominant(e) == c) {
        count += bins_[e].count;
        if (first == graph::no_task) first = bins_[e].task;
        ++e;
      }
      const double w = static_cast<double>(e - b);
      put(out_, "<rect class=\"%s\" x=\"%zu\" y=\"%.1f\" width=\"%.0f\" height=\"%.1f\">", class_names[static_cast<std::size_t>(c)], b, y_, w,
          h_);
      if (w >= 3 && first != graph::no_task) {
        out_ += "<title>";
        put(out_, "%zu short ops; first: ", count);
        escape(out_, g_.task_name(first), 100);
        out_ += "</title>";
      }
      out_ += "</rect>";
      ++rects_;
      b = e;
    }
    for (const auto& r : big_) {
      put(out_, "<rect class=\"%s%s\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\"><title>", class_names[static_cast<std::size_t>(r.c)],
          r.x1 - r.x0 >= 4 ? " sep" : "", r.x0, y_, r.x1 - r.x0, h_);
      escape(out_, g_.task_name(r.t), 120);
      out_ += " — " + ms(r.end - r.begin) + "</title></rect>";
      ++rects_;
    }
  }

  [[nodiscard]] std::size_t rects() const noexcept { return rects_; }

 private:
  struct bin {
    std::array<double, lane_class_count> time{};
    std::size_t count = 0;
    graph::task_id task = graph::no_task;
  };
  struct op {
    lane_class c;
    graph::task_id t;
    double x0, x1;
    time_ns begin, end;
  };
  [[nodiscard]] int dominant(std::size_t b) const {
    int best = -1;
    double most = 0;
    for (std::size_t c = 0; c < lane_class_count; ++c) {
      if (bins_[b].time[c] > most) {
        most = bins_[b].time[c];
        best = static_cast<int>(c);
      }
    }
    return best;
  }

  std::string& out_;
  const graph::task_graph& g_;
  double y_, h_, min_px_;
  std::vector<bin> bins_;
  std::vector<op> big_;
  std::size_t rects_ = 0;
};

inline constexpr std::string_view css = R"(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2430;margin:24px auto;max-width:1400px;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde2ea;padding-bottom:4px}
h3{font-size:14px;margin:16px 0 6px}.sub{color:#5b6473}
table{border-collapse:collapse;margin:6px 0}td,th{padding:3px 10px;text-align:left;border-bottom:1px solid #eef0f4;vertical-align:top}
th{font-weight:600;color:#3b4454;background:#f6f8fb}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0}.card{border:1px solid #dde2ea;border-radius:6px;padding:8px 14px;min-width:150px}
.card b{display:block;font-size:20px}.card span{color:#5b6473;font-size:12px}
.legend{display:flex;flex-wrap:wrap;gap:14px;margin:6px 0;font-size:12px;color:#3b4454}.legend i{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-2px;border-radius:2px}
.scroll{overflow-x:auto}svg text{font:12px system-ui,sans-serif;fill:#1d2430}svg .muted{fill:#5b6473}
.cpu{fill:#8c96a5}.cpu-wait{fill:#d5dae2}.compute{fill:#4c78a8}.memcpy{fill:#54a24b}.comm{fill:#f58518}.comm-wait{fill:#fbd0a1}
.measured{fill:#b8c0cc}.simulated{fill:#4c78a8}.b-compute{fill:#4c78a8}.b-overlap{fill:#9d6fbf}.b-comm{fill:#f58518}.b-other{fill:#e3e7ee}
.sep{stroke:#fff;stroke-width:.6}.crit{fill:#d62728}.lane{fill:#f7f8fa}.grid{stroke:#e3e7ee;stroke-width:1}
.pf{fill:#4c78a8}.pb{fill:#72b7b2}.pw{fill:#b279a2}.pbubble{fill:#fff;stroke:#e3e7ee}
code{background:#f3f5f8;padding:0 3px;border-radius:3px}.note{color:#5b6473;font-size:12px}
)";

}  // namespace detail::html

/// Colour class of a task for the timeline: memcpy/memset from the trace category when the
/// task came from a trace, else from the name (model-built ops are named by the model).
[[nodiscard]] inline lane_class classify(const graph::task_graph& g, graph::task_id t, const trace::rank_trace* src) {
  switch (g.kind[t]) {
    case graph::task_kind::cpu: return lane_class::cpu;
    case graph::task_kind::cpu_blocking: return lane_class::cpu_wait;
    case graph::task_kind::gpu_comm:
    case graph::task_kind::comm_complete: return lane_class::comm;
    case graph::task_kind::comm_arrive:
    case graph::task_kind::join: return lane_class::comm_wait;
    case graph::task_kind::gpu_compute: break;
  }
  const std::uint32_t ev = g.source[t];
  if (src != nullptr && ev != ~0U && ev < src->events.size()) {
    const auto c = src->events[ev].cat;
    return c == trace::category::gpu_memcpy || c == trace::category::gpu_memset ? lane_class::memcpy : lane_class::compute;
  }
  const std::string_view n = g.task_name(t);
  return n.find("emcpy") != std::string_view::npos || n.find("emset") != std::string_view::npos ? lane_class::memcpy : lane_class::compute;
}

/// Ranks that look alike in a replay, shown as one row.
struct rank_group {
  std::vector<std::size_t> members;  ///< indices into the session's ranks
  std::vector<int> ranks;            ///< their rank numbers, sorted
};

/// Groups ranks whose measured and simulated iteration and simulated breakdown agree to within
/// `tolerance` (ns). Order: the group holding the slowest simulated rank first, then by rank.
[[nodiscard]] inline std::vector<rank_group> group_ranks(const replay_session& s, time_ns tolerance) {
  const time_ns q = std::max<time_ns>(tolerance, 1);
  auto key = [&](const rank_replay& r) {
    const auto& b = r.simulated.split;
    return std::array<time_ns, 6>{r.measured_ns / q, r.simulated_ns / q, b.exposed_compute / q, b.overlapped / q, b.exposed_comm / q, b.other / q};
  };
  std::map<std::array<time_ns, 6>, std::size_t> index;
  std::vector<rank_group> groups;
  for (std::size_t i = 0; i < s.ranks.size(); ++i) {
    const auto [it, fresh] = index.try_emplace(key(s.ranks[i]), groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].members.push_back(i);
    groups[it->second].ranks.push_back(s.ranks[i].rank);
  }
  for (auto& grp : groups) std::sort(grp.ranks.begin(), grp.ranks.end());
  return groups;
}

/// One block of the pipeline diagram: a run of compute on a stage between two pipeline transfers.
struct pipeline_block {
  char kind = 'F';  ///< 'F' forward, 'B' backward (input gradient or whole), 'W' weight gradient
  int index = 0;    ///< its number among the stage's blocks of that kind
  time_ns begin = 0, end = 0;
};

/// The pipeline blocks of one rank's simulated window. A job is a pipeline job when its ranks
/// exchange point-to-point transfers (`send_recv` collectives, or NCCL SendRecv/Send/Recv
/// kernels). Compute ops on the rank's busiest compute stream are cut into blocks at the arrival
/// of each of the rank's point-to-point transfers; a block is a backward when most of its time
/// comes from ops named as backward (`_bwd`, `backward`, `Backward`, `dgrad`) or launched by
/// another thread than the one running the step (PyTorch's autograd thread), a weight-gradient
/// block when its ops are named `wgrad`. A heuristic for drawing, documented in docs/report.md.
[[nodiscard]] inline std::vector<pipeline_block> pipeline_blocks(const graph::task_graph& g, const replay_session& s, std::size_t i,
                                                                 const std::vector<std::uint8_t>& is_p2p,
                                                                 const std::vector<graph::processor_id>& launcher) {
  const rank_replay& r = s.ranks[i];
  const iteration_plan& plan = s.plans[i];
  const task_times t = s.simulated_times();
  const interval w = r.simulated.window;
  // The busiest compute stream, and the thread that runs the step.
  std::map<graph::processor_id, time_ns> busy;
  for (const auto id : plan.compute) busy[g.processor[id]] += t.end_of(id) - t.begin_of(id);
  if (busy.empty()) return {};
  const graph::processor_id stream =
      std::max_element(busy.begin(), busy.end(), [](const auto& a, const auto& b) { return a.second < b.second; })->first;
  const graph::processor_id main_thread = plan.first_cpu != graph::no_task ? g.processor[plan.first_cpu] : ~graph::processor_id{0};
  std::vector<time_ns> cuts;
  for (const auto& [a, c] : plan.comm) {
    if (is_p2p[c]) cuts.push_back(t.begin_of(a));
  }
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::pair<time_ns, graph::task_id>> ops;
  for (const auto id : plan.compute) {
    if (g.processor[id] == stream && t.end_of(id) > w.begin && t.begin_of(id) < w.end) ops.push_back({t.begin_of(id), id});
  }
  std::sort(ops.begin(), ops.end());
  std::vector<pipeline_block> blocks;
  std::array<time_ns, 3> weight{};  // F, B, W time of the open block
  std::array<int, 3> counts{};
  std::size_t cut = 0;
  bool open = false;
  bool open_backward = false;
  pipeline_block cur;
  auto close = [&] {
    if (!open) return;
    // A weight-gradient block holds nothing but weight-gradient ops (zero-bubble's W passes);
    // in schedules that do not split the backward, those ops are part of a B block.
    std::size_t k = weight[1] + weight[2] > weight[0] ? 1 : 0;
    if (weight[2] > 0 && weight[0] == 0 && weight[1] == 0) k = 2;
    cur.kind = "FBW"[k];
    cur.index = counts[k]++;
    blocks.push_back(cur);
    weight = {};
    open = false;
  };
  for (const auto& [begin, id] : ops) {
    bool crossed = false;
    while (cut < cuts.size() && cuts[cut] <= begin) {
      ++cut;
      crossed = true;
    }
    const std::string_view n = g.task_name(id);
    std::size_t k = 0;
    if (n.find("wgrad") != std::string_view::npos) {
      k = 2;
    } else if (n.find("_bwd") != std::string_view::npos || n.find("backward") != std::string_view::npos ||
               n.find("Backward") != std::string_view::npos || n.find("dgrad") != std::string_view::npos ||
               (launcher[id] != ~graph::processor_id{0} && main_thread != ~graph::processor_id{0} && launcher[id] != main_thread)) {
      k = 1;
    }
    // A new block at each pipeline transfer and where the pass turns from forward to backward
    // (receives are posted early, so transfers alone do not separate a 1F1B pair).
    if (crossed || (open && (k != 0) != open_backward)) close();
    const time_ns b = std::max(begin, w.begin), e = std::min(t.end_of(id), w.end);
    if (!open) {
      cur = {};
      cur.begin = b;
      open = true;
      open_backward = k != 0;
    }
    cur.end = std::max(cur.end, e);
    weight[k] += e - b;
  }
  close();
  return blocks;
}

/// The report of replay `s` of `job` as one HTML document. `baseline`, when given, is the
/// unscaled replay of the same job, shown beside `s` (a what-if). O(tasks + edges) plus the
/// output, which is bounded by the options, not by the job's size.
[[nodiscard]] inline std::string html_report(const trace::job& job, const replay_session& s, const html_options& opt = {},
                                             const replay_session* baseline = nullptr) {
  namespace h = detail::html;
  using h::put;
  const graph::task_graph& g = s.built.graph;
  const task_times sim = s.simulated_times();
  std::string out;
  out.reserve(1 << 20);
  out += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
         "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\n<title>";
  h::escape(out, opt.title);
  out += "</title>\n<style>";
  out += h::css;
  out += "</style></head>\n<body>\n<h1>";
  h::escape(out, opt.title);
  out += "</h1>\n";

  // ---- summary
  std::size_t slowest = 0;
  for (std::size_t i = 0; i < s.ranks.size(); ++i) {
    if (s.ranks[i].simulated_ns > s.ranks[slowest].simulated_ns) slowest = i;
  }
  const std::string step = s.ranks.empty() ? std::string("-") : s.ranks[slowest].step;
  put(out, "<p class=\"sub\">%zu rank%s, %s; replayed with scales compute=%g comm=%g cpu=%g</p>\n", s.ranks.size(),
      s.ranks.size() == 1 ? "" : "s", h::esc(step).c_str(), s.scales.compute, s.scales.comm, s.scales.cpu);
  out += "<section id=\"summary\"><div class=\"cards\">";
  auto card = [&](const std::string& value, const std::string& label, const char* id) {
    put(out, "<div class=\"card\" id=\"%s\"><b>%s</b><span>%s</span></div>", id, value.c_str(), label.c_str());
  };
  card(h::ms(s.measured_ns), "measured iteration (slowest rank)", "card-measured");
  card(h::ms(s.simulated_ns), "simulated iteration (slowest rank)", "card-simulated");
  // Against a baseline the simulated iteration is a prediction, not a replay: its distance to
  // the measurement is the what-if's effect, shown as the change, not as an error.
  if (baseline == nullptr) card(h::pct(s.error), "replay error |sim − meas| / meas", "card-error");
  if (baseline != nullptr) {
    card(h::ms(baseline->simulated_ns), "baseline (unscaled) replay", "card-baseline");
    const double change = baseline->simulated_ns > 0
                              ? static_cast<double>(s.simulated_ns - baseline->simulated_ns) / static_cast<double>(baseline->simulated_ns)
                              : 0.0;
    card((change > 0 ? "+" : "") + h::pct(change), "what-if vs baseline", "card-change");
  }
  if (!s.ranks.empty()) card(h::pct(s.ranks[slowest].simulated.sm.mean), "SM utilisation (slowest rank)", "card-sm");
  out += "</div>\n<table><tbody>";
  const auto& st = s.built.stats;
  if (!opt.inputs.empty()) {
    out += "<tr><th>input</th><td>";
    for (std::size_t k = 0; k < opt.inputs.size(); ++k) out += (k ? ", <code>" : "<code>") + h::esc(opt.inputs[k]) + "</code>";
    out += "</td></tr>";
  }
  if (!job.ranks.empty()) {
    const auto& r0 = job.ranks.front();
    std::string device;
    if (!r0.devices.empty()) device = r0.devices.front().name;
    put(out, "<tr><th>device</th><td>%s</td></tr>", device.empty() ? "-" : h::esc(device).c_str());
    if (r0.world_size) put(out, "<tr><th>world size</th><td>%d (traces of %zu ranks)</td></tr>", *r0.world_size, job.ranks.size());
  }
  put(out, "<tr><th>execution graph</th><td>%zu tasks, %zu edges, %zu processors (%zu threads, %zu streams)</td></tr>", g.task_count(),
      g.edge_count(), g.processors.size(), st.threads, st.streams);
  put(out, "<tr><th>dependencies</th><td>%zu launches, %zu cross-stream, %zu blocking calls, %zu thread hand-offs</td></tr>",
      st.launch_edges, st.cross_stream_exact + st.cross_stream_inferred + st.cross_stream_implicit, st.blocking_calls, st.handoffs);
  if (st.collectives_matched > 0 || st.collectives_unmatched > 0) {
    put(out, "<tr><th>collectives</th><td>%zu joined across ranks (%zu participants), %zu without partners in the job</td></tr>",
        st.collectives_matched, st.collective_participants, st.collectives_unmatched);
  }
  out += "</tbody></table></section>\n";

  // ---- per-rank bars
  const time_ns tolerance = std::max<time_ns>(1000, std::max(s.measured_ns, s.simulated_ns) / 1000);
  std::vector<rank_group> groups = group_ranks(s, tolerance);
  std::stable_sort(groups.begin(), groups.end(), [&](const rank_group& a, const rank_group& b) {
    return s.ranks[a.members.front()].rank < s.ranks[b.members.front()].rank;
  });
  const std::size_t rows = std::min(groups.size(), opt.max_rank_rows);
  time_ns top = 1;
  for (const auto& r : s.ranks) top = std::max({top, r.measured_ns, r.simulated_ns});
  if (baseline != nullptr) top = std::max(top, baseline->simulated_ns);
  const double label_w = 150, bar_w = 720, value_w = 470;
  const double total_w = label_w + bar_w + value_w;
  auto x_of = [&](time_ns v) { return bar_w * static_cast<double>(v) / static_cast<double>(top); };

  out += "<section id=\"iteration\"><h2>Iteration per rank: measured vs simulated</h2>\n";
  if (groups.size() < s.ranks.size()) {
    put(out, "<p class=\"note\">%zu ranks in %zu groups: ranks whose iteration and breakdown agree to %s share a row.</p>\n",
        s.ranks.size(), groups.size(), h::ms(tolerance).c_str());
  }
  out += "<div class=\"legend\"><span><i class=\"l\" style=\"background:#b8c0cc\"></i>measured</span>"
         "<span><i style=\"background:#4c78a8\"></i>simulated</span>";
  if (baseline != nullptr) out += "<span><i style=\"background:#72b7b2\"></i>baseline (unscaled) replay</span>";
  out += "</div>\n";
  const double per_row = baseline != nullptr ? 40 : 30;
  put(out, "<svg class=\"bars\" id=\"iteration-bars\" width=\"%.0f\" height=\"%.0f\" role=\"img\">", total_w, per_row * static_cast<double>(rows) + 6);
  for (std::size_t k = 0; k < rows; ++k) {
    const rank_group& grp = groups[k];
    const rank_replay& r = s.ranks[grp.members.front()];
    const double y = per_row * static_cast<double>(k) + 3;
    const std::string label = (grp.ranks.size() == 1 ? "rank " : "ranks ") + h::rank_ranges(grp.ranks);
    put(out, "<g class=\"rank-row\" data-rank=\"%d\" data-ranks=\"%zu\">", r.rank, grp.ranks.size());
    put(out, "<text x=\"0\" y=\"%.1f\">%s</text>", y + 15, h::esc(label, 22).c_str());
    put(out, "<rect class=\"measured\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"11\"><title>measured %s</title></rect>", label_w, y,
        x_of(r.measured_ns), h::ms(r.measured_ns).c_str());
    put(out, "<rect class=\"simulated\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"11\"><title>simulated %s</title></rect>", label_w,
        y + 12, x_of(r.simulated_ns), h::ms(r.simulated_ns).c_str());
    std::string value = h::ms(r.measured_ns) + " → " + h::ms(r.simulated_ns) + " (" + h::pct(r.error) + ")";
    if (baseline != nullptr && grp.members.front() < baseline->ranks.size()) {
      const auto& b = baseline->ranks[grp.members.front()];
      put(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"9\" style=\"fill:#72b7b2\"><title>baseline %s</title></rect>", label_w,
          y + 24, x_of(b.simulated_ns), h::ms(b.simulated_ns).c_str());
      value = h::ms(r.measured_ns) + " | base " + h::ms(b.simulated_ns) + " | what-if " + h::ms(r.simulated_ns);
    }
    put(out, "<text class=\"muted\" x=\"%.1f\" y=\"%.1f\">%s</text></g>", label_w + bar_w + 8, y + 15, value.c_str());
  }
  out += "</svg>\n";
  if (rows < groups.size()) put(out, "<p class=\"note\">%zu more groups not drawn.</p>\n", groups.size() - rows);
  out += "</section>\n";

  // ---- breakdown bars
  out += "<section id=\"breakdown\"><h2>Breakdown per rank (4-way, FIDELITY.md)</h2>\n"
         "<div class=\"legend\"><span><i style=\"background:#4c78a8\"></i>exposed compute</span>"
         "<span><i style=\"background:#9d6fbf\"></i>compute overlapped with communication</span>"
         "<span><i style=\"background:#f58518\"></i>exposed communication</span>"
         "<span><i style=\"background:#e3e7ee\"></i>other (GPU idle)</span></div>\n"
         "<p class=\"note\">Each row: the simulated iteration (thick) over the measured one (thin), in ms of the window.</p>\n";
  put(out, "<svg class=\"bars\" id=\"breakdown-bars\" width=\"%.0f\" height=\"%.0f\" role=\"img\">", total_w, 30.0 * static_cast<double>(rows) + 6);
  auto stacked = [&](const breakdown& b, double y, double height, const char* what) {
    const std::array<std::pair<time_ns, const char*>, 4> parts = {
        {{b.exposed_compute, "b-compute"}, {b.overlapped, "b-overlap"}, {b.exposed_comm, "b-comm"}, {b.other, "b-other"}}};
    const std::array<const char*, 4> names = {"exposed compute", "overlapped", "exposed communication", "other"};
    double x = label_w;
    for (std::size_t p = 0; p < parts.size(); ++p) {
      const double w = x_of(parts[p].first);
      if (w <= 0) continue;
      put(out, "<rect class=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"><title>%s %s: %s (%s)</title></rect>", parts[p].second,
          x, y, w, height, what, names[p], h::ms(parts[p].first).c_str(),
          h::pct(b.total() > 0 ? static_cast<double>(parts[p].first) / static_cast<double>(b.total()) : 0.0).c_str());
      x += w;
    }
  };
  for (std::size_t k = 0; k < rows; ++k) {
    const rank_group& grp = groups[k];
    const rank_replay& r = s.ranks[grp.members.front()];
    const double y = 30.0 * static_cast<double>(k) + 3;
    put(out, "<g class=\"rank-row\" data-rank=\"%d\">", r.rank);
    put(out, "<text x=\"0\" y=\"%.1f\">%s</text>", y + 15, h::esc((grp.ranks.size() == 1 ? "rank " : "ranks ") + h::rank_ranges(grp.ranks), 22).c_str());
    stacked(r.simulated.split, y, 15, "simulated");
    stacked(r.measured.split, y + 17, 6, "measured");
    const auto& b = r.simulated.split;
    const double whole = static_cast<double>(std::max<time_ns>(b.total(), 1));
    put(out, "<text class=\"muted\" x=\"%.1f\" y=\"%.1f\">compute %s · overlap %s · comm %s · other %s</text></g>", label_w + bar_w + 8,
        y + 15, h::pct(static_cast<double>(b.exposed_compute) / whole).c_str(), h::pct(static_cast<double>(b.overlapped) / whole).c_str(),
        h::pct(static_cast<double>(b.exposed_comm) / whole).c_str(), h::pct(static_cast<double>(b.other) / whole).c_str());
  }
  out += "</svg>\n</section>\n";

  // ---- timelines: the slowest rank, then one rank per other group (largest groups first)
  std::vector<std::size_t> shown;
  if (!s.ranks.empty()) shown.push_back(slowest);
  {
    std::vector<const rank_group*> by_size;
    for (const auto& grp : groups) by_size.push_back(&grp);
    std::stable_sort(by_size.begin(), by_size.end(), [](const rank_group* a, const rank_group* b) { return a->members.size() > b->members.size(); });
    for (const rank_group* grp : by_size) {
      if (shown.size() >= opt.max_timeline_ranks) break;
      const std::size_t i = grp->members.front();
      if (std::find(grp->members.begin(), grp->members.end(), slowest) == grp->members.end()) shown.push_back(i);
    }
    std::sort(shown.begin() + (shown.empty() ? 0 : 1), shown.end(),
              [&](std::size_t a, std::size_t b) { return s.ranks[a].rank < s.ranks[b].rank; });
  }
  // Per processor, its tasks (ids ascending = execution order on the processor).
  std::vector<std::uint8_t> wanted_rank;
  for (const auto i : shown) {
    const int r = s.ranks[i].rank;
    if (r >= 0) {
      if (static_cast<std::size_t>(r) >= wanted_rank.size()) wanted_rank.resize(static_cast<std::size_t>(r) + 1, 0);
      wanted_rank[static_cast<std::size_t>(r)] = 1;
    }
  }
  std::vector<std::vector<graph::task_id>> on_processor(g.processors.size());
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    const int r = g.rank[t];
    if (r >= 0 && static_cast<std::size_t>(r) < wanted_rank.size() && wanted_rank[static_cast<std::size_t>(r)]) on_processor[g.processor[t]].push_back(t);
  }
  std::vector<graph::task_id> arrive_of(g.task_count(), graph::no_task);
  for (const auto& ci : g.collectives) {
    for (std::size_t k = 0; k < ci.complete.size() && k < ci.arrive.size(); ++k) arrive_of[ci.complete[k]] = ci.arrive[k];
  }
  for (std::size_t i = 0; i < s.built.ranks.size() && i < job.ranks.size(); ++i) {
    const auto& map = s.built.ranks[i];
    for (std::size_t ev = 0; ev < map.arrive_of_event.size() && ev < map.task_of_event.size(); ++ev) {
      if (map.arrive_of_event[ev] != graph::no_task && map.task_of_event[ev] != graph::no_task) arrive_of[map.task_of_event[ev]] = map.arrive_of_event[ev];
    }
  }

  out += "<section id=\"timelines\"><h2>Timeline of one iteration (simulated)</h2>\n<div class=\"legend\">";
  for (std::size_t c = 0; c < lane_class_count; ++c) {
    put(out, "<span><i class=\"sw\" style=\"background:%s\"></i>%s</span>",
        std::array<const char*, lane_class_count>{"#8c96a5", "#d5dae2", "#4c78a8", "#54a24b", "#f58518", "#fbd0a1"}[c], h::class_labels[c]);
  }
  out += "<span><i style=\"background:#d62728\"></i>critical path</span></div>\n";
  if (shown.size() < s.ranks.size()) {
    put(out, "<p class=\"note\">%zu of %zu ranks drawn: the slowest rank and one rank of each of the largest groups of alike ranks.</p>\n",
        shown.size(), s.ranks.size());
  }
  // The critical path of the slowest rank's iteration (what `lumos replay --critical-path`
  // prints). It crosses ranks through collectives, so it is drawn on every timeline it visits.
  critical_path path;
  if (!s.ranks.empty()) path = iteration_critical_path(g, s.compiled, s.timeline, s.plans[slowest], s.ranks[slowest].simulated);
  for (const std::size_t i : shown) {
    const rank_replay& r = s.ranks[i];
    // By number: a what-if's ranks need not be the job's, in its order (merged pipeline stages).
    const trace::rank_trace* src = nullptr;
    for (const auto& t : job.ranks) {
      if (t.rank == r.rank) src = &t;
    }
    const interval w = r.simulated.window;
    const time_ns len = std::max<time_ns>(w.length(), 1);
    const double width = opt.timeline_width;
    auto px = [&](time_ns v) { return width * static_cast<double>(std::clamp(v, w.begin, w.end) - w.begin) / static_cast<double>(len); };
    // Lanes: processors of the rank with work in the window; GPU streams first (by busy time),
    // then CPU threads (by busy time).
    struct lane {
      graph::processor_id p;
      time_ns busy;
      bool gpu;
    };
    std::vector<lane> lanes;
    for (graph::processor_id p = 0; p < g.processors.size(); ++p) {
      const auto& info = g.processors[p];
      if (info.rank != r.rank || info.kind == graph::processor_kind::barrier) continue;
      time_ns busy = 0;
      for (const auto t : on_processor[p]) {
        const time_ns b = std::max(sim.begin_of(t), w.begin), e = std::min(sim.end_of(t), w.end);
        if (e > b) busy += e - b;
      }
      if (busy > 0) lanes.push_back({p, busy, info.kind == graph::processor_kind::gpu_stream});
    }
    std::stable_sort(lanes.begin(), lanes.end(), [](const lane& a, const lane& b) { return a.gpu != b.gpu ? a.gpu > b.gpu : a.busy > b.busy; });
    const std::size_t hidden = lanes.size() > opt.max_lanes ? lanes.size() - opt.max_lanes : 0;
    lanes.resize(std::min(lanes.size(), opt.max_lanes));
    // Back in a reading order: streams then threads, each by their number.
    std::stable_sort(lanes.begin(), lanes.end(), [&](const lane& a, const lane& b) {
      const auto& pa = g.processors[a.p];
      const auto& pb = g.processors[b.p];
      return std::tuple(!a.gpu, pa.owner, pa.index) < std::tuple(!b.gpu, pb.owner, pb.index);
    });
    time_ns on_path = 0;
    for (const auto& seg : path.segments) {
      if (g.rank[seg.task] == r.rank) on_path += seg.end - seg.begin;
    }
    put(out, "<h3 id=\"timeline-rank-%d\">rank %d — %s, simulated %s (measured %s)</h3>\n", r.rank, r.rank, h::esc(r.step).c_str(),
        h::ms(r.simulated_ns).c_str(), h::ms(r.measured_ns).c_str());
    put(out, "<p class=\"note\">The critical path (of rank %d) runs %s on this rank.%s</p>\n", s.ranks[slowest].rank, h::ms(on_path).c_str(),
        hidden > 0 ? (" " + std::to_string(hidden) + " lanes with the least work not drawn.").c_str() : "");
    const double lane_h = 22, head = 22, label_px = 190;
    const double svg_h = head + lane_h * static_cast<double>(lanes.size()) + 4;
    put(out, "<div class=\"scroll\"><svg class=\"timeline\" data-rank=\"%d\" width=\"%.0f\" height=\"%.0f\" role=\"img\">", r.rank,
        label_px + width + 10, svg_h);
    // Time axis: about 10 round ticks.
    const double raw = static_cast<double>(len) / 10.0;
    const double mag = std::pow(10.0, std::floor(std::log10(std::max(raw, 1.0))));
    const double stepv = raw / mag < 2 ? 2 * mag : raw / mag < 5 ? 5 * mag : 10 * mag;
    for (double v = 0; v <= static_cast<double>(len); v += stepv) {
      const double x = label_px + width * v / static_cast<double>(len);
      put(out, "<line class=\"grid\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", x, x, head - 4, svg_h);
      put(out, "<text class=\"muted\" x=\"%.1f\" y=\"%.1f\">%g ms</text>", x + 2, head - 8, v / 1e6);
    }
    std::map<graph::processor_id, double> lane_y;
    for (std::size_t k = 0; k < lanes.size(); ++k) {
      const auto& info = g.processors[lanes[k].p];
      const double y = head + lane_h * static_cast<double>(k);
      lane_y[lanes[k].p] = y;
      std::string name = info.name;
      if (name.rfind("rank ", 0) == 0) {  // "rank 3 stream 7": the rank is in the heading already
        const auto sp = name.find(' ', 5);
        if (sp != std::string::npos) name = name.substr(sp + 1);
      }
      put(out, "<g class=\"lane %s\" data-processor=\"%u\">", lanes[k].gpu ? "gpu-lane" : "cpu-lane", lanes[k].p);
      put(out, "<text x=\"0\" y=\"%.1f\">%s<title>%s</title></text>", y + 15, h::esc(name, 24).c_str(), h::esc(info.name).c_str());
      put(out, "<rect class=\"lane\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>", label_px, y + 1, width, lane_h - 2);
      out += "<g transform=\"translate(" + std::to_string(static_cast<int>(label_px)) + ",0)\">";
      h::lane_painter paint(out, g, y + 2, lane_h - 8, width);
      for (const auto t : on_processor[lanes[k].p]) {
        const time_ns b = sim.begin_of(t), e = sim.end_of(t);
        if (e < w.begin || b > w.end) continue;
        const auto kind = g.kind[t];
        if (kind == graph::task_kind::comm_arrive || kind == graph::task_kind::join) continue;
        if (kind == graph::task_kind::comm_complete || kind == graph::task_kind::gpu_comm) {
          const graph::task_id a = arrive_of[t];
          if (a != graph::no_task && g.processor[a] == g.processor[t] && sim.begin_of(a) < b) {
            paint.add(lane_class::comm_wait, a, px(sim.begin_of(a)), px(b), sim.begin_of(a), b);
          }
        }
        if (e <= b) continue;
        paint.add(classify(g, t, src), t, px(b), px(e), b, e);
      }
      paint.finish();
      // The critical path on this lane: a red strip along the lane's bottom, touching
      // segments merged (a path crosses a lane many times; one strip per run keeps it light).
      std::vector<std::pair<double, double>> strips;
      for (const auto& seg : path.segments) {
        if (g.processor[seg.task] != lanes[k].p) continue;
        const double x0 = px(seg.begin), x1 = std::max(px(seg.end), x0 + 0.8);
        if (!strips.empty() && x0 <= strips.back().second + 0.5) {
          strips.back().second = std::max(strips.back().second, x1);
        } else {
          strips.push_back({x0, x1});
        }
      }
      for (const auto& [x0, x1] : strips) {
        put(out, "<rect class=\"crit\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"3\"/>", x0, y + lane_h - 6, x1 - x0);
      }
      out += "</g></g>";
    }
    out += "</svg></div>\n";
  }
  out += "</section>\n";

  // ---- pipeline diagram
  std::vector<std::uint8_t> is_p2p(g.task_count(), 0);
  bool pipeline = false;
  for (const auto& ci : g.collectives) {
    if (ci.kind.find("send") == std::string::npos && ci.kind.find("recv") == std::string::npos && ci.kind.find("Send") == std::string::npos) continue;
    for (const auto c : ci.complete) is_p2p[c] = 1;
    pipeline = pipeline || ci.complete.size() >= 2;
  }
  for (graph::task_id t = 0; t < g.task_count(); ++t) {
    if (g.kind[t] != graph::task_kind::gpu_comm) continue;
    const std::string_view n = g.task_name(t);
    if (n.find("SendRecv") != std::string_view::npos || n.find("ncclKernel_Send") != std::string_view::npos ||
        n.find("ncclKernel_Recv") != std::string_view::npos || n.find("ncclDevKernel_Send") != std::string_view::npos ||
        n.find("ncclDevKernel_Recv") != std::string_view::npos) {
      is_p2p[t] = 1;
      pipeline = true;
    }
  }
  if (pipeline && s.ranks.size() >= 2) {
    std::vector<graph::processor_id> launcher(g.task_count(), ~graph::processor_id{0});
    for (const auto& e : g.edges) {
      if (e.kind == graph::edge_kind::launch) launcher[e.to] = g.processor[e.from];
    }
    // One row per stage: ranks whose first block starts at the same time (to the tolerance) are
    // alike; stages are ordered by when their first forward starts.
    struct row {
      std::size_t rank_index;
      std::vector<pipeline_block> blocks;
      std::vector<int> ranks;
    };
    std::map<std::pair<time_ns, std::size_t>, row> by_start;
    for (std::size_t i = 0; i < s.ranks.size(); ++i) {
      if (!s.plans[i].comm.empty()) {
        bool any = false;
        for (const auto& [a, c] : s.plans[i].comm) any = any || is_p2p[c];
        if (!any) continue;
      } else {
        continue;
      }
      std::vector<pipeline_block> blocks = pipeline_blocks(g, s, i, is_p2p, launcher);
      if (blocks.empty()) continue;
      const time_ns first = blocks.front().begin / tolerance;
      const auto key = std::pair(first, blocks.size());
      auto it = by_start.find(key);
      if (it == by_start.end()) it = by_start.emplace(key, row{i, std::move(blocks), {}}).first;
      it->second.ranks.push_back(s.ranks[i].rank);
    }
    if (by_start.size() >= 2) {
      time_ns t0 = std::numeric_limits<time_ns>::max(), t1 = std::numeric_limits<time_ns>::min();
      for (const auto& [key, rw] : by_start) {
        t0 = std::min(t0, s.ranks[rw.rank_index].simulated.window.begin);
        t1 = std::max(t1, s.ranks[rw.rank_index].simulated.window.end);
      }
      const double width = opt.timeline_width, label_px = 190, row_h = 26;
      const std::size_t nrows = std::min(by_start.size(), opt.max_pipeline_rows);
      const time_ns span = std::max<time_ns>(t1 - t0, 1);
      auto px = [&](time_ns v) { return width * static_cast<double>(v - t0) / static_cast<double>(span); };
      out += "<section id=\"pipeline\"><h2>Pipeline schedule (stage × time, simulated)</h2>\n"
             "<div class=\"legend\"><span><i style=\"background:#4c78a8\"></i>forward</span>"
             "<span><i style=\"background:#72b7b2\"></i>backward</span><span><i style=\"background:#b279a2\"></i>weight gradient</span>"
             "<span><i style=\"background:#fff;border:1px solid #ccd\"></i>bubble (no compute)</span></div>\n"
             "<p class=\"note\">Blocks are runs of compute on each stage's busiest stream between pipeline transfers; "
             "numbers count the stage's forwards and backwards in order (see docs/report.md).</p>\n";
      put(out, "<div class=\"scroll\"><svg class=\"pipeline\" width=\"%.0f\" height=\"%.0f\" role=\"img\">", label_px + width + 10,
          row_h * static_cast<double>(nrows) + 4);
      std::size_t k = 0;
      for (auto& [key, rw] : by_start) {
        if (k >= nrows) break;
        const double y = row_h * static_cast<double>(k) + 2;
        std::sort(rw.ranks.begin(), rw.ranks.end());
        put(out, "<g class=\"stage\" data-stage=\"%zu\"><text x=\"0\" y=\"%.1f\">stage %zu: %s</text>", k, y + 16, k,
            h::esc((rw.ranks.size() == 1 ? "rank " : "ranks ") + h::rank_ranges(rw.ranks), 18).c_str());
        put(out, "<rect class=\"pbubble\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>", label_px, y, width, row_h - 4);
        for (const auto& b : rw.blocks) {
          const double x0 = label_px + px(b.begin), w = std::max(px(b.end) - px(b.begin), 0.8);
          const char* cls = b.kind == 'F' ? "pf" : b.kind == 'B' ? "pb" : "pw";
          put(out, "<rect class=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"><title>%c%d %s</title></rect>", cls, x0, y + 1, w,
              row_h - 6, b.kind, b.index, h::ms(b.end - b.begin).c_str());
          if (w >= 16) {
            put(out, "<text x=\"%.1f\" y=\"%.1f\" style=\"fill:#fff;font-size:10px\">%c%d</text>", x0 + 2, y + 15, b.kind, b.index);
          }
        }
        out += "</g>";
        ++k;
      }
      out += "</svg></div>\n";
      if (nrows < by_start.size()) put(out, "<p class=\"note\">%zu more stages not drawn.</p>\n", by_start.size() - nrows);
      out += "</section>\n";
    }
  }

  // ---- critical path tables
  out += "<section id=\"critical-path\"><h2>Critical path</h2>\n"
         "<p class=\"note\">The chain of tasks and waits that fixed the end of the rank's simulated iteration, walked back to "
         "the start of its window (docs/replay.md); red on the timelines above.</p>\n";
  if (!s.ranks.empty()) {
    const std::size_t i = slowest;
    const time_ns total = path.end - path.begin;
    put(out, "<h3>rank %d: %s</h3>\n<table class=\"crit-attribution\"><thead><tr><th>category</th><th class=\"n\">time</th>"
             "<th class=\"n\">share</th></tr></thead><tbody>",
        s.ranks[i].rank, h::ms(total).c_str());
    for (std::size_t c = 0; c < path_category_count; ++c) {
      if (path.total[c] == 0) continue;
      put(out, "<tr><td>%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td></tr>",
          std::string(to_string(static_cast<path_category>(c))).c_str(), h::ms(path.total[c]).c_str(),
          h::pct(total > 0 ? static_cast<double>(path.total[c]) / static_cast<double>(total) : 0.0).c_str());
    }
    out += "</tbody></table>\n";
    std::vector<std::size_t> idx(path.segments.size());
    for (std::size_t k = 0; k < idx.size(); ++k) idx[k] = k;
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t x, std::size_t y) {
      return path.segments[x].end - path.segments[x].begin > path.segments[y].end - path.segments[y].begin;
    });
    idx.resize(std::min<std::size_t>(idx.size(), 12));
    put(out, "<table class=\"crit-segments\"><thead><tr><th class=\"n\">length</th><th>category</th><th>processor</th><th>task</th>"
             "<th class=\"n\">at</th></tr></thead><tbody>");
    for (const auto k : idx) {
      const auto& seg = path.segments[k];
      put(out, "<tr><td class=\"n\">%s</td><td>%s</td><td>%s</td><td>%s</td><td class=\"n\">%s</td></tr>", h::ms(seg.end - seg.begin).c_str(),
          std::string(to_string(seg.category)).c_str(), h::esc(g.processors[g.processor[seg.task]].name, 40).c_str(),
          h::esc(g.task_name(seg.task), 90).c_str(), ("+" + h::ms(seg.begin - s.ranks[i].simulated.window.begin)).c_str());
    }
    put(out, "</tbody></table>\n<p class=\"note\">%zu segments; the %zu longest shown.</p>\n", path.segments.size(), idx.size());
  }
  out += "</section>\n";

  // ---- per-rank table (all groups, compact)
  out += "<section id=\"ranks\"><h2>Ranks</h2>\n<table><thead><tr><th>ranks</th><th>step</th><th class=\"n\">measured</th>"
         "<th class=\"n\">simulated</th><th class=\"n\">error</th><th class=\"n\">SM util.</th></tr></thead><tbody>";
  for (std::size_t k = 0; k < groups.size() && k < 4 * opt.max_rank_rows; ++k) {
    const rank_replay& r = s.ranks[groups[k].members.front()];
    put(out, "<tr><td>%s</td><td>%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td></tr>",
        h::esc(h::rank_ranges(groups[k].ranks), 60).c_str(), h::esc(r.step).c_str(), h::ms(r.measured_ns).c_str(),
        h::ms(r.simulated_ns).c_str(), h::pct(r.error).c_str(), h::pct(r.simulated.sm.mean).c_str());
  }
  out += "</tbody></table></section>\n";
  out += "<p class=\"note\">Generated by <code>lumos report</code>. Times are the replay's (docs/replay.md); "
         "the page holds no script and loads nothing.</p>\n</body></html>\n";
  return out;
}

}  // namespace lumos::report
