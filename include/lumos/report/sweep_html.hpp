#pragma once
// A finished sweep as one self-contained HTML page (`lumos sweep --report FILE`): the problem and
// the counts, a scatter of every predicted configuration (iteration time, and tokens/s per GPU,
// against memory per GPU, coloured by pipeline schedule) with the Pareto front of time against
// memory drawn over it and listed, the K fastest with their 4-way breakdowns, and the rejections
// counted per reason.
//
// In the style of the replay report (report/html.hpp, whose escaping, number formatting and CSS
// it shares): inline CSS and SVG, no script, nothing loaded. Every point is an SVG element of
// class "config" with the configuration in data attributes and a tooltip, so that a reader (or a
// test) finds each configuration in the page. The page depends only on the problem and the
// ordered results, so it is the same bytes for any thread count and any number of MPI processes.

#include <lumos/core/time.hpp>
#include <lumos/model/hardware.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/report/breakdown.hpp>
#include <lumos/report/detail/html_format.hpp>
#include <lumos/sweep/evaluate.hpp>
#include <lumos/sweep/sweep.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lumos::report {

/// What `sweep_html` shows besides the results.
struct sweep_html_options {
  std::string title{};    ///< empty: "lumos sweep: MODEL on N × GPU"
  std::string profile{};  ///< the name of the cost model's profile, shown in the header
  std::size_t top = 10;  ///< rows of the ranking
};

namespace detail::sweep_page {

using html::esc;
using html::escape;
using html::pct;
using html::put;

inline constexpr double gib = 1024.0 * 1024.0 * 1024.0;

/// Schedule colours (by order of first appearance in the results); more schedules repeat them.
inline constexpr std::array<const char*, 8> palette = {"#4c78a8", "#f58518", "#54a24b", "#e45756",
                                                       "#72b7b2", "#b279a2", "#eeca3b", "#9d755d"};

inline constexpr std::string_view css = R"(
.charts{display:flex;flex-wrap:wrap;gap:18px}.chart .axis{stroke:#8c96a5;stroke-width:1}
.chart circle{fill-opacity:.72;stroke:#fff;stroke-width:.5}.chart circle.front{stroke:#1d2430;stroke-width:1.2;fill-opacity:1}
.pareto-line{fill:none;stroke:#d62728;stroke-width:1.6}.limit{stroke:#d62728;stroke-width:1;stroke-dasharray:4 3}
svg.split{vertical-align:middle}
)";

/// An axis from `lo` to `hi` with ticks at multiples of a 1-2-5 step (about five of them).
struct axis {
  double lo = 0, hi = 1, step = 1;

  static axis nice(double min, double max, bool from_zero) {
    if (from_zero) min = 0;
    if (!(max > min)) max = min + (min > 0 ? min : 1);
    const double raw = (max - min) / 5;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    double by = 10 * mag;
    for (const double f : {1.0, 2.0, 5.0}) {
      if (f * mag >= raw) {
        by = f * mag;
        break;
      }
    }
    return {std::floor(min / by) * by, std::ceil(max / by) * by, by};
  }
  [[nodiscard]] double at(double v, double length) const { return length * (v - lo) / (hi - lo); }
};

/// "8" or "2.5": a tick label without trailing zeros.
inline std::string tick(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", std::abs(v) < 1e-12 ? 0.0 : v);
  return buf;
}

/// One predicted configuration in the charts' units.
struct point {
  std::size_t index = 0;
  double memory_gib = 0;
  double iteration_ms = 0;
  double tokens_per_gpu = 0;
  std::size_t schedule = 0;  ///< colour
  bool front = false;
};

// The page, section by section; the points, the schedules and the front are found once.
class page {
 public:
  page(const sweep::problem& p, const std::vector<sweep::result>& rs, const sweep_html_options& opt)
      : p_(p), rs_(rs), opt_(opt), counts_(sweep::count_reasons(rs)), front_(sweep::pareto_front(rs)), precisions_(sweep::precisions(rs)) {
    std::vector<bool> on_front(rs_.size(), false);
    for (const std::size_t i : front_) on_front[i] = true;
    const double gpus = static_cast<double>(std::max<std::int64_t>(p_.gpus, 1));
    for (std::size_t i = 0; i < rs_.size(); ++i) {
      const sweep::result& r = rs_[i];
      if (!r.ok() || !r.predicted) continue;
      const std::string_view name = r.config.schedule.name;
      auto it = std::find(schedules_.begin(), schedules_.end(), name);
      if (it == schedules_.end()) it = schedules_.insert(schedules_.end(), name);
      points_.push_back({i, r.memory_bytes / gib, static_cast<double>(r.m.iteration_ns) / 1e6, r.m.tokens_per_s / gpus,
                         static_cast<std::size_t>(it - schedules_.begin()), on_front[i]});
    }
  }

  std::string write() {
    out_.reserve(4096 + 700 * points_.size());
    head();
    summary();
    charts();
    pareto_table();
    top_table();
    rejected_table();
    out_ += "<p class=\"note\">Generated by <code>lumos sweep --report</code>. Every figure is the prediction "
            "<code>lumos predict</code> makes for the configuration (docs/sweep.md); the page holds no script and loads "
            "nothing.</p>\n</body></html>\n";
    return std::move(out_);
  }

 private:
  static constexpr double chart_w = 660, chart_h = 420, left = 72, right = 16, top = 14, bottom = 48;
  static constexpr double plot_w = chart_w - left - right, plot_h = chart_h - top - bottom;

  [[nodiscard]] std::string title() const {
    if (!opt_.title.empty()) return opt_.title;
    return "lumos sweep: " + p_.model.name + " on " + std::to_string(p_.gpus) + " × " + p_.hardware.name;
  }
  [[nodiscard]] std::size_t predicted() const { return points_.size(); }

  void head() {
    out_ += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\n<title>";
    escape(out_, title());
    out_ += "</title>\n<style>";
    out_ += html::css;
    out_ += css;
    for (std::size_t k = 0; k < palette.size(); ++k) put(out_, ".s%zu{fill:%s}", k, palette[k]);
    out_ += "\n</style></head>\n<body>\n<h1>";
    escape(out_, title());
    out_ += "</h1>\n";
  }

  void card(const std::string& value, const char* label, const char* id) {
    put(out_, "<div class=\"card\" id=\"%s\"><b>%s</b><span>%s</span></div>", id, value.c_str(), label);
  }

  // The problem, the space and its outcome in counts.
  void summary() {
    const model::transformer& m = p_.model;
    put(out_, "<p class=\"sub\">%s (%lld layers, hidden %lld, %lld heads, sequence %lld) on %lld × %s, %s, global batch %lld",
        esc(m.name).c_str(), static_cast<long long>(m.layers), static_cast<long long>(m.hidden), static_cast<long long>(m.heads),
        static_cast<long long>(m.seq),
        static_cast<long long>(p_.gpus), esc(p_.hardware.name).c_str(), sweep::precision_names(precisions_, "/").c_str(),
        static_cast<long long>(p_.global_batch));
    if (!opt_.profile.empty()) out_ += ", profile " + esc(opt_.profile);
    out_ += "</p>\n<section id=\"summary\"><div class=\"cards\">";
    card(std::to_string(rs_.size()), "configurations in the space", "card-space");
    card(std::to_string(predicted()), "predicted", "card-predicted");
    card(std::to_string(rs_.size() - counts_[0]), "rejected", "card-rejected");
    const auto best = sweep::top(rs_, 1);
    if (!best.empty()) card(html::ms(rs_[best.front()].m.iteration_ns), "fastest iteration", "card-fastest");
    card(std::to_string(front_.size()), "on the time–memory Pareto front", "card-front");
    out_ += "</div>\n";
    put(out_, "<p class=\"note\">A configuration fits when its largest per-GPU memory is at most %s of the GPU's %.1f GiB "
              "(memory margin %s).</p></section>\n",
        pct(1.0 - p_.memory_margin).c_str(), static_cast<double>(p_.hardware.gpu.hbm_capacity) / gib, pct(p_.memory_margin).c_str());
  }

  // The two scatters side by side, with the schedules' legend above them.
  void charts() {
    out_ += "<section id=\"scatter\"><h2>Every predicted configuration</h2>\n";
    if (points_.empty()) {
      out_ += "<p>No configuration of the space fits: nothing to draw.</p></section>\n";
      return;
    }
    out_ += "<div class=\"legend\">";
    for (std::size_t k = 0; k < schedules_.size(); ++k) {
      put(out_, "<span data-schedule=\"%s\"><i style=\"background:%s\"></i>%s</span>", esc(schedules_[k]).c_str(),
          palette[k % palette.size()], esc(schedules_[k]).c_str());
    }
    out_ += "<span><i style=\"background:#d62728\"></i>Pareto front of time against memory</span></div>\n"
            "<p class=\"note\">One point per configuration, coloured by pipeline schedule; its tooltip names it. The red line "
            "joins the configurations no other one beats on both iteration time and memory per GPU (outlined points); the "
            "dashed line is the memory limit.</p>\n<div class=\"charts\">";
    scatter("time-memory", "iteration time (ms)", false);
    scatter("throughput-memory", "tokens/s per GPU", true);
    out_ += "</div></section>\n";
  }

  [[nodiscard]] double value(const point& q, bool throughput) const { return throughput ? q.tokens_per_gpu : q.iteration_ms; }

  // One scatter against memory per GPU: iteration time, or tokens/s per GPU (`throughput`).
  void scatter(const char* id, const char* y_label, bool throughput) {
    const double limit_gib = (1.0 - p_.memory_margin) * static_cast<double>(p_.hardware.gpu.hbm_capacity) / gib;
    double x_max = limit_gib, y_min = value(points_.front(), throughput), y_max = y_min;
    for (const point& q : points_) {
      x_max = std::max(x_max, q.memory_gib);
      y_min = std::min(y_min, value(q, throughput));
      y_max = std::max(y_max, value(q, throughput));
    }
    const axis x = axis::nice(0, x_max, true), y = axis::nice(y_min, y_max, throughput);
    put(out_, "<svg class=\"chart\" id=\"%s\" width=\"%.0f\" height=\"%.0f\" role=\"img\">", id, chart_w, chart_h);
    axes(x, y, y_label);
    const double lx = left + x.at(limit_gib, plot_w);
    put(out_, "<line class=\"limit\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"><title>memory limit: %.1f GiB</title></line>", lx, top,
        lx, top + plot_h, limit_gib);
    for (const point& q : points_) dot(q, x, y, throughput);
    out_ += "<polyline class=\"pareto-line\" points=\"";
    for (const std::size_t i : front_) {
      const auto at = std::lower_bound(points_.begin(), points_.end(), i, [](const point& q, std::size_t v) { return q.index < v; });
      put(out_, "%.1f,%.1f ", left + x.at(at->memory_gib, plot_w), top + plot_h - y.at(value(*at, throughput), plot_h));
    }
    out_ += "\"/></svg>\n";
  }

  // The frame, the grid lines and their labels.
  void axes(const axis& x, const axis& y, const char* y_label) {
    for (double v = x.lo; v <= x.hi + x.step / 2; v += x.step) {
      const double px = left + x.at(v, plot_w);
      put(out_, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", px, top, px, top + plot_h);
      put(out_, "<text class=\"muted\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>", px, top + plot_h + 16, tick(v).c_str());
    }
    for (double v = y.lo; v <= y.hi + y.step / 2; v += y.step) {
      const double py = top + plot_h - y.at(v, plot_h);
      put(out_, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", left, py, left + plot_w, py);
      put(out_, "<text class=\"muted\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>", left - 6, py + 4, tick(v).c_str());
    }
    put(out_, "<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", left, top + plot_h, left + plot_w, top + plot_h);
    put(out_, "<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", left, top, left, top + plot_h);
    put(out_, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">memory per GPU (GiB)</text>", left + plot_w / 2, chart_h - 8);
    put(out_, "<text x=\"14\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 14 %.1f)\">%s</text>", top + plot_h / 2,
        top + plot_h / 2, y_label);
  }

  // Whether the configurations' precisions are shown (only when the sweep has several).
  [[nodiscard]] bool several_precisions() const { return precisions_.size() > 1; }

  // "tp 2 · pp 4 · dp 2 · vp 1 · mb 2 · 1f1b · recompute full · sp on" (" · fp8" with several precisions).
  [[nodiscard]] std::string describe(const sweep::configuration& c) const {
    std::string s;
    put(s, "tp %d · pp %d · dp %d · vp %d · mb %lld · ", c.tp, c.pp, c.dp, c.vp, static_cast<long long>(c.micro_batch));
    s += esc(c.schedule.name);
    s += " · recompute " + std::string(model::to_string(c.recompute)) + (c.sp ? " · sp on" : " · sp off");
    if (several_precisions()) s += " · " + std::string(model::to_string(c.dtype));
    return s;
  }

  // The configuration's identity as data attributes (the CSV's columns).
  void identity(const sweep::result& r, std::size_t index) {
    const sweep::configuration& c = r.config;
    put(out_, " data-index=\"%zu\" data-tp=\"%d\" data-pp=\"%d\" data-dp=\"%d\" data-vp=\"%d\" data-mb=\"%lld\"", index, c.tp, c.pp, c.dp,
        c.vp, static_cast<long long>(c.micro_batch));
    out_ += " data-schedule=\"" + esc(c.schedule.name) + "\" data-recompute=\"" + std::string(model::to_string(c.recompute)) +
            "\" data-sp=\"" + (c.sp ? "on" : "off") + "\"";
    if (several_precisions()) out_ += " data-precision=\"" + std::string(model::to_string(c.dtype)) + "\"";
    put(out_, " data-iteration-ms=\"%.6f\" data-memory-gib=\"%.4f\"", static_cast<double>(r.m.iteration_ns) / 1e6, r.memory_bytes / gib);
  }

  // A point: the time chart's carry class "config" and the configuration; the throughput
  // chart's the same tooltip under class "config-throughput".
  void dot(const point& q, const axis& x, const axis& y, bool throughput) {
    const sweep::result& r = rs_[q.index];
    put(out_, "<circle class=\"%s s%zu%s\" cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\"", throughput ? "config-throughput" : "config",
        q.schedule % palette.size(), q.front ? " front" : "", left + x.at(q.memory_gib, plot_w),
        top + plot_h - y.at(value(q, throughput), plot_h), q.front ? 4.5 : 3.5);
    if (!throughput) identity(r, q.index);
    put(out_, "><title>#%zu: ", q.index);
    out_ += describe(r.config);
    put(out_, " — %.3f ms, %.2f GiB, MFU %s, %.0f tokens/s per GPU%s</title></circle>", q.iteration_ms, q.memory_gib,
        pct(r.m.mfu).c_str(), q.tokens_per_gpu, q.front ? " (Pareto front)" : "");
  }

  // The table header of a list of configurations, then `extra` columns.
  void config_header(const char* extra) {
    put(out_, "<thead><tr><th class=\"n\">#</th><th class=\"n\">tp</th><th class=\"n\">pp</th><th class=\"n\">dp</th><th class=\"n\">vp</th>"
              "<th class=\"n\">mb</th><th>schedule</th><th>recompute</th><th>sp</th>%s<th class=\"n\">iteration</th>"
              "<th class=\"n\">memory/GPU</th><th class=\"n\">MFU</th>%s</tr></thead><tbody>",
        several_precisions() ? "<th>precision</th>" : "", extra);
  }

  // The cells of a configuration's row, after its first cell.
  void config_cells(const sweep::result& r) {
    const sweep::configuration& c = r.config;
    put(out_, "<td class=\"n\">%d</td><td class=\"n\">%d</td><td class=\"n\">%d</td><td class=\"n\">%d</td><td class=\"n\">%lld</td>", c.tp,
        c.pp, c.dp, c.vp, static_cast<long long>(c.micro_batch));
    out_ += "<td>" + esc(c.schedule.name) + "</td><td>" + std::string(model::to_string(c.recompute)) + "</td><td>" +
            (c.sp ? "on" : "off") + "</td>";
    if (several_precisions()) out_ += "<td>" + std::string(model::to_string(c.dtype)) + "</td>";
    put(out_, "<td class=\"n\">%s</td><td class=\"n\">%.2f GiB</td><td class=\"n\">%s</td>", html::ms(r.m.iteration_ns).c_str(),
        r.memory_bytes / gib, pct(r.m.mfu).c_str());
  }

  // The front, by memory: each row a configuration no other one beats on both axes.
  void pareto_table() {
    out_ += "<section id=\"front\"><h2>Pareto front: iteration time against memory per GPU</h2>\n"
            "<p class=\"note\">The configurations no other one beats on both iteration time and memory per GPU, from the "
            "smallest memory up: each is the fastest within its memory. # is the configuration's index in the CSV and JSON "
            "(<code>--csv</code>, <code>--json</code>).</p>\n<table id=\"pareto\">";
    config_header("<th class=\"n\">tokens/s per GPU</th>");
    const double gpus = static_cast<double>(std::max<std::int64_t>(p_.gpus, 1));
    for (const std::size_t i : front_) {
      out_ += "<tr class=\"front-row\"";
      identity(rs_[i], i);
      put(out_, "><td class=\"n\">%zu</td>", i);
      config_cells(rs_[i]);
      put(out_, "<td class=\"n\">%.0f</td></tr>", rs_[i].m.tokens_per_s / gpus);
    }
    out_ += "</tbody></table></section>\n";
  }

  // A breakdown as a small stacked bar, each part with its tooltip.
  void split_bar(const breakdown& b) {
    constexpr double w = 160, h = 12;
    const std::array<std::pair<time_ns, const char*>, 4> parts = {
        {{b.exposed_compute, "b-compute"}, {b.overlapped, "b-overlap"}, {b.exposed_comm, "b-comm"}, {b.other, "b-other"}}};
    constexpr std::array<const char*, 4> names = {"exposed compute", "overlap", "exposed communication", "other (GPU idle)"};
    const double whole = static_cast<double>(std::max<time_ns>(b.total(), 1));
    put(out_, "<svg class=\"split\" width=\"%.0f\" height=\"%.0f\" role=\"img\">", w, h);
    double x = 0;
    for (std::size_t k = 0; k < parts.size(); ++k) {
      const double part = w * static_cast<double>(parts[k].first) / whole;
      if (part <= 0) continue;
      put(out_, "<rect class=\"%s\" x=\"%.2f\" y=\"0\" width=\"%.2f\" height=\"%.0f\"><title>%s: %s (%s)</title></rect>", parts[k].second, x,
          part, h, names[k], html::ms(parts[k].first).c_str(), pct(static_cast<double>(parts[k].first) / whole).c_str());
      x += part;
    }
    out_ += "</svg>";
  }

  // The K fastest, as the text table ranks them, each with its breakdown.
  void top_table() {
    const auto best = sweep::top(rs_, opt_.top);
    put(out_, "<section id=\"ranking\"><h2>The %zu fastest configurations</h2>\n", best.size());
    out_ += "<div class=\"legend\"><span><i style=\"background:#4c78a8\"></i>exposed compute</span>"
            "<span><i style=\"background:#9d6fbf\"></i>compute overlapped with communication</span>"
            "<span><i style=\"background:#f58518\"></i>exposed communication</span>"
            "<span><i style=\"background:#e3e7ee\"></i>other (GPU idle)</span></div>\n"
            "<p class=\"note\">Each bar splits the first GPU's iteration by what it runs at every instant: compute alone "
            "(exposed compute), compute and communication together (overlap), communication alone (exposed communication) or "
            "nothing (other: pipeline bubbles and waits), so the four parts add up to the iteration.</p>\n<table id=\"top\">";
    config_header("<th class=\"n\">bubble</th><th>breakdown</th>");
    for (std::size_t k = 0; k < best.size(); ++k) {
      const sweep::result& r = rs_[best[k]];
      out_ += "<tr class=\"top-row\"";
      identity(r, best[k]);
      put(out_, "><td class=\"n\">%zu</td>", k + 1);
      config_cells(r);
      put(out_, "<td class=\"n\">%s</td><td>", pct(r.m.bubble_fraction).c_str());
      split_bar(r.m.breakdown);
      out_ += "</td></tr>";
    }
    out_ += "</tbody></table></section>\n";
  }

  // The rejections per reason, each with the message of its first configuration.
  void rejected_table() {
    put(out_, "<section id=\"rejections\"><h2>Rejected configurations: %zu</h2>\n", rs_.size() - counts_[0]);
    out_ += "<table id=\"rejected\"><thead><tr><th>reason</th><th class=\"n\">configurations</th><th>first one</th></tr></thead><tbody>";
    for (std::size_t k = 1; k < counts_.size(); ++k) {
      if (counts_[k] == 0) continue;
      const sweep::rejection reason = sweep::all_rejections[k];
      const auto first = std::find_if(rs_.begin(), rs_.end(), [&](const sweep::result& r) { return r.reason == reason; });
      const std::string name(sweep::to_string(reason));
      put(out_, "<tr data-reason=\"%s\" data-count=\"%zu\"><td>%s</td><td class=\"n\">%zu</td><td>#%zu: ", name.c_str(), counts_[k],
          name.c_str(), counts_[k], static_cast<std::size_t>(first - rs_.begin()));
      escape(out_, first->why(), 200);
      out_ += "</td></tr>";
    }
    out_ += "</tbody></table></section>\n";
  }

  const sweep::problem& p_;
  const std::vector<sweep::result>& rs_;
  const sweep_html_options& opt_;
  std::array<std::size_t, sweep::all_rejections.size()> counts_;
  std::vector<std::size_t> front_;  // by memory
  std::vector<model::precision> precisions_;  // of the results, by first appearance
  std::vector<std::string_view> schedules_;  // by first appearance
  std::vector<point> points_;  // by index
  std::string out_;
};

}  // namespace detail::sweep_page

/// The sweep of problem `p` (`rs`: every configuration's result, in order) as one HTML document:
/// the counts, a scatter of every predicted configuration against memory per GPU with the Pareto
/// front of time against memory, the K fastest with their breakdowns, and the rejections per
/// reason. O(results log results) plus the output, which holds a few hundred bytes per predicted
/// configuration.
[[nodiscard]] inline std::string sweep_html(const sweep::problem& p, const std::vector<sweep::result>& rs,
                                            const sweep_html_options& opt = {}) {
  return detail::sweep_page::page(p, rs, opt).write();
}

}  // namespace lumos::report
