// The Prometheus pull endpoint every daemon exposes (prometheus-cpp + civetweb).
#ifndef WEFT_COMMON_METRICS_H_
#define WEFT_COMMON_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
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

// Registers a metric family `name` in `registry` and returns its one series with `labels`.
// For metrics with a fixed label set; families with labels chosen at run time (by state,
// phase, ...) use prometheus::Build* directly and keep the Family.
prometheus::Counter& AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help, const prometheus::Labels& labels = {});
prometheus::Gauge& AddGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help, const prometheus::Labels& labels = {});
prometheus::Histogram& AddHistogram(prometheus::Registry& registry, const std::string& name,
                                    const std::string& help,
                                    const prometheus::Histogram::BucketBoundaries& buckets);

// Exponential bucket boundaries start, start*factor, ... (count of them).
prometheus::Histogram::BucketBoundaries ExponentialBuckets(double start, double factor, int count);

}  // namespace weft

#endif  // WEFT_COMMON_METRICS_H_
