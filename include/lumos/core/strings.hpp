#pragma once
// string_table — interns strings to dense 32-bit ids.

#include <cstdint>
#include <cstring>
#include <memory>
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
  string_table() { rehash(64); }

  /// Id of `s`, adding it if new. Amortised O(|s|).
  string_id intern(std::string_view s) {
    const std::uint64_t h = hash(s);
    std::size_t slot = static_cast<std::size_t>(h) & mask_;
    while (true) {
      const string_id id = slots_[slot];
      if (id == no_string) break;
      if (hashes_[id] == h && views_[id] == s) return id;
      slot = (slot + 1) & mask_;
    }
    const auto id = static_cast<string_id>(views_.size());
    views_.push_back(store(s));
    hashes_.push_back(h);
    slots_[slot] = id;
    if (views_.size() * 2 > slots_.size()) rehash(slots_.size() * 2);
    return id;
  }

  /// Id of `s` if already interned, else `no_string`.
  [[nodiscard]] string_id find(std::string_view s) const noexcept {
    const std::uint64_t h = hash(s);
    std::size_t slot = static_cast<std::size_t>(h) & mask_;
    while (true) {
      const string_id id = slots_[slot];
      if (id == no_string) return no_string;
      if (hashes_[id] == h && views_[id] == s) return id;
      slot = (slot + 1) & mask_;
    }
  }

  [[nodiscard]] std::string_view operator[](string_id id) const noexcept { return views_[id]; }
  [[nodiscard]] std::size_t size() const noexcept { return views_.size(); }
  /// Bytes held by the table (text, index and hash arrays).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return text_bytes_ + views_.capacity() * sizeof(std::string_view) +
           hashes_.capacity() * sizeof(std::uint64_t) + slots_.capacity() * sizeof(string_id);
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
    std::uint64_t tail = 0;
    std::memcpy(&tail, p, n);
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
      const std::size_t size = s.size() > chunk_size / 4 ? s.size() : chunk_size;
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
    slots_.assign(n, no_string);
    mask_ = n - 1;
    for (string_id id = 0; id < views_.size(); ++id) {
      std::size_t slot = static_cast<std::size_t>(hashes_[id]) & mask_;
      while (slots_[slot] != no_string) slot = (slot + 1) & mask_;
      slots_[slot] = id;
    }
  }

  static constexpr std::size_t chunk_size = 64 * 1024;
  std::vector<std::string_view> views_;
  std::vector<std::uint64_t> hashes_;
  std::vector<string_id> slots_;
  std::size_t mask_ = 0;
  std::vector<std::unique_ptr<char[]>> chunks_;
  char* chunk_pos_ = nullptr;
  std::size_t chunk_left_ = 0;
  std::size_t text_bytes_ = 0;
};

}  // namespace lumos
