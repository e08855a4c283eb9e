// UTF-8 structure checks shared by the readers that quote or validate text.
#pragma once
#include <cstddef>
#include <string_view>

namespace tessera {

// Bytes of the UTF-8 character starting at s[i] (1 to 4), or 0 when the bytes there are not one (a
// stray continuation byte, an invalid lead byte, a truncated sequence). Leads follow RFC 3629's
// ranges (C2-DF, E0-EF, F0-F4); overlong three- and four-byte forms are not rejected.
inline size_t utf8_char_length(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80                   ? 0
                   : (c >= 0xC2 && c <= 0xDF) ? 1
                   : (c & 0xF0) == 0xE0       ? 2
                   : (c >= 0xF0 && c <= 0xF4) ? 3
                                              : 9;
  if (n == 9 || i + n >= s.size()) return 0;
  for (size_t k = 1; k <= n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  }
  return n + 1;
}

}  // namespace tessera
