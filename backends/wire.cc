#include "backends/wire.h"

#include <ATen/ATen.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

namespace gradfuzz::backends::wire {

namespace {

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {{at::kDouble, "float64"}, {at::kFloat, "float32"}, {at::kBFloat16, "bfloat16"},
                                 {at::kHalf, "float16"},   {at::kLong, "int64"},    {at::kBool, "bool"}};

const char* dtype_name(at::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  throw ProtocolError(std::string("cannot send a tensor of dtype ") + c10::toString(type));
}

at::ScalarType dtype_from(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  throw ProtocolError("unknown tensor dtype '" + name + "'");
}

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE) throw PeerClosed("the peer closed its input");
      throw std::system_error(errno, std::generic_category(), "write to peer");
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

/// Reads exactly `size` bytes, polling so that the deadline holds even when the peer hangs.
void read_all(int fd, char* data, size_t size, const std::optional<Clock::time_point>& deadline) {
  while (size > 0) {
    int timeout_ms = -1;
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) throw Timeout("no answer before the deadline");
      timeout_ms = static_cast<int>(std::min<int64_t>(left, 1 << 30));
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, timeout_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "poll on peer");
    }
    if (ready == 0) continue;  // the loop's deadline check throws
    const ssize_t n = ::read(fd, data, size);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw std::system_error(errno, std::generic_category(), "read from peer");
    }
    if (n == 0) throw PeerClosed("the peer closed its output");
    data += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

void write_frame(int fd, nlohmann::json header, const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> contiguous;
  contiguous.reserve(tensors.size());
  nlohmann::json descriptors = nlohmann::json::array();
  for (const auto& t : tensors) {
    if (!t.defined()) throw ProtocolError("cannot send an undefined tensor (refer to it as null)");
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    descriptors.push_back({{"dtype", dtype_name(c.scalar_type())}, {"shape", c.sizes().vec()}});
    contiguous.push_back(std::move(c));
  }
  if (!contiguous.empty()) header["tensors"] = std::move(descriptors);
  const std::string text = header.dump();
  uint64_t length = text.size();
  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>((length >> (8 * i)) & 0xff);
  // One write for the prefix and header keeps small frames in one pipe write.
  std::string first(reinterpret_cast<const char*>(prefix), 8);
  first += text;
  write_all(fd, first.data(), first.size());
  for (const auto& c : contiguous) {
    write_all(fd, static_cast<const char*>(c.const_data_ptr()), c.nbytes());
  }
}

Frame read_frame(int fd, std::optional<Clock::time_point> deadline) {
  unsigned char prefix[8];
  read_all(fd, reinterpret_cast<char*>(prefix), 8, deadline);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | prefix[i];
  if (length == 0 || length > kMaxHeaderBytes) {
    throw ProtocolError("bad frame header length " + std::to_string(length));
  }
  std::string text(length, '\0');
  read_all(fd, text.data(), length, deadline);
  Frame frame;
  try {
    frame.header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ProtocolError(std::string("frame header is not JSON: ") + e.what());
  }
  if (!frame.header.is_object()) throw ProtocolError("frame header is not a JSON object");
  auto it = frame.header.find("tensors");
  if (it == frame.header.end()) return frame;
  if (!it->is_array()) throw ProtocolError("frame header 'tensors' is not a list");
  uint64_t total = 0;
  for (const auto& d : *it) {
    if (!d.is_object() || !d.contains("dtype") || !d.contains("shape") || !d["dtype"].is_string() ||
        !d["shape"].is_array()) {
      throw ProtocolError("bad tensor descriptor " + d.dump());
    }
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    for (const auto& s : d["shape"]) {
      if (!s.is_number_integer() || s.get<int64_t>() < 0) throw ProtocolError("bad tensor shape " + d.dump());
      shape.push_back(s.get<int64_t>());
      numel *= static_cast<uint64_t>(shape.back());
      if (numel > kMaxPayloadBytes) throw ProtocolError("tensor too large " + d.dump());
    }
    const at::ScalarType type = dtype_from(d["dtype"].get<std::string>());
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
    total += t.nbytes();
    if (total > kMaxPayloadBytes) throw ProtocolError("frame payload too large");
    read_all(fd, static_cast<char*>(t.data_ptr()), t.nbytes(), deadline);
    frame.tensors.push_back(std::move(t));
  }
  return frame;
}

nlohmann::json add_tensor(std::vector<at::Tensor>& tensors, const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  tensors.push_back(t);
  return tensors.size() - 1;
}

at::Tensor tensor_at(const Frame& frame, const nlohmann::json& ref) {
  if (ref.is_null()) return at::Tensor();
  if (!ref.is_number_integer()) throw ProtocolError("expected a tensor index or null, got " + ref.dump());
  const int64_t i = ref.get<int64_t>();
  if (i < 0 || i >= static_cast<int64_t>(frame.tensors.size())) {
    throw ProtocolError("tensor index " + std::to_string(i) + " out of range (" + std::to_string(frame.tensors.size()) +
                        " tensors)");
  }
  return frame.tensors[static_cast<size_t>(i)];
}

}  // namespace gradfuzz::backends::wire
