#pragma once
// string_table — interns strings to dense 32-bit ids.

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lumos {

/// Dense id of an interned string; `no_string` marks "absent".
using string_id = std::uint32_t;
inline constexpr string_id no_string = ~string_id{0};

/// Interns strings: equal strings get equal ids, ids are dense from 0 in first-seen order, and
/// the views returned stay valid for the table's lifetime (storage is chunked, never moved).
/// Lookup is one hash plus, usually, one comparison (open addressing, linear probing, load ≤ 1/2).
class string_table {
 public:
  string_table() { rehash(16); }
  /// A copy owns its text (the views point into the copy's storage) and keeps every id.
  string_table(const string_table& o)
      : next_chunk_(o.next_chunk_), hashes_(o.hashes_), slots_(o.slots_), mask_(o.mask_) {
    std::size_t total = 0;
    for (const std::string_view v : o.views_) total += v.size();
    if (total > 0) {
      chunks_.push_back(std::make_unique<char[]>(total));
      text_bytes_ = total;
    }
    char* p = total > 0 ? chunks_.back().get() : nullptr;
    views_.reserve(o.views_.size());
    for (const std::string_view v : o.views_) {
      if (v.empty()) {
        views_.emplace_back();
        continue;
      }
      std::memcpy(p, v.data(), v.size());
      views_.emplace_back(p, v.size());
      p += v.size();
    }
    chunk_pos_ = p;  // the chunk is full: the next new string starts another
  }
  string_table& operator=(const string_table& o) {
    if (this != &o) *this = string_table(o);
    return *this;
  }
  string_table(string_table&&) noexcept = default;
  string_table& operator=(string_table&&) noexcept = default;
  ~string_table() = default;

  /// Id of `s`, adding it if new. Amortised O(|s|).
  string_id intern(std::string_view s) {
    const std::uint64_t h = hash(s);
    const auto tag = static_cast<std::uint32_t>(h >> 32);
    std::size_t slot = static_cast<std::size_t>(h) & mask_;
    while (true) {
      const std::uint64_t entry = slots_[slot];
      if (entry == empty) break;
      const auto id = static_cast<string_id>(entry);
      if (static_cast<std::uint32_t>(entry >> 32) == tag && views_[id] == s) return id;
      slot = (slot + 1) & mask_;
    }
    const auto id = static_cast<string_id>(views_.size());
    views_.push_back(store(s));
    hashes_.push_back(h);
    slots_[slot] = std::uint64_t{tag} << 32 | id;
    if (views_.size() * 2 > slots_.size()) rehash(slots_.size() * 2);
    return id;
  }

  /// Id of `s` if already interned, else `no_string`.
  [[nodiscard]] string_id find(std::string_view s) const noexcept {
    const std::uint64_t h = hash(s);
    const auto tag = static_cast<std::uint32_t>(h >> 32);
    std::size_t slot = static_cast<std::size_t>(h) & mask_;
    while (true) {
      const std::uint64_t entry = slots_[slot];
      if (entry == empty) return no_string;
      const auto id = static_cast<string_id>(entry);
      if (static_cast<std::uint32_t>(entry >> 32) == tag && views_[id] == s) return id;
      slot = (slot + 1) & mask_;
    }
  }

  [[nodiscard]] std::string_view operator[](string_id id) const noexcept { return views_[id]; }
  [[nodiscard]] std::size_t size() const noexcept { return views_.size(); }
  /// Bytes held by the table (text, index and hash arrays).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return text_bytes_ + views_.capacity() * sizeof(std::string_view) +
           hashes_.capacity() * sizeof(std::uint64_t) + slots_.capacity() * sizeof(std::uint64_t);
  }

  /// 64-bit hash of a byte string (FNV-1a over 8-byte words, then a final mix): fast for the
  /// short names of traces; not for adversarial inputs beyond keeping probes bounded by the mix.
  [[nodiscard]] static std::uint64_t hash(std::string_view s) noexcept {
    std::uint64_t h = 0xcbf29ce484222325ULL ^ s.size();
    const char* p = s.data();
    std::size_t n = s.size();
    while (n >= 8) {
      std::uint64_t w;
      std::memcpy(&w, p, 8);
      h = (h ^ w) * 0x100000001b3ULL;
      h ^= h >> 29;
      p += 8;
      n -= 8;
    }
    // The last bytes without a variable-length copy: the final 8 bytes (overlapping the words
    // above), two overlapping 4-byte loads, or three single bytes. An empty view may have a
    // null data pointer and is not read.
    std::uint64_t tail = 0;
    const std::size_t size = s.size();
    if (size >= 8) {
      std::memcpy(&tail, s.data() + size - 8, 8);
    } else if (size >= 4) {
      std::uint32_t lo, hi;
      std::memcpy(&lo, s.data(), 4);
      std::memcpy(&hi, s.data() + size - 4, 4);
      tail = std::uint64_t{lo} | std::uint64_t{hi} << 32;
    } else if (size > 0) {
      tail = std::uint64_t{static_cast<unsigned char>(s[0])} | std::uint64_t{static_cast<unsigned char>(s[size / 2])} << 8 |
             std::uint64_t{static_cast<unsigned char>(s[size - 1])} << 16;
    }
    h = (h ^ tail) * 0x100000001b3ULL;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ULL;
    h ^= h >> 32;
    return h;
  }

 private:
  std::string_view store(std::string_view s) {
    if (s.empty()) return {};
    if (chunk_left_ < s.size()) {
      // Chunks grow from 1 KiB to 64 KiB, so small tables stay small.
      next_chunk_ = std::min(next_chunk_ * 2, chunk_size);
      const std::size_t size = s.size() > next_chunk_ / 4 ? s.size() : next_chunk_;
      chunks_.push_back(std::make_unique<char[]>(size));
      chunk_pos_ = chunks_.back().get();
      chunk_left_ = size;
      text_bytes_ += size;
    }
    std::memcpy(chunk_pos_, s.data(), s.size());
    std::string_view view(chunk_pos_, s.size());
    chunk_pos_ += s.size();
    chunk_left_ -= s.size();
    return view;
  }

  void rehash(std::size_t n) {
    slots_.assign(n, empty);
    mask_ = n - 1;
    for (string_id id = 0; id < views_.size(); ++id) {
      std::size_t slot = static_cast<std::size_t>(hashes_[id]) & mask_;
      while (slots_[slot] != empty) slot = (slot + 1) & mask_;
      slots_[slot] = (hashes_[id] >> 32) << 32 | id;
    }
  }

  // A slot holds the upper 32 bits of the hash and the id, so most probes settle without
  // touching the string; `empty` cannot be a real entry (ids are < 2^32 - 1).
  static constexpr std::uint64_t empty = ~std::uint64_t{0};

  static constexpr std::size_t chunk_size = 64 * 1024;
  std::size_t next_chunk_ = 512;
  std::vector<std::string_view> views_;
  std::vector<std::uint64_t> hashes_;
  std::vector<std::uint64_t> slots_;
  std::size_t mask_ = 0;
  std::vector<std::unique_ptr<char[]>> chunks_;
  char* chunk_pos_ = nullptr;
  std::size_t chunk_left_ = 0;
  std::size_t text_bytes_ = 0;
};

/// `s` with ASCII letters lowered (names of kernels and operators, matched case-insensitively).
[[nodiscard]] inline std::string lower_ascii(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

}  // namespace lumos
