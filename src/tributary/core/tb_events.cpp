#include "tributary/core/tb_events.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>

#include "tributary/core/error.h"

namespace tributary {
namespace {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), as TFRecord uses.
std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    table[i] = c;
  }
  return table;
}

uint32_t masked_crc(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

template <typename T>
void put_le(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian hosts (x86-64, aarch64)
  out.append(bytes, sizeof(T));
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_varint(out, (uint64_t(field) << 3) | 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

std::string event(double wall_time, int64_t step) {
  std::string e;
  put_varint(e, (1 << 3) | 1);
  put_le(e, wall_time);
  put_varint(e, (2 << 3) | 0);
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

double now_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// A protobuf reader over one message: fields in order, nested messages as sub-readers.
struct Reader {
  std::string_view data;
  const std::string& where;
  size_t pos = 0;

  bool done() const { return pos >= data.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= data.size()) fail("{}: a protobuf varint runs past the end of the record", where);
      const auto b = static_cast<uint8_t>(data[pos++]);
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("{}: a protobuf varint is longer than 10 bytes", where);
  }
  std::string_view take(size_t n) {
    if (pos + n > data.size()) fail("{}: a protobuf field runs past the end of the record", where);
    auto out = data.substr(pos, n);
    pos += n;
    return out;
  }
  template <typename T>
  T fixed() {
    T v;
    std::memcpy(&v, take(sizeof(T)).data(), sizeof(T));
    return v;
  }
  void skip(int wire) {
    if (wire == 0)
      varint();
    else if (wire == 1)
      take(8);
    else if (wire == 2)
      take(varint());
    else if (wire == 5)
      take(4);
    else
      fail("{}: protobuf wire type {} is not one an Event uses", where, wire);
  }
};

void read_summary(std::string_view bytes, const std::string& where, double wall_time, int64_t step,
                  std::vector<ScalarEvent>& out) {
  Reader summary{bytes, where};
  while (!summary.done()) {
    const uint64_t key = summary.varint();
    if (key != ((1 << 3) | 2)) {
      summary.skip(int(key & 7));
      continue;
    }
    Reader value{summary.take(summary.varint()), where};
    ScalarEvent s{.wall_time = wall_time, .step = step};
    while (!value.done()) {
      const uint64_t k = value.varint();
      if (k == ((1 << 3) | 2))
        s.tag = std::string(value.take(value.varint()));
      else if (k == ((2 << 3) | 5))
        s.value = value.fixed<float>();
      else
        value.skip(int(k & 7));
    }
    out.push_back(std::move(s));
  }
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  static const auto table = make_table();
  uint32_t c = 0xffffffffu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

EventWriter::EventWriter(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create the TensorBoard directory '{}': {}", dir.string(), ec.message());
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  path_ = dir / fmt::format("events.out.tfevents.{}.{}.{}", static_cast<int64_t>(now_s()), host, ::getpid());
  file_ = std::fopen(path_.c_str(), "ab");
  if (!file_) fail("cannot write the TensorBoard event file '{}'", path_.string());
  std::string first = event(now_s(), 0);
  put_bytes(first, 3, "brain.Event:2");
  record(first);
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

void EventWriter::record(const std::string& data) {
  std::string out;
  put_le(out, static_cast<uint64_t>(data.size()));
  const uint32_t length_crc = masked_crc(out);
  put_le(out, length_crc);
  out += data;
  put_le(out, masked_crc(data));
  if (std::fwrite(out.data(), 1, out.size(), file_) != out.size())
    fail("cannot write the TensorBoard event file '{}' (disk full?)", path_.string());
}

void EventWriter::scalar(const std::string& tag, int64_t step, double value, double wall_time) {
  std::string v;
  put_bytes(v, 1, tag);
  put_varint(v, (2 << 3) | 5);
  put_le(v, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e = event(wall_time, step);
  put_bytes(e, 5, summary);
  record(e);
}

void EventWriter::flush() { std::fflush(file_); }

std::vector<ScalarEvent> read_events(const fs::path& path) {
  const std::string data = read_file(path);
  std::vector<ScalarEvent> out;
  size_t pos = 0;
  for (int64_t index = 0; pos < data.size(); ++index) {
    const std::string where = fmt::format("TensorBoard event file '{}', record {}", path.string(), index);
    if (pos + 12 > data.size()) fail("{}: truncated header", where);
    uint64_t length;
    uint32_t length_crc, data_crc;
    std::memcpy(&length, data.data() + pos, 8);
    std::memcpy(&length_crc, data.data() + pos + 8, 4);
    if (length_crc != masked_crc(std::string_view(data).substr(pos, 8))) fail("{}: the length's CRC differs", where);
    if (pos + 12 + length + 4 > data.size()) fail("{}: truncated ({} bytes announced)", where, length);
    const std::string_view body = std::string_view(data).substr(pos + 12, length);
    std::memcpy(&data_crc, data.data() + pos + 12 + length, 4);
    if (data_crc != masked_crc(body)) fail("{}: the data's CRC differs", where);
    pos += 12 + length + 4;
    Reader e{body, where};
    double wall_time = 0;
    int64_t step = 0;
    while (!e.done()) {
      const uint64_t key = e.varint();
      if (key == ((1 << 3) | 1))
        wall_time = e.fixed<double>();
      else if (key == ((2 << 3) | 0))
        step = static_cast<int64_t>(e.varint());
      else if (key == ((5 << 3) | 2))
        read_summary(e.take(e.varint()), where, wall_time, step, out);
      else
        e.skip(int(key & 7));
    }
  }
  return out;
}

}  // namespace tributary
