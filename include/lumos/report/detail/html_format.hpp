#pragma once
// The HTML report's formatting parts (report/html.hpp): escaping, numbers as text, the colour
// classes of timeline rectangles with the painter that draws one lane, and the page's style.

#include <lumos/core/time.hpp>
#include <lumos/graph/task_graph.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::report {

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

/// "+80.8%": `to` relative to `from`, signed ("-" when `from` is 0).
inline std::string signed_pct(time_ns to, time_ns from) {
  if (from <= 0) return "-";
  const double f = static_cast<double>(to - from) / static_cast<double>(from);
  return (f > 0 ? "+" : "") + pct(f);
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
h3{font-size:14px;margin:16px 0 6px}.sub{color:#5b6473}ul.changes{margin:6px 0 12px;padding-left:20px}ul.changes li{margin:3px 0}
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

}  // namespace lumos::report
