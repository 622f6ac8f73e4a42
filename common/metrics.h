// The Prometheus pull endpoint every daemon exposes (prometheus-cpp + civetweb).
#ifndef WEFT_COMMON_METRICS_H_
#define WEFT_COMMON_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/exposer.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace weft {

class MetricsEndpoint {
 public:
  // Serves `registry` at http://<bind_address>/metrics. Port 0 picks a free port (see port()).
  // INVALID_ARGUMENT / UNAVAILABLE naming the address if it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& bind_address, std::shared_ptr<prometheus::Registry> registry);

  // The port actually bound.
  int port() const { return port_; }

 private:
  MetricsEndpoint(std::unique_ptr<prometheus::Exposer> exposer, int port)
      : exposer_(std::move(exposer)), port_(port) {}
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_;
};

// Exponential bucket boundaries start, start*factor, ... (count of them).
prometheus::Histogram::BucketBoundaries ExponentialBuckets(double start, double factor, int count);

}  // namespace weft

#endif  // WEFT_COMMON_METRICS_H_
