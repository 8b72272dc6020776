#include "reports/markup.h"

#include <cmath>
#include <cstdint>
#include <cstdio>

namespace gradfuzz::reports::detail {

namespace {

/// Length of the valid UTF-8 sequence starting at text[i] and its code point; 0 when the
/// bytes there are not one (stray continuation byte, overlong form, surrogate, cut short).
size_t utf8_sequence(const std::string& text, size_t i, uint32_t& code_point) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) {
    code_point = lead;
    return 1;
  }
  // Sequence length, payload bits of the lead byte and the smallest code point of that
  // length (a smaller one is an overlong form).
  struct Form {
    unsigned char mask, value, payload;
    size_t length;
    uint32_t min;
  };
  static constexpr Form kForms[] = {
      {0xE0, 0xC0, 0x1F, 2, 0x80}, {0xF0, 0xE0, 0x0F, 3, 0x800}, {0xF8, 0xF0, 0x07, 4, 0x10000}};
  const Form* form = nullptr;
  for (const Form& f : kForms) {
    if ((lead & f.mask) == f.value) form = &f;
  }
  if (!form) return 0;
  const size_t length = form->length;
  const uint32_t min = form->min;
  code_point = lead & form->payload;
  if (i + length > text.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code_point = (code_point << 6) | (byte(i + k) & 0x3F);
  }
  if (code_point < min || code_point > 0x10FFFF || (code_point >= 0xD800 && code_point <= 0xDFFF)) return 0;
  return length;
}

}  // namespace

std::string escape_markup(const std::string& text) {
  static const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    const size_t length = utf8_sequence(text, i, cp);
    if (length == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    switch (cp) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        if ((cp < 0x20 && cp != '\t' && cp != '\n' && cp != '\r') || cp == 0xFFFE || cp == 0xFFFF) {
          out += kReplacement;
        } else {
          out.append(text, i, length);
        }
    }
    i += length;
  }
  return out;
}

std::string format_number(double value, int digits) {
  if (std::isnan(value)) return "n/a";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*g", digits, value);
  return buffer;
}

}  // namespace gradfuzz::reports::detail
