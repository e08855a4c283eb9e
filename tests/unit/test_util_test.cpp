// The shared test helpers themselves: a comparison over nothing fails instead of passing vacuously.
#include "test_util.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace tessera {
namespace {

TEST(TestUtil, RelErrorIsTheNormwiseRelativeError) {
  const std::vector<float> a = {1.0f, 2.5f, -4.0f}, b = {1.0f, 2.0f, -4.0f};
  EXPECT_DOUBLE_EQ(test::rel_error(a.data(), b.data(), a.size()), 0.5 / 4.0);
  EXPECT_EQ(test::rel_error(b.data(), b.data(), b.size()), 0.0);
}

TEST(TestUtil, RelErrorOverAnEmptySetFails) {
  const std::vector<float> none;
  double err = 0.0;
  EXPECT_NONFATAL_FAILURE(err = test::rel_error(none.data(), none.data(), 0), "rel_error over an empty set");
  EXPECT_TRUE(std::isinf(err));  // and no bound passes
}

}  // namespace
}  // namespace tessera
