// What every training engine must do with a step whose gradient is not finite, checked the
// same way for each (zero_cpu_test, zero_cuda_test).
#ifndef WEFT_TESTS_WORKER_SKIPPED_STEP_EXPECT_H_
#define WEFT_TESTS_WORKER_SKIPPED_STEP_EXPECT_H_

#include <cmath>

#include "gtest/gtest.h"
#include "worker/model_io/checkpoint_schema.h"
#include "worker/zero/training_engine.h"

namespace weft::testing {

// `engine` was made with a learning rate so large (1e38) that its first step (step 0) moves
// the weights near the float range's end and every later forward overflows: step 0 must come
// out finite, steps 1 and 2 not finite, and after them every unit's parameters, m and v must
// be bit for bit what step 0 left, and the engine must count one AdamW update, not three.
inline void ExpectOverflowingStepsAreSkipped(zero::TrainingEngine& engine,
                                             const zero::BatchFn& batch) {
  auto first = engine.TrainStep(0, batch);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(std::isfinite(first->grad_norm));
  EXPECT_EQ(engine.optimizer_steps(), 1);
  auto before = engine.Snapshot();
  ASSERT_TRUE(before.ok()) << before.status();
  for (int step = 1; step <= 2; ++step) {
    auto r = engine.TrainStep(step, batch);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(std::isfinite(r->grad_norm)) << "step " << step << ": " << r->grad_norm;
  }
  EXPECT_EQ(engine.optimizer_steps(), 1) << "a skipped step counted as an AdamW update";
  auto after = engine.Snapshot();
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(after->size(), before->size());
  for (size_t u = 0; u < before->size(); ++u) {
    for (model_io::UnitState what : model_io::kUnitStates) {
      EXPECT_TRUE((*after)[u].data(what) == (*before)[u].data(what))
          << "unit " << u << " " << model_io::UnitStateName(what) << " changed in a skipped step";
    }
  }
}

}  // namespace weft::testing

#endif  // WEFT_TESTS_WORKER_SKIPPED_STEP_EXPECT_H_
