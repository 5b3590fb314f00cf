#pragma once
// What a what-if rewrite did, as data: the subject it changed (from -> to), the figures it
// measured before and after, and the sentence that explains it. The CLI, the JSON, the HTML
// report and the Python module format these records; the rewrites never print.

#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace lumos::whatif {

/// A number a change reports: a quantity before and after the rewrite (`before == after` for a
/// plain count). `unit` is "ns", "bytes" or empty for a count.
struct figure {
  std::string name;
  double before = 0;
  double after = 0;
  std::string unit;

  friend bool operator==(const figure&, const figure&) = default;
};

/// One change a rewrite pass made, or a note about how it made it.
///
/// `subject`, `from` and `to` make the headline ("layers 8 -> 16", "GPU h100-sxm -> h200-sxm");
/// a note that changes no setting leaves `from` and `to` empty. `text` is the full sentence:
/// what was rewritten, with which model, what stayed as traced and why.
struct change {
  std::string pass;     ///< the pass that made it: "shape", "data parallel", ... (a user's pass names itself)
  std::string subject;  ///< what changed: "layers", "TP", "DP", "GPU", "micro-batches per replica", ...
  std::string from;     ///< the subject's traced value ("" for a note)
  std::string to;       ///< the subject's target value ("" for a note)
  std::vector<figure> figures;
  std::string text;

  /// "subject from -> to", or the subject alone for a note.
  [[nodiscard]] std::string headline() const {
    if (from.empty() && to.empty()) return subject;
    return subject + " " + from + " -> " + to;
  }

  /// This change with `more` figures.
  [[nodiscard]] change with(std::vector<figure> more) && {
    figures.insert(figures.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
    return std::move(*this);
  }

  friend bool operator==(const change&, const change&) = default;
};

/// The changes of one pass, in the order it made them.
using change_list = std::vector<change>;

/// A note of `pass` (no setting changed): how a rewrite was made, or why one was not.
[[nodiscard]] inline change note(std::string pass, std::string subject, std::string text) {
  change c;
  c.pass = std::move(pass);
  c.subject = std::move(subject);
  c.text = std::move(text);
  return c;
}

/// A change of `subject` from `from` to `to`, explained by `text`.
[[nodiscard]] inline change changed(std::string pass, std::string subject, std::string from, std::string to, std::string text,
                                    std::vector<figure> figures = {}) {
  change c;
  c.pass = std::move(pass);
  c.subject = std::move(subject);
  c.from = std::move(from);
  c.to = std::move(to);
  c.figures = std::move(figures);
  c.text = std::move(text);
  return c;
}

/// A figure of time in nanoseconds.
[[nodiscard]] inline figure time_figure(std::string name, std::int64_t before, std::int64_t after) {
  return {std::move(name), static_cast<double>(before), static_cast<double>(after), "ns"};
}

/// `v` with `digits` decimals, as a change's `from` or `to`.
[[nodiscard]] inline std::string decimal(double v, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, v);
  return text;
}

/// A count (the same before and after).
[[nodiscard]] inline figure count_figure(std::string name, std::size_t n) {
  return {std::move(name), static_cast<double>(n), static_cast<double>(n), ""};
}

}  // namespace lumos::whatif
