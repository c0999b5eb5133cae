// Strict base64 decoding (RFC 4648, standard alphabet, '=' padding, no whitespace).
#pragma once

#include <string>
#include <string_view>

namespace jaxtile {

// Decodes `text` into `out`. Returns false, leaving `out` unspecified, if `text` is not
// canonical padded base64 (as Python's base64.b64encode writes it).
bool base64_decode(std::string_view text, std::string* out);

}  // namespace jaxtile
