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
#include <lumos/report/detail/html_format.hpp>
#include <lumos/report/replay_report.hpp>
#include <lumos/trace/data.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
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
  /// What a what-if changed, listed first on its page: each a headline ("layers 8 -> 16") and
  /// the sentence that explains it (`whatif::change`'s `headline()` and `text`).
  std::vector<std::pair<std::string, std::string>> changes;
  /// Why the what-if moved the step as much as it did (`whatif::attribution`'s text), under the changes.
  std::string why;
};

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

namespace detail::html {

// The report page, section by section: what several sections read (the slowest rank, the groups
// of alike ranks, the bar scale, the critical path, the tasks of the ranks drawn) is found once.
class page {
 public:
  page(const trace::job& job, const replay_session& s, const html_options& opt, const replay_session* baseline)
      : job_(job), s_(s), opt_(opt), baseline_(baseline), g_(s.built.graph), sim_(s.simulated_times()) {
    for (std::size_t i = 0; i < s_.ranks.size(); ++i) {
      if (s_.ranks[i].simulated_ns > s_.ranks[slowest_].simulated_ns) slowest_ = i;
    }
    tolerance_ = std::max<time_ns>(1000, std::max(s_.measured_ns, s_.simulated_ns) / 1000);
    groups_ = group_ranks(s_, tolerance_);
    std::stable_sort(groups_.begin(), groups_.end(), [&](const rank_group& a, const rank_group& b) {
      return s_.ranks[a.members.front()].rank < s_.ranks[b.members.front()].rank;
    });
    rows_ = std::min(groups_.size(), opt_.max_rank_rows);
    for (const auto& r : s_.ranks) top_ = std::max({top_, r.measured_ns, r.simulated_ns});
    if (baseline_ != nullptr) top_ = std::max(top_, baseline_->simulated_ns);
  }

  /// The timeline of the slowest rank alone, on a time axis of at least `axis_len`, its heading
  /// opened by `label`: what a what-if's page draws of its baseline.
  std::string slowest_timeline(time_ns axis_len, std::string label) {
    axis_len_ = axis_len;
    label_ = std::move(label);
    id_prefix_ = "baseline-";
    if (s_.ranks.empty()) return {};
    shown_ = {slowest_};
    index_tasks();
    path_ = iteration_critical_path(g_, s_.compiled, s_.timeline, s_.plans[slowest_], s_.ranks[slowest_].simulated);
    timeline(s_.ranks[slowest_]);
    return std::move(out_);
  }

  /// The length of the slowest rank's simulated window.
  [[nodiscard]] time_ns slowest_window() const { return s_.ranks.empty() ? 0 : s_.ranks[slowest_].simulated.window.length(); }

  std::string write() {
    out_.reserve(1 << 20);
    head();
    summary();
    iteration_bars();
    breakdown_bars();
    timelines();
    pipeline_diagram();
    critical_path_tables();
    ranks_table();
    out_ += "<p class=\"note\">Generated by <code>lumos</code>. Times are the replay's (replay.md of the lumos documentation, "
            "installed in share/doc/lumos); "
            "the page holds no script and loads nothing.</p>\n</body></html>\n";
    return std::move(out_);
  }

 private:
  static constexpr double label_w = 150, bar_w = 720, value_w = 470, total_w = label_w + bar_w + value_w;

  [[nodiscard]] double x_of(time_ns v) const { return bar_w * static_cast<double>(v) / static_cast<double>(top_); }
  [[nodiscard]] std::string group_label(const rank_group& grp, std::size_t limit) const {
    return esc((grp.ranks.size() == 1 ? "rank " : "ranks ") + rank_ranges(grp.ranks), limit);
  }

  void head() {
    out_ += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\n<title>";
    escape(out_, opt_.title);
    out_ += "</title>\n<style>";
    out_ += css;
    out_ += "</style></head>\n<body>\n<h1>";
    escape(out_, opt_.title);
    out_ += "</h1>\n";
  }

  void card(const std::string& value, const std::string& label, const char* id) {
    put(out_, "<div class=\"card\" id=\"%s\"><b>%s</b><span>%s</span></div>", id, value.c_str(), label.c_str());
  }

  // The job in figures: iterations, error or change against the baseline, SM utilisation.
  void summary() {
    const std::string step = s_.ranks.empty() ? std::string("-") : s_.ranks[slowest_].step;
    put(out_, "<p class=\"sub\">%zu rank%s, %s; %s with scales compute=%g comm=%g cpu=%g</p>\n", s_.ranks.size(),
        s_.ranks.size() == 1 ? "" : "s", esc(step).c_str(), baseline_ != nullptr ? "predicted" : "replayed", s_.scales.compute,
        s_.scales.comm, s_.scales.cpu);
    changes();
    out_ += "<section id=\"summary\"><div class=\"cards\">";
    card(ms(s_.measured_ns), "measured iteration (slowest rank)", "card-measured");
    card(ms(s_.simulated_ns), baseline_ != nullptr ? "predicted iteration (slowest rank)" : "simulated iteration (slowest rank)",
         "card-simulated");
    // Against a baseline the simulated iteration is a prediction, not a replay: its distance to
    // the measurement is the what-if's effect, shown as the change, not as an error.
    if (baseline_ == nullptr) card(pct(s_.error), "replay error |sim − meas| / meas", "card-error");
    if (baseline_ != nullptr) {
      card(ms(baseline_->simulated_ns), "baseline (unscaled) replay", "card-baseline");
      card(signed_pct(s_.simulated_ns, baseline_->simulated_ns), "what-if vs baseline", "card-change");
    }
    card(ms(s_.unprofiled_ns), baseline_ != nullptr ? "predicted step without the profiler (estimate)" : "step without the profiler (estimate)",
         "card-unprofiled");
    if (!s_.ranks.empty()) card(pct(s_.ranks[slowest_].simulated.sm.mean), "SM utilisation (slowest rank)", "card-sm");
    out_ += "</div>\n<table><tbody>";
    summary_table();
    out_ += "</tbody></table></section>\n";
  }

  // What the what-if changed, before any figure.
  void changes() {
    if (opt_.changes.empty()) return;
    out_ += "<section id=\"changes\"><h2>What changed</h2>\n<ul class=\"changes\">";
    for (const auto& [headline, text] : opt_.changes) {
      out_ += "<li><b>";
      escape(out_, headline);
      out_ += "</b>";
      // The sentence often opens with the headline: the rest of it, then.
      std::string_view rest = text;
      if (rest.starts_with(headline)) rest.remove_prefix(headline.size());
      while (!rest.empty() && (rest.front() == ':' || rest.front() == ' ')) rest.remove_prefix(1);
      if (!rest.empty()) {
        out_ += ": ";
        escape(out_, rest, rest.size());  // the whole sentence
      }
      out_ += "</li>";
    }
    out_ += "</ul>";
    if (!opt_.why.empty()) {
      out_ += "<p id=\"why\"><b>Why:</b> ";
      escape(out_, opt_.why, opt_.why.size());
      out_ += "</p>";
    }
    out_ += "</section>\n";
  }

  // Inputs, device, world size and what the graph builder found.
  void summary_table() {
    const auto& st = s_.built.stats;
    if (!opt_.inputs.empty()) {
      out_ += "<tr><th>input</th><td>";
      for (std::size_t k = 0; k < opt_.inputs.size(); ++k) out_ += (k ? ", <code>" : "<code>") + esc(opt_.inputs[k]) + "</code>";
      out_ += "</td></tr>";
    }
    if (!job_.ranks.empty()) {
      const auto& r0 = job_.ranks.front();
      std::string device;
      if (!r0.devices.empty()) device = r0.devices.front().name;
      put(out_, "<tr><th>device</th><td>%s</td></tr>", device.empty() ? "-" : esc(device).c_str());
      if (r0.world_size) put(out_, "<tr><th>world size</th><td>%d (traces of %zu ranks)</td></tr>", *r0.world_size, job_.ranks.size());
    }
    put(out_, "<tr><th>execution graph</th><td>%zu tasks, %zu edges, %zu processors (%zu threads, %zu streams)</td></tr>", g_.task_count(),
        g_.edge_count(), g_.processors.size(), st.threads, st.streams);
    put(out_, "<tr><th>dependencies</th><td>%zu launches, %zu cross-stream, %zu blocking calls, %zu thread hand-offs</td></tr>",
        st.launch_edges, st.cross_stream_exact + st.cross_stream_inferred + st.cross_stream_implicit, st.blocking_calls, st.handoffs);
    if (st.collectives_matched > 0 || st.collectives_unmatched > 0) {
      put(out_, "<tr><th>collectives</th><td>%zu joined across ranks (%zu participants), %zu without partners in the job</td></tr>",
          st.collectives_matched, st.collective_participants, st.collectives_unmatched);
    }
  }

  // Measured vs simulated (and baseline) iteration, one row per group of alike ranks.
  void iteration_bars() {
    out_ += "<section id=\"iteration\"><h2>Iteration per rank: measured vs simulated</h2>\n";
    if (groups_.size() < s_.ranks.size()) {
      put(out_, "<p class=\"note\">%zu ranks in %zu groups: ranks whose iteration and breakdown agree to %s share a row.</p>\n",
          s_.ranks.size(), groups_.size(), ms(tolerance_).c_str());
    }
    out_ += "<div class=\"legend\"><span><i class=\"l\" style=\"background:#b8c0cc\"></i>measured</span>"
            "<span><i style=\"background:#4c78a8\"></i>simulated</span>";
    if (baseline_ != nullptr) out_ += "<span><i style=\"background:#72b7b2\"></i>baseline (unscaled) replay</span>";
    out_ += "</div>\n";
    const double per_row = baseline_ != nullptr ? 40 : 30;
    put(out_, "<svg class=\"bars\" id=\"iteration-bars\" width=\"%.0f\" height=\"%.0f\" role=\"img\">", total_w,
        per_row * static_cast<double>(rows_) + 6);
    for (std::size_t k = 0; k < rows_; ++k) {
      const rank_group& grp = groups_[k];
      const rank_replay& r = s_.ranks[grp.members.front()];
      const double y = per_row * static_cast<double>(k) + 3;
      put(out_, "<g class=\"rank-row\" data-rank=\"%d\" data-ranks=\"%zu\">", r.rank, grp.ranks.size());
      put(out_, "<text x=\"0\" y=\"%.1f\">%s</text>", y + 15, group_label(grp, 22).c_str());
      put(out_, "<rect class=\"measured\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"11\"><title>measured %s</title></rect>", label_w, y,
          x_of(r.measured_ns), ms(r.measured_ns).c_str());
      put(out_, "<rect class=\"simulated\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"11\"><title>simulated %s</title></rect>", label_w,
          y + 12, x_of(r.simulated_ns), ms(r.simulated_ns).c_str());
      std::string value = ms(r.measured_ns) + " → " + ms(r.simulated_ns) + " (" + pct(r.error) + ")";
      if (baseline_ != nullptr && grp.members.front() < baseline_->ranks.size()) {
        const auto& b = baseline_->ranks[grp.members.front()];
        put(out_, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"9\" style=\"fill:#72b7b2\"><title>baseline %s</title></rect>", label_w,
            y + 24, x_of(b.simulated_ns), ms(b.simulated_ns).c_str());
        value = ms(r.measured_ns) + " | base " + ms(b.simulated_ns) + " | what-if " + ms(r.simulated_ns);
      }
      put(out_, "<text class=\"muted\" x=\"%.1f\" y=\"%.1f\">%s</text></g>", label_w + bar_w + 8, y + 15, value.c_str());
    }
    out_ += "</svg>\n";
    if (rows_ < groups_.size()) put(out_, "<p class=\"note\">%zu more groups not drawn.</p>\n", groups_.size() - rows_);
    out_ += "</section>\n";
  }

  // One breakdown as a stacked bar at height `y`.
  void stacked(const breakdown& b, double y, double height, const char* what) {
    const std::array<std::pair<time_ns, const char*>, 4> parts = {
        {{b.exposed_compute, "b-compute"}, {b.overlapped, "b-overlap"}, {b.exposed_comm, "b-comm"}, {b.other, "b-other"}}};
    const std::array<const char*, 4> names = {"exposed compute", "overlapped", "exposed communication", "other"};
    double x = label_w;
    for (std::size_t p = 0; p < parts.size(); ++p) {
      const double w = x_of(parts[p].first);
      if (w <= 0) continue;
      put(out_, "<rect class=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"><title>%s %s: %s (%s)</title></rect>", parts[p].second,
          x, y, w, height, what, names[p], ms(parts[p].first).c_str(),
          pct(b.total() > 0 ? static_cast<double>(parts[p].first) / static_cast<double>(b.total()) : 0.0).c_str());
      x += w;
    }
  }

  // The 4-way breakdown, simulated over measured, one row per group of alike ranks.
  void breakdown_bars() {
    out_ += "<section id=\"breakdown\"><h2>Breakdown per rank</h2>\n"
            "<div class=\"legend\"><span><i style=\"background:#4c78a8\"></i>exposed compute</span>"
            "<span><i style=\"background:#9d6fbf\"></i>compute overlapped with communication</span>"
            "<span><i style=\"background:#f58518\"></i>exposed communication</span>"
            "<span><i style=\"background:#e3e7ee\"></i>other (GPU idle)</span></div>\n"
            "<p class=\"note\">At every instant of a rank's iteration its GPU runs compute alone, compute and "
            "communication together, communication alone, or nothing: the four parts add up to the iteration. Each row: "
            "the simulated iteration (thick) over the measured one (thin), in ms of the window.</p>\n";
    put(out_, "<svg class=\"bars\" id=\"breakdown-bars\" width=\"%.0f\" height=\"%.0f\" role=\"img\">", total_w, 30.0 * static_cast<double>(rows_) + 6);
    for (std::size_t k = 0; k < rows_; ++k) {
      const rank_group& grp = groups_[k];
      const rank_replay& r = s_.ranks[grp.members.front()];
      const double y = 30.0 * static_cast<double>(k) + 3;
      put(out_, "<g class=\"rank-row\" data-rank=\"%d\">", r.rank);
      put(out_, "<text x=\"0\" y=\"%.1f\">%s</text>", y + 15, group_label(grp, 22).c_str());
      stacked(r.simulated.split, y, 15, "simulated");
      stacked(r.measured.split, y + 17, 6, "measured");
      const auto& b = r.simulated.split;
      const double whole = static_cast<double>(std::max<time_ns>(b.total(), 1));
      put(out_, "<text class=\"muted\" x=\"%.1f\" y=\"%.1f\">compute %s · overlap %s · comm %s · other %s</text></g>", label_w + bar_w + 8,
          y + 15, pct(static_cast<double>(b.exposed_compute) / whole).c_str(), pct(static_cast<double>(b.overlapped) / whole).c_str(),
          pct(static_cast<double>(b.exposed_comm) / whole).c_str(), pct(static_cast<double>(b.other) / whole).c_str());
    }
    out_ += "</svg>\n</section>\n";
  }

  // The ranks with a timeline: the slowest, then one rank per other group (largest groups
  // first), the others by rank number.
  void choose_timeline_ranks() {
    if (!s_.ranks.empty()) shown_.push_back(slowest_);
    std::vector<const rank_group*> by_size;
    for (const auto& grp : groups_) by_size.push_back(&grp);
    std::stable_sort(by_size.begin(), by_size.end(), [](const rank_group* a, const rank_group* b) { return a->members.size() > b->members.size(); });
    for (const rank_group* grp : by_size) {
      if (shown_.size() >= opt_.max_timeline_ranks) break;
      const std::size_t i = grp->members.front();
      if (std::find(grp->members.begin(), grp->members.end(), slowest_) == grp->members.end()) shown_.push_back(i);
    }
    std::sort(shown_.begin() + (shown_.empty() ? 0 : 1), shown_.end(),
              [&](std::size_t a, std::size_t b) { return s_.ranks[a].rank < s_.ranks[b].rank; });
  }

  // Per processor of the ranks drawn, its tasks (ids ascending = execution order on the
  // processor); per communication op, its arrive.
  void index_tasks() {
    std::vector<std::uint8_t> wanted_rank;
    for (const auto i : shown_) {
      const int r = s_.ranks[i].rank;
      if (r >= 0) {
        if (static_cast<std::size_t>(r) >= wanted_rank.size()) wanted_rank.resize(static_cast<std::size_t>(r) + 1, 0);
        wanted_rank[static_cast<std::size_t>(r)] = 1;
      }
    }
    on_processor_.assign(g_.processors.size(), {});
    for (graph::task_id t = 0; t < g_.task_count(); ++t) {
      const int r = g_.rank[t];
      if (r >= 0 && static_cast<std::size_t>(r) < wanted_rank.size() && wanted_rank[static_cast<std::size_t>(r)]) on_processor_[g_.processor[t]].push_back(t);
    }
    arrive_of_.assign(g_.task_count(), graph::no_task);
    for (const auto& ci : g_.collectives) {
      for (std::size_t k = 0; k < ci.complete.size() && k < ci.arrive.size(); ++k) arrive_of_[ci.complete[k]] = ci.arrive[k];
    }
    for (std::size_t i = 0; i < s_.built.ranks.size() && i < job_.ranks.size(); ++i) {
      const auto& map = s_.built.ranks[i];
      for (std::size_t ev = 0; ev < map.arrive_of_event.size() && ev < map.task_of_event.size(); ++ev) {
        if (map.arrive_of_event[ev] != graph::no_task && map.task_of_event[ev] != graph::no_task) arrive_of_[map.task_of_event[ev]] = map.arrive_of_event[ev];
      }
    }
  }

  void timelines() {
    choose_timeline_ranks();
    index_tasks();
    out_ += baseline_ != nullptr ? "<section id=\"timelines\"><h2>Timelines of one iteration: the baseline's slowest rank above the "
                                   "prediction's, on one time axis</h2>\n<div class=\"legend\">"
                                 : "<section id=\"timelines\"><h2>Timeline of one iteration (simulated)</h2>\n<div class=\"legend\">";
    for (std::size_t c = 0; c < lane_class_count; ++c) {
      put(out_, "<span><i class=\"sw\" style=\"background:%s\"></i>%s</span>",
          std::array<const char*, lane_class_count>{"#8c96a5", "#d5dae2", "#4c78a8", "#54a24b", "#f58518", "#fbd0a1"}[c], class_labels[c]);
    }
    out_ += "<span><i style=\"background:#d62728\"></i>critical path</span></div>\n";
    if (shown_.size() < s_.ranks.size()) {
      put(out_, "<p class=\"note\">%zu of %zu ranks drawn: the slowest rank and one rank of each of the largest groups of alike ranks.</p>\n",
          shown_.size(), s_.ranks.size());
    }
    // The critical path of the slowest rank's iteration (what `lumos replay --critical-path`
    // prints). It crosses ranks through collectives, so it is drawn on every timeline it visits.
    if (!s_.ranks.empty()) path_ = iteration_critical_path(g_, s_.compiled, s_.timeline, s_.plans[slowest_], s_.ranks[slowest_].simulated);
    if (baseline_ != nullptr && !s_.ranks.empty() && !baseline_->ranks.empty()) {
      // The baseline's slowest rank first, then the prediction's ranks, all on the longer of the
      // two slowest ranks' windows: the change reads as the difference in length.
      page base(job_, *baseline_, opt_, nullptr);
      axis_len_ = std::max(s_.ranks[slowest_].simulated.window.length(), base.slowest_window());
      out_ += "<div id=\"timeline-baseline\">" + base.slowest_timeline(axis_len_, "baseline: ") + "</div>\n";
      label_ = "prediction: ";
    }
    for (const std::size_t i : shown_) timeline(s_.ranks[i]);
    out_ += "</section>\n";
  }

  // A lane of a timeline: a processor with work in the window.
  struct lane {
    graph::processor_id p;
    time_ns busy;
    bool gpu;
  };

  // The window of a timeline on its `width` px.
  struct time_axis {
    interval w;
    time_ns len;
    double width;
    [[nodiscard]] double px(time_ns v) const {
      return width * static_cast<double>(std::clamp(v, w.begin, w.end) - w.begin) / static_cast<double>(len);
    }
  };

  // Lanes of rank `r` with work in window `w`: the busiest (GPU streams first, then CPU threads,
  // by busy time) up to the limit, back in reading order; `hidden` counts the others.
  [[nodiscard]] std::vector<lane> lanes_of(const rank_replay& r, interval w, std::size_t& hidden) const {
    std::vector<lane> lanes;
    for (graph::processor_id p = 0; p < g_.processors.size(); ++p) {
      const auto& info = g_.processors[p];
      if (info.rank != r.rank || info.kind == graph::processor_kind::barrier) continue;
      time_ns busy = 0;
      for (const auto t : on_processor_[p]) {
        const time_ns b = std::max(sim_.begin_of(t), w.begin), e = std::min(sim_.end_of(t), w.end);
        if (e > b) busy += e - b;
      }
      if (busy > 0) lanes.push_back({p, busy, info.kind == graph::processor_kind::gpu_stream});
    }
    std::stable_sort(lanes.begin(), lanes.end(), [](const lane& a, const lane& b) { return a.gpu != b.gpu ? a.gpu > b.gpu : a.busy > b.busy; });
    hidden = lanes.size() > opt_.max_lanes ? lanes.size() - opt_.max_lanes : 0;
    lanes.resize(std::min(lanes.size(), opt_.max_lanes));
    // Back in a reading order: streams then threads, each by their number.
    std::stable_sort(lanes.begin(), lanes.end(), [&](const lane& a, const lane& b) {
      const auto& pa = g_.processors[a.p];
      const auto& pb = g_.processors[b.p];
      return std::tuple(!a.gpu, pa.owner, pa.index) < std::tuple(!b.gpu, pb.owner, pb.index);
    });
    return lanes;
  }

  static constexpr double lane_h = 22, timeline_head = 22, timeline_label = 190;

  // The timeline of rank `r`'s simulated iteration: heading, time axis and one lane per processor.
  void timeline(const rank_replay& r) {
    // By number: a what-if's ranks need not be the job's, in its order (merged pipeline stages).
    const trace::rank_trace* src = nullptr;
    for (const auto& t : job_.ranks) {
      if (t.rank == r.rank) src = &t;
    }
    const time_axis axis{r.simulated.window, std::max<time_ns>({r.simulated.window.length(), axis_len_, 1}), opt_.timeline_width};
    std::size_t hidden = 0;
    const std::vector<lane> lanes = lanes_of(r, axis.w, hidden);
    time_ns on_path = 0;
    for (const auto& seg : path_.segments) {
      if (g_.rank[seg.task] == r.rank) on_path += seg.end - seg.begin;
    }
    put(out_, "<h3 id=\"%stimeline-rank-%d\">%srank %d — %s, simulated %s (measured %s)</h3>\n", id_prefix_.c_str(),
        r.rank, esc(label_).c_str(), r.rank, esc(r.step).c_str(), ms(r.simulated_ns).c_str(), ms(r.measured_ns).c_str());
    put(out_, "<p class=\"note\">The critical path (of rank %d) runs %s on this rank.%s</p>\n", s_.ranks[slowest_].rank, ms(on_path).c_str(),
        hidden > 0 ? (" " + std::to_string(hidden) + " lanes with the least work not drawn.").c_str() : "");
    const double svg_h = timeline_head + lane_h * static_cast<double>(lanes.size()) + 4;
    put(out_, "<div class=\"scroll\"><svg class=\"timeline\" data-rank=\"%d\" width=\"%.0f\" height=\"%.0f\" role=\"img\">", r.rank,
        timeline_label + axis.width + 10, svg_h);
    // Time axis: about 10 round ticks.
    const double len = static_cast<double>(axis.len);
    const double raw = len / 10.0;
    const double mag = std::pow(10.0, std::floor(std::log10(std::max(raw, 1.0))));
    const double stepv = raw / mag < 2 ? 2 * mag : raw / mag < 5 ? 5 * mag : 10 * mag;
    for (double v = 0; v <= len; v += stepv) {
      const double x = timeline_label + axis.width * v / len;
      put(out_, "<line class=\"grid\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", x, x, timeline_head - 4, svg_h);
      put(out_, "<text class=\"muted\" x=\"%.1f\" y=\"%.1f\">%g ms</text>", x + 2, timeline_head - 8, v / 1e6);
    }
    for (std::size_t k = 0; k < lanes.size(); ++k) timeline_lane(lanes[k], timeline_head + lane_h * static_cast<double>(k), axis, src);
    out_ += "</svg></div>\n";
  }

  // One lane at height `y`: its ops (communication waits apart) and the critical path along it.
  void timeline_lane(const lane& ln, double y, const time_axis& axis, const trace::rank_trace* src) {
    const auto& info = g_.processors[ln.p];
    std::string name = info.name;
    if (name.rfind("rank ", 0) == 0) {  // "rank 3 stream 7": the rank is in the heading already
      const auto sp = name.find(' ', 5);
      if (sp != std::string::npos) name = name.substr(sp + 1);
    }
    put(out_, "<g class=\"lane %s\" data-processor=\"%u\">", ln.gpu ? "gpu-lane" : "cpu-lane", ln.p);
    put(out_, "<text x=\"0\" y=\"%.1f\">%s<title>%s</title></text>", y + 15, esc(name, 24).c_str(), esc(info.name).c_str());
    put(out_, "<rect class=\"lane\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>", timeline_label, y + 1, axis.width, lane_h - 2);
    out_ += "<g transform=\"translate(" + std::to_string(static_cast<int>(timeline_label)) + ",0)\">";
    lane_painter paint(out_, g_, y + 2, lane_h - 8, axis.width);
    for (const auto t : on_processor_[ln.p]) {
      const time_ns b = sim_.begin_of(t), e = sim_.end_of(t);
      if (e < axis.w.begin || b > axis.w.end) continue;
      const auto kind = g_.kind[t];
      if (kind == graph::task_kind::comm_arrive || kind == graph::task_kind::join) continue;
      if (kind == graph::task_kind::comm_complete || kind == graph::task_kind::gpu_comm) {
        const graph::task_id a = arrive_of_[t];
        if (a != graph::no_task && g_.processor[a] == g_.processor[t] && sim_.begin_of(a) < b) {
          paint.add(lane_class::comm_wait, a, axis.px(sim_.begin_of(a)), axis.px(b), sim_.begin_of(a), b);
        }
      }
      if (e <= b) continue;
      paint.add(classify(g_, t, src), t, axis.px(b), axis.px(e), b, e);
    }
    paint.finish();
    // The critical path on this lane: a red strip along the lane's bottom, touching segments
    // merged (a path crosses a lane many times; one strip per run keeps it light).
    std::vector<std::pair<double, double>> strips;
    for (const auto& seg : path_.segments) {
      if (g_.processor[seg.task] != ln.p) continue;
      const double x0 = axis.px(seg.begin), x1 = std::max(axis.px(seg.end), x0 + 0.8);
      if (!strips.empty() && x0 <= strips.back().second + 0.5) {
        strips.back().second = std::max(strips.back().second, x1);
      } else {
        strips.push_back({x0, x1});
      }
    }
    for (const auto& [x0, x1] : strips) {
      put(out_, "<rect class=\"crit\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"3\"/>", x0, y + lane_h - 6, x1 - x0);
    }
    out_ += "</g></g>";
  }

  // One row of the pipeline diagram: a stage, drawn from its first rank.
  struct stage_row {
    std::size_t rank_index;
    std::vector<pipeline_block> blocks;
    std::vector<int> ranks;
  };
  using stage_rows = std::map<std::pair<time_ns, std::size_t>, stage_row>;

  // The point-to-point transfers (`send_recv` collectives, NCCL SendRecv/Send/Recv kernels);
  // `pipeline`: whether ranks exchange any.
  [[nodiscard]] std::vector<std::uint8_t> p2p_tasks(bool& pipeline) const {
    std::vector<std::uint8_t> is_p2p(g_.task_count(), 0);
    pipeline = false;
    for (const auto& ci : g_.collectives) {
      if (ci.kind.find("send") == std::string::npos && ci.kind.find("recv") == std::string::npos && ci.kind.find("Send") == std::string::npos) continue;
      for (const auto c : ci.complete) is_p2p[c] = 1;
      pipeline = pipeline || ci.complete.size() >= 2;
    }
    for (graph::task_id t = 0; t < g_.task_count(); ++t) {
      if (g_.kind[t] != graph::task_kind::gpu_comm) continue;
      const std::string_view n = g_.task_name(t);
      if (n.find("SendRecv") != std::string_view::npos || n.find("ncclKernel_Send") != std::string_view::npos ||
          n.find("ncclKernel_Recv") != std::string_view::npos || n.find("ncclDevKernel_Send") != std::string_view::npos ||
          n.find("ncclDevKernel_Recv") != std::string_view::npos) {
        is_p2p[t] = 1;
        pipeline = true;
      }
    }
    return is_p2p;
  }

  // One row per stage: ranks whose first block starts at the same time (to the tolerance) are
  // alike; stages are ordered by when their first forward starts.
  [[nodiscard]] stage_rows pipeline_stages(const std::vector<std::uint8_t>& is_p2p) const {
    std::vector<graph::processor_id> launcher(g_.task_count(), ~graph::processor_id{0});
    for (const auto& e : g_.edges) {
      if (e.kind == graph::edge_kind::launch) launcher[e.to] = g_.processor[e.from];
    }
    stage_rows by_start;
    for (std::size_t i = 0; i < s_.ranks.size(); ++i) {
      if (s_.plans[i].comm.empty()) continue;
      bool any = false;
      for (const auto& [a, c] : s_.plans[i].comm) any = any || is_p2p[c];
      if (!any) continue;
      std::vector<pipeline_block> blocks = pipeline_blocks(g_, s_, i, is_p2p, launcher);
      if (blocks.empty()) continue;
      const time_ns first = blocks.front().begin / tolerance_;
      const auto key = std::pair(first, blocks.size());
      auto it = by_start.find(key);
      if (it == by_start.end()) it = by_start.emplace(key, stage_row{i, std::move(blocks), {}}).first;
      it->second.ranks.push_back(s_.ranks[i].rank);
    }
    return by_start;
  }

  void pipeline_diagram() {
    bool pipeline = false;
    const std::vector<std::uint8_t> is_p2p = p2p_tasks(pipeline);
    if (!pipeline || s_.ranks.size() < 2) return;
    stage_rows by_start = pipeline_stages(is_p2p);
    if (by_start.size() >= 2) pipeline_svg(by_start);
  }

  // The stage × time diagram of the stages' blocks.
  void pipeline_svg(stage_rows& by_start) {
    time_ns t0 = std::numeric_limits<time_ns>::max(), t1 = std::numeric_limits<time_ns>::min();
    for (const auto& [key, rw] : by_start) {
      t0 = std::min(t0, s_.ranks[rw.rank_index].simulated.window.begin);
      t1 = std::max(t1, s_.ranks[rw.rank_index].simulated.window.end);
    }
    const double width = opt_.timeline_width, label_px = 190, row_h = 26;
    const std::size_t nrows = std::min(by_start.size(), opt_.max_pipeline_rows);
    const time_ns span = std::max<time_ns>(t1 - t0, 1);
    auto px = [&](time_ns v) { return width * static_cast<double>(v - t0) / static_cast<double>(span); };
    out_ += "<section id=\"pipeline\"><h2>Pipeline schedule (stage × time, simulated)</h2>\n"
            "<div class=\"legend\"><span><i style=\"background:#4c78a8\"></i>forward</span>"
            "<span><i style=\"background:#72b7b2\"></i>backward</span><span><i style=\"background:#b279a2\"></i>weight gradient</span>"
            "<span><i style=\"background:#fff;border:1px solid #ccd\"></i>bubble (no compute)</span></div>\n"
            "<p class=\"note\">Blocks are runs of compute on each stage's busiest stream between pipeline transfers; "
            "numbers count the stage's forwards and backwards in order (see report.md of the lumos documentation).</p>\n";
    put(out_, "<div class=\"scroll\"><svg class=\"pipeline\" width=\"%.0f\" height=\"%.0f\" role=\"img\">", label_px + width + 10,
        row_h * static_cast<double>(nrows) + 4);
    std::size_t k = 0;
    for (auto& [key, rw] : by_start) {
      if (k >= nrows) break;
      const double y = row_h * static_cast<double>(k) + 2;
      std::sort(rw.ranks.begin(), rw.ranks.end());
      put(out_, "<g class=\"stage\" data-stage=\"%zu\"><text x=\"0\" y=\"%.1f\">stage %zu: %s</text>", k, y + 16, k,
          esc((rw.ranks.size() == 1 ? "rank " : "ranks ") + rank_ranges(rw.ranks), 18).c_str());
      put(out_, "<rect class=\"pbubble\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>", label_px, y, width, row_h - 4);
      for (const auto& b : rw.blocks) {
        const double x0 = label_px + px(b.begin), w = std::max(px(b.end) - px(b.begin), 0.8);
        const char* cls = b.kind == 'F' ? "pf" : b.kind == 'B' ? "pb" : "pw";
        put(out_, "<rect class=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"><title>%c%d %s</title></rect>", cls, x0, y + 1, w,
            row_h - 6, b.kind, b.index, ms(b.end - b.begin).c_str());
        if (w >= 16) put(out_, "<text x=\"%.1f\" y=\"%.1f\" style=\"fill:#fff;font-size:10px\">%c%d</text>", x0 + 2, y + 15, b.kind, b.index);
      }
      out_ += "</g>";
      ++k;
    }
    out_ += "</svg></div>\n";
    if (nrows < by_start.size()) put(out_, "<p class=\"note\">%zu more stages not drawn.</p>\n", by_start.size() - nrows);
    out_ += "</section>\n";
  }

  // The slowest rank's critical path: time per category and the longest segments.
  void critical_path_tables() {
    out_ += "<section id=\"critical-path\"><h2>Critical path</h2>\n"
            "<p class=\"note\">The chain of tasks and waits that fixed the end of the rank's simulated iteration, walked back to "
            "the start of its window (replay.md of the lumos documentation); red on the timelines above.</p>\n";
    if (!s_.ranks.empty()) {
      const std::size_t i = slowest_;
      const time_ns total = path_.end - path_.begin;
      put(out_, "<h3>rank %d: %s</h3>\n<table class=\"crit-attribution\"><thead><tr><th>category</th><th class=\"n\">time</th>"
                "<th class=\"n\">share</th></tr></thead><tbody>",
          s_.ranks[i].rank, ms(total).c_str());
      for (std::size_t c = 0; c < path_category_count; ++c) {
        if (path_.total[c] == 0) continue;
        put(out_, "<tr><td>%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td></tr>",
            std::string(to_string(static_cast<path_category>(c))).c_str(), ms(path_.total[c]).c_str(),
            pct(total > 0 ? static_cast<double>(path_.total[c]) / static_cast<double>(total) : 0.0).c_str());
      }
      out_ += "</tbody></table>\n";
      longest_segments(s_.ranks[i].simulated.window.begin);
    }
    out_ += "</section>\n";
  }

  // The 12 longest segments of the critical path, longest first (`at`: from `origin`).
  void longest_segments(time_ns origin) {
    std::vector<std::size_t> idx(path_.segments.size());
    for (std::size_t k = 0; k < idx.size(); ++k) idx[k] = k;
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t x, std::size_t y) {
      return path_.segments[x].end - path_.segments[x].begin > path_.segments[y].end - path_.segments[y].begin;
    });
    idx.resize(std::min<std::size_t>(idx.size(), 12));
    put(out_, "<table class=\"crit-segments\"><thead><tr><th class=\"n\">length</th><th>category</th><th>processor</th><th>task</th>"
              "<th class=\"n\">at</th></tr></thead><tbody>");
    for (const auto k : idx) {
      const auto& seg = path_.segments[k];
      put(out_, "<tr><td class=\"n\">%s</td><td>%s</td><td>%s</td><td>%s</td><td class=\"n\">%s</td></tr>", ms(seg.end - seg.begin).c_str(),
          std::string(to_string(seg.category)).c_str(), esc(g_.processors[g_.processor[seg.task]].name, 40).c_str(),
          esc(g_.task_name(seg.task), 90).c_str(), ("+" + ms(seg.begin - origin)).c_str());
    }
    put(out_, "</tbody></table>\n<p class=\"note\">%zu segments; the %zu longest shown.</p>\n", path_.segments.size(), idx.size());
  }

  // Every group of alike ranks (up to 4 × max_rank_rows), compact.
  void ranks_table() {
    // A what-if's distance to the traced run is what the change does, not an error of the model.
    put(out_, "<section id=\"ranks\"><h2>Ranks</h2>\n<table><thead><tr><th>ranks</th><th>step</th><th class=\"n\">measured</th>"
              "<th class=\"n\">%s</th><th class=\"n\">%s</th><th class=\"n\">SM util.</th></tr></thead><tbody>",
        baseline_ != nullptr ? "predicted" : "simulated", baseline_ != nullptr ? "change vs measured" : "error");
    for (std::size_t k = 0; k < groups_.size() && k < 4 * opt_.max_rank_rows; ++k) {
      const rank_replay& r = s_.ranks[groups_[k].members.front()];
      put(out_, "<tr><td>%s</td><td>%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td></tr>",
          esc(rank_ranges(groups_[k].ranks), 60).c_str(), esc(r.step).c_str(), ms(r.measured_ns).c_str(), ms(r.simulated_ns).c_str(),
          (baseline_ != nullptr ? signed_pct(r.simulated_ns, r.measured_ns) : pct(r.error)).c_str(), pct(r.simulated.sm.mean).c_str());
    }
    out_ += "</tbody></table></section>\n";
  }

  const trace::job& job_;
  const replay_session& s_;
  const html_options& opt_;
  const replay_session* baseline_;
  const graph::task_graph& g_;
  const task_times sim_;
  std::string out_;
  std::size_t slowest_ = 0;
  time_ns tolerance_ = 0;
  std::vector<rank_group> groups_;  // by rank
  std::size_t rows_ = 0;            // groups with a bar
  time_ns top_ = 1;                 // the bars' full scale
  std::vector<std::size_t> shown_;  // ranks with a timeline (indices)
  std::vector<std::vector<graph::task_id>> on_processor_;
  std::vector<graph::task_id> arrive_of_;
  critical_path path_;  // the slowest rank's
  time_ns axis_len_ = 0;  // the shortest time axis of a timeline (a what-if's: the baseline's and the prediction's)
  std::string label_;     // what a timeline's heading opens with ("baseline: ")
  std::string id_prefix_;  // of its heading's id
};

}  // namespace detail::html

/// The report of replay `s` of `job` as one HTML document. `baseline`, when given, is the
/// unscaled replay of the same job, shown beside `s` (a what-if). O(tasks + edges) plus the
/// output, which is bounded by the options, not by the job's size.
[[nodiscard]] inline std::string html_report(const trace::job& job, const replay_session& s, const html_options& opt = {},
                                             const replay_session* baseline = nullptr) {
  return detail::html::page(job, s, opt, baseline).write();
}

}  // namespace lumos::report
