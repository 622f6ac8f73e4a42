#include "common/metrics.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "common/rpc.h"

namespace weft {

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& bind_address, std::shared_ptr<prometheus::Registry> registry) {
  if (absl::Status s = CheckHostPort(bind_address, "--metrics-address"); !s.ok()) return s;
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // One civetweb thread is plenty for a scrape every few seconds.
    exposer = std::make_unique<prometheus::Exposer>(bind_address, 1);
  } catch (const std::exception& e) {
    // civetweb's message ("null context ... binding to port") does not say why.
    const std::string why = WhyCannotBind(bind_address);
    return absl::UnavailableError(absl::StrCat("--metrics-address ", bind_address,
                                               ": cannot listen on port ",
                                               bind_address.substr(bind_address.rfind(':') + 1),
                                               ": ", why.empty() ? e.what() : why));
  }
  exposer->RegisterCollectable(registry);
  const auto ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("--metrics-address ", bind_address,
                                               ": no listening port after bind"));
  }
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(exposer), ports[0]));
}

prometheus::Counter& AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help, const prometheus::Labels& labels) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add(labels);
}

prometheus::Gauge& AddGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help, const prometheus::Labels& labels) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add(labels);
}

prometheus::Histogram& AddHistogram(prometheus::Registry& registry, const std::string& name,
                                    const std::string& help,
                                    const prometheus::Histogram::BucketBoundaries& buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add({}, buckets);
}

prometheus::Histogram::BucketBoundaries ExponentialBuckets(double start, double factor,
                                                           int count) {
  prometheus::Histogram::BucketBoundaries b;
  double x = start;
  for (int i = 0; i < count; ++i, x *= factor) b.push_back(x);
  return b;
}

}  // namespace weft
