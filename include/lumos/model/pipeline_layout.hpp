#pragma once
// An explicit split of a model's layers over the virtual pipeline stages: Megatron-LM's
// --pipeline-model-parallel-layout, and its --decoder-first/last-pipeline-num-layers.

#include <lumos/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

namespace lumos::model {

/// Transformer layers and multi-token-prediction blocks per virtual stage, in virtual-stage order
/// (virtual stage v = chunk * pp + stage, Megatron's interleaved order). The embedding sits on
/// virtual stage 0 and the loss on the last one, and the MTP blocks all follow the loss's stage's
/// transformer layers (Megatron places them there: they read the decoder's last hidden states).
/// Empty = no explicit layout: `parallel_config` splits the layers evenly.
struct pipeline_layout {
  /// Blocks (transformer layers + MTP blocks) of each virtual stage.
  std::vector<std::int64_t> blocks;
  /// MTP blocks, all of them in the last virtual stage (counted in its `blocks`).
  std::int64_t mtp = 0;

  [[nodiscard]] constexpr bool empty() const noexcept { return blocks.empty(); }
  [[nodiscard]] constexpr int virtual_stages() const noexcept { return static_cast<int>(blocks.size()); }
  /// Transformer layers over all virtual stages (the MTP blocks left out).
  [[nodiscard]] constexpr std::int64_t layers() const noexcept {
    return std::accumulate(blocks.begin(), blocks.end(), std::int64_t{0}) - mtp;
  }
  /// Megatron's string for the layout ("Et*4|t*4|t*3tL" style, one group per virtual stage).
  [[nodiscard]] std::string to_string() const {
    std::string s;
    for (std::size_t v = 0; v < blocks.size(); ++v) {
      if (v > 0) s += '|';
      if (v == 0) s += 'E';
      const std::int64_t t = blocks[v] - (v + 1 == blocks.size() ? mtp : 0);
      if (t > 0) s += t == 1 ? std::string("t") : "t*" + std::to_string(t);
      if (v + 1 == blocks.size()) s += (mtp == 0 ? std::string() : mtp == 1 ? std::string("m") : "m*" + std::to_string(mtp)) + "L";
    }
    return s;
  }
};

namespace detail {

// Recursive-descent expansion of the layout grammar into one symbol per item:
//   seq  := item*        item := atom ('*' count)?        atom := 'E' | 't' | 'm' | 'L' | '|' | '(' seq ')'
class layout_parser {
 public:
  explicit layout_parser(std::string_view text) : text_(text) {}

  std::string expand() {
    std::string out = sequence();
    if (pos_ < text_.size()) fail(text_[pos_] == ')' ? "')' without a matching '('" : "unexpected '" + std::string(1, text_[pos_]) + "'");
    return out;
  }

  [[noreturn]] void fail(const std::string& what) const { fail_at(pos_, what); }
  [[noreturn]] void fail_at(std::size_t at, const std::string& what) const {
    throw error("pipeline layout '" + std::string(text_) + "': at character " + std::to_string(at + 1) + ": " + what +
                " (Megatron's syntax: E embedding, t transformer layer, m multi-token-prediction block, L loss, "
                "| virtual-stage boundary, x*n and (...)*n repetition)");
  }

 private:
  // A bound on the expanded layout: far beyond any model, small enough to refuse "(t*99999)*99999".
  static constexpr std::size_t max_symbols = std::size_t{1} << 20;
  static constexpr int max_depth = 64;

  std::string sequence() {
    std::string out;
    while (pos_ < text_.size() && text_[pos_] != ')') {
      const std::string one = atom();
      std::int64_t n = 1;
      if (pos_ < text_.size() && text_[pos_] == '*') n = count();
      if (static_cast<double>(one.size()) * static_cast<double>(n) + static_cast<double>(out.size()) > max_symbols) {
        fail("the layout expands to more than " + std::to_string(max_symbols) + " items");
      }
      for (std::int64_t i = 0; i < n; ++i) out += one;
    }
    return out;
  }

  std::string atom() {
    const char c = text_[pos_];
    if (c == 'E' || c == 't' || c == 'm' || c == 'L' || c == '|') {
      ++pos_;
      return std::string(1, c);
    }
    if (c == '(') {
      // The recursion's depth, bounded: a string of a million '(' must not exhaust the stack.
      if (++depth_ > max_depth) fail("groups nested more than " + std::to_string(max_depth) + " deep");
      const std::size_t open = pos_++;
      std::string inner = sequence();
      --depth_;
      if (pos_ >= text_.size()) fail_at(open, "'(' is not closed");
      ++pos_;
      if (inner.empty()) fail_at(open, "empty group '()'");
      return inner;
    }
    if (c == '*') fail("'*' must follow an item or a group");
    fail("unexpected '" + std::string(1, c) + "'");
  }

  // "*n" after an item: n >= 0 (Megatron accepts "*0", which drops the item).
  std::int64_t count() {
    ++pos_;
    const std::size_t start = pos_;
    std::int64_t n = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      n = n * 10 + (text_[pos_] - '0');
      if (n > static_cast<std::int64_t>(max_symbols)) fail_at(start, "repetition count too large");
      ++pos_;
    }
    if (pos_ == start) fail("expected a count after '*'");
    return n;
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace detail

/// Parses Megatron's --pipeline-model-parallel-layout string, e.g. "Et*4|(t*4|)*14tL": E the
/// embedding, t a transformer layer, m a multi-token-prediction block, L the loss, | the boundary
/// between virtual stages (listed in virtual-stage order), x*n and (...)*n repetition. Throws
/// `lumos::error` naming the character at fault: bad syntax, an empty virtual stage, E anywhere
/// but first, L anywhere but last, or an MTP block outside the last virtual stage or before a
/// transformer layer. Whether the counts fit the model and pp x vp is `parallel_config::validate`'s.
[[nodiscard]] inline pipeline_layout parse_pipeline_layout(std::string_view text) {
  detail::layout_parser p(text);
  const std::string items = p.expand();
  if (items.empty()) p.fail_at(0, "the layout is empty");
  pipeline_layout out;
  out.blocks.push_back(0);
  bool stage_has_item = false, seen_mtp = false;
  auto fail = [&](const std::string& what) {
    throw error("pipeline layout '" + std::string(text) + "': " + what);
  };
  auto close_stage = [&] {
    if (!stage_has_item) fail("virtual stage " + std::to_string(out.blocks.size() - 1) + " holds nothing");
  };
  for (std::size_t i = 0; i < items.size(); ++i) {
    const char c = items[i];
    auto where = [&] { return "virtual stage " + std::to_string(out.blocks.size() - 1); };
    if (c == '|') {
      close_stage();
      out.blocks.push_back(0);
      stage_has_item = false;
      continue;
    }
    stage_has_item = true;
    if (c == 'E' && i != 0) fail("E (the embedding) must come first, found it again in " + where());
    if (c != 'E' && i == 0) fail("the layout must start with E (the embedding on virtual stage 0)");
    if (c == 'L' && i + 1 != items.size()) fail("L (the loss) must come last, found it in " + where() + " before other items");
    if (c == 't' && seen_mtp) fail("a transformer layer follows a multi-token-prediction block in " + where());
    if (c == 't' || c == 'm') ++out.blocks.back();
    if (c == 'm') {
      seen_mtp = true;
      ++out.mtp;
    }
  }
  close_stage();
  if (items.back() != 'L') fail("the layout must end with L (the loss on the last virtual stage)");
  if (out.mtp > 0 && items.find('|', items.find('m')) != std::string::npos) {
    fail("multi-token-prediction blocks (m) must all be in the last virtual stage, beside the loss");
  }
  return out;
}

/// Megatron's --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers: `first`
/// transformer layers on pipeline stage 0 and `last` on stage pp - 1 (-1: not given), the others
/// split evenly over the stages between, and each stage's layers evenly over its `vp` chunks (the
/// counts must divide so, Megatron's rule; the MTP blocks join the last virtual stage). Throws
/// `lumos::error` for counts that do not fit.
[[nodiscard]] inline pipeline_layout uneven_first_last_layout(std::int64_t layers, std::int64_t mtp, int pp, int vp,
                                                              std::int64_t first, std::int64_t last) {
  if (pp < 2 || vp < 1) throw error("uneven first/last pipeline stages need pp >= 2");
  const int middle = pp - (first >= 0 ? 1 : 0) - (last >= 0 ? 1 : 0);
  const std::int64_t rest = layers - (first >= 0 ? first : 0) - (last >= 0 ? last : 0);
  auto count = [](std::int64_t n) { return n >= 0 ? std::to_string(n) : std::string("not given"); };
  const std::string given = "decoder first/last pipeline layers (" + count(first) + ", " + count(last) + ")";
  if (rest < 0 || (middle == 0 && rest != 0) || (middle > 0 && rest % middle != 0)) {
    throw error(given + " leave " + std::to_string(rest) + " of " + std::to_string(layers) + " layers for " +
                std::to_string(middle) + " middle pipeline stages: they must split evenly (Megatron's rule)");
  }
  const std::int64_t per_stage = middle > 0 ? rest / middle : 0;
  for (const std::int64_t n : {first, last, per_stage}) {
    if (n > 0 && n % vp != 0) {
      throw error(given + ": a stage's " + std::to_string(n) + " layers do not split evenly over vp = " + std::to_string(vp) +
                  " chunks (Megatron's rule)");
    }
  }
  pipeline_layout out;
  out.blocks.resize(static_cast<std::size_t>(pp) * static_cast<std::size_t>(vp));
  for (int c = 0; c < vp; ++c) {
    for (int s = 0; s < pp; ++s) {
      const std::int64_t n = s == 0 && first >= 0 ? first : s == pp - 1 && last >= 0 ? last : per_stage;
      out.blocks[static_cast<std::size_t>(c) * static_cast<std::size_t>(pp) + static_cast<std::size_t>(s)] = n / vp;
    }
  }
  out.blocks.back() += mtp;
  out.mtp = mtp;
  return out;
}

}  // namespace lumos::model
