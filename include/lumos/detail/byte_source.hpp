#pragma once
// Sequential byte sources for the trace reader: a plain file, a gzip file (ISA-L igzip when
// available, zlib otherwise) or a block of memory. Internal to the reader.

#include <lumos/core/error.hpp>

#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#if defined(LUMOS_HAVE_ISAL)
#include <isa-l/igzip_lib.h>
#endif

namespace lumos::detail {

/// Reads a file in fixed-size pieces. Errors name the file.
class file_reader {
 public:
  explicit file_reader(std::string path) : path_(std::move(path)) {
    file_.reset(std::fopen(path_.c_str(), "rb"));
    if (!file_) fail({path_}, std::string("cannot open file: ") + std::strerror(errno));
  }
  /// Fills up to `n` bytes; returns 0 only at end of file.
  std::size_t read(char* dst, std::size_t n) {
    const std::size_t got = std::fread(dst, 1, n, file_.get());
    if (got < n && std::ferror(file_.get())) fail({path_}, "read error");
    return got;
  }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  struct closer {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
  };
  std::string path_;
  std::unique_ptr<std::FILE, closer> file_;
};

/// One decompressed-or-not stream of bytes, pulled in pieces by the reader.
/// gzip is recognised by its magic bytes, not by the file name. Concatenated gzip members are
/// read as one stream, as `gzip -d` does.
class byte_source {
 public:
  /// Source over a file on disk.
  explicit byte_source(std::string path) : file_(std::make_unique<file_reader>(std::move(path))) {
    name_ = file_->path();
    in_.resize(in_chunk);
    fill_input();
    detect_gzip();
  }
  /// Source over caller-owned memory (must outlive the source).
  byte_source(std::string_view bytes, std::string name) : name_(std::move(name)) {
    mem_ = bytes;
    in_begin_ = 0;
    in_end_ = bytes.size();
    detect_gzip();
  }
  byte_source(const byte_source&) = delete;
  byte_source& operator=(const byte_source&) = delete;
  ~byte_source() { release_inflater(); }

  [[nodiscard]] bool gzip() const noexcept { return gzip_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  /// Writes up to `n` bytes of (decompressed) text into `dst`; returns 0 only at the end.
  std::size_t read(char* dst, std::size_t n) {
    if (!gzip_) return read_raw(dst, n);
    std::size_t total = 0;
    while (total < n && !finished_) {
      if (available() == 0 && !input_done_) fill_input();
      const std::uint64_t consumed_before = consumed_;
      const std::size_t produced = inflate_some(dst + total, n - total);
      total += produced;
      if (produced == 0 && consumed_ == consumed_before && !finished_) {
        // No progress: the inflater needs input we do not have.
        if (input_done_) corrupt("truncated gzip stream");
        const std::size_t before = available();
        fill_input();
        if (available() == before) corrupt("truncated gzip stream");
      }
    }
    return total;
  }

 private:
  static constexpr std::size_t in_chunk = 256 * 1024;

  [[nodiscard]] const unsigned char* input() const noexcept {
    return reinterpret_cast<const unsigned char*>(file_ ? in_.data() : mem_.data()) + in_begin_;
  }
  [[nodiscard]] std::size_t available() const noexcept { return in_end_ - in_begin_; }

  void fill_input() {
    if (!file_) {
      input_done_ = true;
      return;
    }
    if (in_begin_ > 0) {  // keep unconsumed bytes (a gzip trailer split across pieces)
      std::memmove(in_.data(), in_.data() + in_begin_, available());
      in_end_ -= in_begin_;
      in_begin_ = 0;
    }
    const std::size_t room = in_.size() - in_end_;
    if (room == 0) return;
    const std::size_t got = file_->read(in_.data() + in_end_, room);
    if (got == 0) input_done_ = true;
    in_end_ += got;
  }

  std::size_t read_raw(char* dst, std::size_t n) {
    std::size_t total = 0;
    while (total < n) {
      if (available() == 0) {
        if (input_done_) break;
        fill_input();
        if (available() == 0) break;
      }
      const std::size_t take = std::min(n - total, available());
      std::memcpy(dst + total, input(), take);
      in_begin_ += take;
      consumed_ += take;
      total += take;
    }
    return total;
  }

  void detect_gzip() {
    gzip_ = available() >= 2 && input()[0] == 0x1f && input()[1] == 0x8b;
    if (gzip_) start_member();
  }

  [[noreturn]] void corrupt(std::string_view what) const {
    fail({name_}, "compressed byte " + std::to_string(consumed_) + ": " + std::string(what));
  }

  // After a member ends: another member, zero padding (tolerated, like gzip), or garbage.
  void next_member_or_finish() {
    while (true) {
      if (available() == 0 && !input_done_) fill_input();
      if (available() == 0) {
        finished_ = true;
        return;
      }
      if (input()[0] == 0) {  // trailing zero padding
        ++in_begin_;
        ++consumed_;
        continue;
      }
      if (available() < 2 && !input_done_) fill_input();
      if (available() >= 2 && input()[0] == 0x1f && input()[1] == 0x8b) {
        start_member();
        return;
      }
      corrupt("unexpected data after the end of the gzip stream");
    }
  }

#if defined(LUMOS_HAVE_ISAL)
  void start_member() {
    isal_ = std::make_unique<inflate_state>();
    isal_inflate_init(isal_.get());
    isal_->crc_flag = ISAL_GZIP;
  }
  void release_inflater() noexcept {}
  std::size_t inflate_some(char* dst, std::size_t n) {
    inflate_state& s = *isal_;
    s.next_in = const_cast<unsigned char*>(input());
    s.avail_in = static_cast<std::uint32_t>(std::min<std::size_t>(available(), UINT32_MAX));
    s.next_out = reinterpret_cast<unsigned char*>(dst);
    s.avail_out = static_cast<std::uint32_t>(std::min<std::size_t>(n, UINT32_MAX));
    const std::uint32_t before_in = s.avail_in;
    const int ret = isal_inflate(&s);
    const std::size_t used = before_in - s.avail_in;
    in_begin_ += used;
    consumed_ += used;
    const std::size_t produced = static_cast<std::size_t>(reinterpret_cast<char*>(s.next_out) - dst);
    if (ret != ISAL_DECOMP_OK && ret != ISAL_END_INPUT && ret != ISAL_OUT_OVERFLOW) {
      corrupt(ret == ISAL_INCORRECT_CHECKSUM ? "gzip checksum mismatch" : "corrupt gzip data");
    }
    if (s.block_state == ISAL_BLOCK_FINISH) next_member_or_finish();
    return produced;
  }
  std::unique_ptr<inflate_state> isal_;
#else
  void start_member() {
    release_inflater();
    zs_ = std::make_unique<z_stream>();
    std::memset(zs_.get(), 0, sizeof(z_stream));
    if (inflateInit2(zs_.get(), 16 + MAX_WBITS) != Z_OK) corrupt("cannot initialise zlib");
    z_live_ = true;
  }
  void release_inflater() noexcept {
    if (z_live_) inflateEnd(zs_.get());
    z_live_ = false;
  }
  std::size_t inflate_some(char* dst, std::size_t n) {
    z_stream& z = *zs_;
    z.next_in = const_cast<Bytef*>(input());
    z.avail_in = static_cast<uInt>(std::min<std::size_t>(available(), UINT32_MAX));
    z.next_out = reinterpret_cast<Bytef*>(dst);
    z.avail_out = static_cast<uInt>(std::min<std::size_t>(n, UINT32_MAX));
    const uInt before_in = z.avail_in;
    const int ret = ::inflate(&z, Z_NO_FLUSH);
    const std::size_t used = before_in - z.avail_in;
    in_begin_ += used;
    consumed_ += used;
    const std::size_t produced = static_cast<std::size_t>(reinterpret_cast<char*>(z.next_out) - dst);
    if (ret == Z_STREAM_END) {
      release_inflater();
      next_member_or_finish();
    } else if (ret == Z_DATA_ERROR || ret == Z_NEED_DICT || ret == Z_MEM_ERROR || ret == Z_STREAM_ERROR) {
      corrupt(z.msg != nullptr ? z.msg : "corrupt gzip data");
    }
    return produced;
  }
  std::unique_ptr<z_stream> zs_;
  bool z_live_ = false;
#endif

  std::string name_;
  std::unique_ptr<file_reader> file_;
  std::string_view mem_;
  std::vector<char> in_;
  std::size_t in_begin_ = 0;
  std::size_t in_end_ = 0;
  std::uint64_t consumed_ = 0;  // compressed (or raw) bytes consumed, for error positions
  bool input_done_ = false;
  bool gzip_ = false;
  bool finished_ = false;
};

}  // namespace lumos::detail
