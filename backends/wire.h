#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradfuzz::backends::wire {

// Framed messages over pipes (docs/BACKENDS.md "Frame format"): an 8-byte little-endian
// header length, a JSON header, then the raw bytes of every tensor the header's "tensors"
// list describes.

using Clock = std::chrono::steady_clock;

/// The peer closed its end (it exited or died) before a whole frame arrived or was written.
class PeerClosed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
/// The deadline passed before a whole frame arrived.
class Timeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
/// A malformed frame (bad length, bad JSON, a tensor descriptor that does not fit).
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Headers and tensor payloads above these are refused (a runaway peer, not a case).
inline constexpr uint64_t kMaxHeaderBytes = 64ull << 20;
inline constexpr uint64_t kMaxPayloadBytes = 16ull << 30;

struct Frame {
  nlohmann::json header;
  std::vector<at::Tensor> tensors;
};

/// Writes one frame; `header` gets a "tensors" list describing `tensors` (CPU, any dtype
/// among float64/float32/bfloat16/float16/int64/bool; they are made contiguous). Throws
/// PeerClosed on EPIPE and std::system_error on other write errors. SIGPIPE must be
/// ignored by the process (tools/main.cc does).
void write_frame(int fd, nlohmann::json header, const std::vector<at::Tensor>& tensors);

/// Reads one frame, waiting at most until `deadline` (none: forever). Tensors come back as
/// CPU tensors owning their memory. Throws PeerClosed, Timeout or ProtocolError.
Frame read_frame(int fd, std::optional<Clock::time_point> deadline);

/// Index of `t` in `tensors` after appending it, or null for an undefined tensor.
nlohmann::json add_tensor(std::vector<at::Tensor>& tensors, const at::Tensor& t);
/// The tensor a header field refers to: null -> undefined; an index -> that tensor. Throws
/// ProtocolError for an index out of range or a field of another type.
at::Tensor tensor_at(const Frame& frame, const nlohmann::json& ref);

}  // namespace gradfuzz::backends::wire
