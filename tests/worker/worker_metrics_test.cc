// WorkerMetrics' per-step counters as Prometheus serves them: skipped steps counted from a
// gradient norm that is not finite, and the FP8 casts' tallies by format and outcome.
#include "worker/worker_metrics.h"

#include <cmath>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace weft::worker {
namespace {

using ::testing::HasSubstr;

std::string Scrape(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

TEST(WorkerMetricsTest, CountsSkippedStepsAndFp8Casts) {
  prometheus::Registry registry;
  WorkerMetrics metrics(registry, "w0");
  zero::StepResult finite;
  finite.grad_norm = 1.5f;
  finite.fp8_e4m3 = {1000, 3, 0};
  finite.fp8_e5m2 = {400, 25, 2};
  zero::StepResult skipped = finite;
  skipped.grad_norm = std::numeric_limits<float>::quiet_NaN();
  metrics.RecordStep(1, finite, 1.0, 0.5, 0);
  metrics.RecordStep(2, skipped, 1.0, 0.5, 0);
  metrics.RecordStep(3, finite, 1.0, 0.5, 0);
  const std::string body = Scrape(registry);
  EXPECT_THAT(body, HasSubstr("weft_worker_steps_total{worker_id=\"w0\"} 3"));
  EXPECT_THAT(body, HasSubstr("weft_worker_steps_skipped_total{worker_id=\"w0\"} 1"));
  EXPECT_THAT(body, HasSubstr("weft_worker_fp8_values_total{format=\"e4m3\",outcome=\"cast\","
                              "worker_id=\"w0\"} 3000"));
  EXPECT_THAT(body, HasSubstr("weft_worker_fp8_values_total{format=\"e4m3\",outcome=\"underflow\","
                              "worker_id=\"w0\"} 9"));
  EXPECT_THAT(body, HasSubstr("weft_worker_fp8_values_total{format=\"e5m2\",outcome=\"underflow\","
                              "worker_id=\"w0\"} 75"));
  EXPECT_THAT(body, HasSubstr("weft_worker_fp8_values_total{format=\"e5m2\",outcome=\"saturated\","
                              "worker_id=\"w0\"} 6"));
}

}  // namespace
}  // namespace weft::worker
