// One rank's averaging stack as the replicas build it (runtime/sync/replica_sync.cpp), for tests whose ranks are
// threads: a Gloo group over a shared store, its exchange (fp32), a communication thread and the ResilientAverage over
// them.
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

  AveragingRank(c10::intrusive_ptr<c10d::Store> store, int rank, int size, tributary::AggregateOptions aggregate = {},
                tributary::comm::ExchangeOptions exchange_options = {})
      : group(std::move(store), rank, size),
        exchange(group, std::move(exchange_options)),
        average(thread, exchange, group, nullptr, std::move(aggregate), std::nullopt, {}) {}
};

}  // namespace test_support
