#pragma once

#include <string>

namespace gradfuzz::reports::detail {

/// `text` as XML/HTML character data or attribute value: & < > " ' escaped; bytes that are
/// not valid UTF-8 and characters XML 1.0 does not allow (controls other than tab, newline
/// and carriage return; U+FFFE, U+FFFF) replaced with U+FFFD, so any string (an adapter's
/// error message) gives a well-formed document.
std::string escape_markup(const std::string& text);

/// A number for people: up to `digits` significant digits ("0.25", "1e-07"), "n/a" for
/// NaN and "inf"/"-inf" for infinities.
std::string format_number(double value, int digits = 4);

}  // namespace gradfuzz::reports::detail
