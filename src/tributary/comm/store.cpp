#include "tributary/comm/store.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fmt/format.h>

#include "tributary/comm/group.h"
#include "tributary/core/error.h"

namespace tributary::comm {

Store::Store(c10::intrusive_ptr<c10d::Store> impl, int rank) : impl_(std::move(impl)), rank_(rank) {}
Store::Store(const Store&) = default;
Store& Store::operator=(const Store&) = default;
Store::~Store() = default;

Store Store::in_memory() { return Store(c10::make_intrusive<c10d::HashStore>()); }

Store Store::connect(const std::string& master_addr, int master_port, int rank, int world_size, bool server_exists,
                     const std::string& prefix, std::chrono::milliseconds timeout) {
  return Store(connect_store(master_addr, master_port, rank, world_size, server_exists, prefix, timeout), rank);
}

Store Store::host(int port, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = true;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  try {
    return Store(c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts), -1);
  } catch (const std::exception& e) {
    throw NetworkError(fmt::format("cannot host the run's store on port {}: {}", port, e.what()));
  }
}

void Store::set(const std::string& key, const std::string& value) {
  impl_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string Store::get(const std::string& key) {
  auto bytes = impl_->get(key);
  return {bytes.begin(), bytes.end()};
}

std::string Store::set_once(const std::string& key, const std::string& desired) {
  auto held = impl_->compareSet(key, {}, std::vector<uint8_t>(desired.begin(), desired.end()));
  return {held.begin(), held.end()};
}

int64_t Store::add(const std::string& key, int64_t delta) { return impl_->add(key, delta); }

bool Store::check(const std::vector<std::string>& keys) { return impl_->check(keys); }

void Store::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout, const std::string& what) {
  try {
    impl_->wait(keys, timeout);
  } catch (const std::exception& e) {
    throw NetworkError(fmt::format("rank {}: {} within {} s: {}", rank_, what, timeout.count() / 1000.0, e.what()));
  }
}

}  // namespace tributary::comm
