// One rank's averaging stack as the replicas build it (runtime/replicas.cpp), for tests whose ranks are threads: a
// Gloo group over a shared store, its exchange (fp32), a communication thread and the ResilientAverage over them.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <optional>

#include "tributary/comm/comm_thread.h"
#include "tributary/comm/exchange.h"
#include "tributary/comm/group.h"
#include "tributary/optim/resilient_average.h"

namespace test_support {

struct AveragingRank {
  tributary::comm::Group group;
  tributary::comm::Exchange exchange;
  tributary::comm::CommThread thread;
  tributary::ResilientAverage average;

  AveragingRank(c10::intrusive_ptr<c10d::Store> store, int rank, int size)
      : group(std::move(store), rank, size),
        exchange(group, tributary::comm::ExchangeOptions{}),
        average(thread, exchange, group, nullptr, 0, std::nullopt, {}) {}
};

}  // namespace test_support
