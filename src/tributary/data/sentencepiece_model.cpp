#include "tributary/data/sentencepiece_model.h"

#include <cstring>

#include "tributary/core/error.h"

namespace tributary {

namespace {

// Protocol buffers' wire format, as much as a ModelProto uses: varints, 32-bit floats, length-delimited messages.
class Wire {
 public:
  Wire(std::string_view bytes, const std::string& what) : bytes_(bytes), what_(what) {}
  bool done() const { return pos_ >= bytes_.size(); }

  // The next field's number and wire type.
  std::pair<uint32_t, uint32_t> tag() {
    const uint64_t t = varint();
    return {static_cast<uint32_t>(t >> 3), static_cast<uint32_t>(t & 7)};
  }
  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1);
      const auto byte = static_cast<uint8_t>(bytes_[pos_++]);
      value |= uint64_t(byte & 0x7F) << shift;
      if (!(byte & 0x80)) return value;
    }
    fail("'{}' is not a SentencePiece model: a varint runs past 10 bytes at byte {}", what_, pos_);
  }
  float fixed32() {
    need(4);
    float f;
    std::memcpy(&f, bytes_.data() + pos_, 4);
    pos_ += 4;
    return f;
  }
  std::string_view delimited() {
    const uint64_t n = varint();
    need(n);
    const std::string_view out = bytes_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  void skip(uint32_t wire_type) {
    switch (wire_type) {
      case 0:
        varint();
        break;
      case 1:
        need(8), pos_ += 8;
        break;
      case 2:
        delimited();
        break;
      case 5:
        need(4), pos_ += 4;
        break;
      default:
        fail("'{}' is not a SentencePiece model: wire type {} at byte {}", what_, wire_type, pos_);
    }
  }

 private:
  void need(uint64_t n) const {
    if (n > bytes_.size() - pos_)
      fail("'{}' is not a SentencePiece model (or is truncated): a field runs past its end at byte {}", what_, pos_);
  }
  std::string_view bytes_;
  const std::string& what_;
  size_t pos_ = 0;
};

SentencePieceModel::Piece parse_piece(std::string_view bytes, const std::string& what) {
  SentencePieceModel::Piece piece;
  for (Wire w(bytes, what); !w.done();) {
    const auto [field, type] = w.tag();
    if (field == 1 && type == 2)
      piece.text = std::string(w.delimited());
    else if (field == 2 && type == 5)
      piece.score = w.fixed32();
    else if (field == 3 && type == 0)
      piece.type = static_cast<SentencePieceModel::PieceType>(w.varint());
    else
      w.skip(type);
  }
  return piece;
}

}  // namespace

SentencePieceModel SentencePieceModel::parse(std::string_view bytes, const std::string& what) {
  SentencePieceModel model;
  for (Wire w(bytes, what); !w.done();) {
    const auto [field, type] = w.tag();
    if (field == 1 && type == 2) {
      model.pieces.push_back(parse_piece(w.delimited(), what));
    } else if (field == 2 && type == 2) {  // TrainerSpec
      for (Wire t(w.delimited(), what); !t.done();) {
        const auto [f, ty] = t.tag();
        if (f == 3 && ty == 0)
          model.kind = static_cast<Kind>(t.varint());
        else if (f == 35 && ty == 0)
          model.byte_fallback = t.varint() != 0;
        else
          t.skip(ty);
      }
    } else if (field == 3 && type == 2) {  // NormalizerSpec
      for (Wire n(w.delimited(), what); !n.done();) {
        const auto [f, ty] = n.tag();
        if (f == 1 && ty == 2)
          model.normalizer = std::string(n.delimited());
        else if (f == 3 && ty == 0)
          model.add_dummy_prefix = n.varint() != 0;
        else if (f == 4 && ty == 0)
          model.remove_extra_whitespaces = n.varint() != 0;
        else if (f == 5 && ty == 0)
          model.escape_whitespaces = n.varint() != 0;
        else
          n.skip(ty);
      }
    } else {
      w.skip(type);
    }
  }
  if (model.pieces.empty()) fail("'{}' is not a SentencePiece model: it holds no pieces", what);
  return model;
}

int32_t SentencePieceModel::id_of(PieceType type) const {
  for (size_t i = 0; i < pieces.size(); ++i)
    if (pieces[i].type == type) return static_cast<int32_t>(i);
  return -1;
}

}  // namespace tributary
